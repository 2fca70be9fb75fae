"""The over-long prompt filter: verl's exact token count, in batches, with a local tokenizer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from dyngen.errors import ConfigError
from dyngen.filters.base import RowFilter
from dyngen.rows import Row, column_of


class OverlongPromptFilter(RowFilter):
    """Drop prompts longer than max_prompt_length tokens, counted exactly as verl counts.

    verl: len(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, **kwargs)).
    The same count in batches: render every prompt with the chat template, then tokenize
    the texts in one fast-tokenizer call (apply_chat_template tokenizes without special
    tokens, so we do too).
    """

    reason = "overlong_prompt"

    def __init__(self, tokenizer: Any, max_prompt_length: int, prompt_key: str = "prompt",
                 chat_template_kwargs: Mapping[str, Any] | None = None,
                 batch_size: int = 512) -> None:
        super().__init__(None)
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.prompt_key = prompt_key
        # verl drops these from the user's kwargs too: the count needs token ids.
        self.kwargs = {k: v for k, v in (chat_template_kwargs or {}).items()
                       if k not in ("tokenize", "return_dict", "return_tensors")}
        self.batch_size = batch_size

    def lengths(self, prompts: Sequence[list[dict[str, str]]]) -> list[int]:
        """Token counts of chat prompts with the generation prompt appended."""
        out: list[int] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = [list(p) for p in prompts[start : start + self.batch_size]]
            texts = self.tokenizer.apply_chat_template(
                batch, add_generation_prompt=True, tokenize=False, **self.kwargs)
            ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
            out += [len(x) for x in ids]
        return out

    def check(self, rows: Sequence[Row]) -> list[str | None]:
        lengths = self.lengths(column_of(rows, self.prompt_key))
        return [None if n <= self.max_prompt_length
                else f"{n} tokens > max_prompt_length {self.max_prompt_length}"
                for n in lengths]


@lru_cache(maxsize=4)
def load_tokenizer(path: str) -> Any:
    """A local tokenizer (never from a hub), cached per process."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise ConfigError(f"data.tokenizer: expected a local tokenizer folder, found {path!r}, "
                          "which is not a directory. Point it at a folder with tokenizer.json.")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)
