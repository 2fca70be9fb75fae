"""Rollouts files for rounds: one JSONL file per training step, where rounds may read it.

A record is `{"prompt": messages or text, "score": number, "ground_truth": str | None}`,
the format the proposer's hard-seed selection reads (generators/proposer/seeds.py). Files
go under `<store root>/rollouts/<dataset>/<run>/`, the folder a round accepts rollouts
from by default, and are written whole (temp file, then rename): a round never reads half
of one.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import datasets

from dyngen.store import Store
from dyngen.store.backend import replace_durably
from dyngen.store.location import local_folder_for
from dyngen.store.names import validate_name
from dyngen.text import question_of
from dyngen.trainers.spread import finite

ROLLOUTS_DIR = "rollouts"
EVENT_NAMESPACE = uuid.UUID("6f1c1f0e-5d33-4c4e-9a55-0d7f3f1e2a10")


def event_id_for(run_id: str, step: int) -> str:
    """The event id of a run's step: the same on every restart, so its round lands once."""
    return str(uuid.uuid5(EVENT_NAMESPACE, f"{run_id}:{step}"))


def rollouts_dir(store_root: str | os.PathLike[str], dataset: str, run: str) -> Path:
    """`<store root>/rollouts/<dataset>/<run>` (for a URL root, under its local folder,
    see dyngen.store.location.local_folder_for): where a run's rollouts files go."""
    return (local_folder_for(store_root) / ROLLOUTS_DIR / validate_name(dataset)
            / safe_run_name(run))


def safe_run_name(run: str) -> str:
    """A run id as one safe path component (other characters become '-')."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", run).strip(".-")[:100]
    return cleaned or "run"


def rollout_record(prompt: Any, score: Any, ground_truth: Any = None) -> dict[str, Any] | None:
    """One rollouts line, or None when the score is not a finite number."""
    if not finite(score):
        return None
    truth = None if ground_truth is None else str(ground_truth)
    return {"prompt": prompt, "score": float(score), "ground_truth": truth}


def write_rollouts(path: Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Write a rollouts JSONL file whole (temp file, fsync, rename); return its path."""
    def lines(fh: BinaryIO) -> None:
        for record in records:
            fh.write((json.dumps(record, ensure_ascii=False, default=str) + "\n").encode())

    return replace_durably(path, lines)


@dataclass
class PromptIndex:
    """The dataset's prompts by their last user message, for rollouts that lost them.

    verl dumps a prompt as the tokenizer decodes it (template words included, e.g.
    "user\\nWhat is 2+3?\\nassistant"), which is no task a generator can reuse; TRL logs
    the prompt but not its ground truth. A row's last user message appears verbatim in
    verl's text, near the start of a line in every common chat template (Qwen and SmolLM:
    a line of its own; Llama 3: the template's next word follows on its line; Mistral:
    after "[INST]"). Rows are indexed by the first PREFIX characters of that message; a
    text is looked up at each of the first few word starts of each line, and a candidate
    counts only if its whole message is in the text. Only rows added since the last
    refresh are read again.
    """

    store: Store
    dataset: str
    version: int | None = None
    rows: int = 0
    by_prefix: dict[str, list[tuple[str, Any, str | None]]] = field(default_factory=dict)
    prefix_lengths: set[int] = field(default_factory=set)

    PREFIX = 32
    WORD_STARTS = 4  # word starts tried per line: template words may precede the message

    def refresh(self) -> None:
        """Index the rows of versions committed since the last refresh."""
        head = self.store.head(self.dataset)
        if head.version == self.version:
            return
        data = self.store.load(self.dataset, head.version)
        if head.rows < self.rows:  # not an extension (a restore): index afresh
            self.by_prefix, self.prefix_lengths, self.rows = {}, set(), 0
        column = head.prompt_key if head.prompt_key in data.column_names else "prompt"
        new = data.select(range(self.rows, len(data))) if self.rows else data
        for prompt, truth in _prompts_and_truths(new, column):
            content = question_of(prompt)
            if content:
                key = content[: self.PREFIX]
                self.prefix_lengths.add(len(key))
                self.by_prefix.setdefault(key, []).append((content, prompt, truth))
        self.version, self.rows = head.version, len(data)

    def lookup(self, text: str) -> tuple[Any, str | None] | None:
        """(prompt, ground truth) of the row whose last user message is in `text`, longest."""
        best: tuple[str, Any, str | None] | None = None
        for start in self._starts(text):
            for length in self.prefix_lengths:
                for content, prompt, truth in self.by_prefix.get(text[start:start + length], ()):
                    if (best is None or len(content) > len(best[0])) \
                            and text.startswith(content, start):
                        best = (content, prompt, truth)
        return None if best is None else (best[1], best[2])

    def truth_of(self, prompt: Any) -> str | None:
        """The ground truth of the row with this prompt's last user message, if any."""
        content = question_of(prompt)
        for known, _, truth in self.by_prefix.get(content[: self.PREFIX], ()):
            if known == content:
                return truth
        return None

    def _starts(self, text: str) -> Iterator[int]:
        """Offsets of the first few word starts of every line of `text`."""
        for match in re.finditer(r"^[ \t]*", text, re.MULTILINE):
            pos, found = match.end(), 0
            while found < self.WORD_STARTS and pos < len(text) and text[pos] != "\n":
                yield pos
                found += 1
                space = text.find(" ", pos)
                newline = text.find("\n", pos)
                if space < 0 or (0 <= newline < space):
                    break
                pos = space + 1


def _prompts_and_truths(rows: datasets.Dataset, column: str) -> Iterator[tuple[Any, str | None]]:
    names = [column] + (["reward_model"] if "reward_model" in rows.column_names else [])
    for batch in rows.select_columns(names).iter(batch_size=4096):
        truths = batch.get("reward_model") or [None] * len(batch[column])
        for prompt, reward in zip(batch[column], truths, strict=True):
            truth = reward.get("ground_truth") if isinstance(reward, dict) else None
            yield prompt, None if truth is None else str(truth)
