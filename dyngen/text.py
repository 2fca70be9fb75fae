"""Short one-line renderings of user data, shared by the CLI's tables and the report, and
the task text of a prompt."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def clip(text: str, n: int) -> str:
    """`text` on one line, cut to `n` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def prompt_text(prompt: Any, n: int = 70) -> str:
    """The last user message of a chat prompt, on one line and truncated."""
    if isinstance(prompt, list):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        last = users[-1] if users else (prompt[-1] if prompt else {})
        prompt = last.get("content", "") if isinstance(last, dict) else last
    return clip("" if prompt is None else str(prompt), n)


def parse_json(text: Any) -> Any:
    """`text` parsed as JSON if it is a JSON string, else as it is."""
    try:
        return json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return text



def closest(word: str, choices: Any) -> str | None:
    """The choice most like `word`, when it is close enough to be what `word` meant."""
    import difflib  # only on an error's path

    found = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, choices: Any, quote: bool = True) -> str:
    """" Did you mean X?" when one of `choices` is close enough to be what `word` meant."""
    found = closest(word, choices)
    if found is None:
        return ""
    return f" Did you mean {found!r}?" if quote else f" Did you mean {found}?"


def completion_text(completion: Any) -> str:
    """A TRL completion's text: a string, or a conversation's last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content") or "")
    return ""


def question_of(prompt: Any) -> str:
    """The task text of a prompt: a plain string, or its last user message."""
    if isinstance(prompt, str):
        return prompt.strip()
    users = [m.get("content") or "" for m in prompt or () if isinstance(m, dict)
             and m.get("role") == "user"]
    return str(users[-1]).strip() if users else ""
