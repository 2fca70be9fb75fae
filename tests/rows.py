"""Verl-format rows for tests."""

from __future__ import annotations

from typing import Any


def verl_row(i: int, source: str = "seed", content: str | None = None) -> dict[str, Any]:
    """One row in verl's RL schema, distinct for each `i`."""
    return {
        "data_source": source,
        "prompt": [
            {"role": "system", "content": "Solve the problem."},
            {"role": "user", "content": content if content is not None else f"What is {i} + {i}?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        "extra_info": {"index": i, "split": "train"},
    }


def verl_rows(n: int, start: int = 0, source: str = "seed") -> list[dict[str, Any]]:
    """`n` distinct rows with indices start..start+n-1."""
    return [verl_row(i, source) for i in range(start, start + n)]


def verl_row_with(i: int, source: str = "seed", **changes: Any) -> dict[str, Any]:
    """verl_row(i) with fields replaced; `outer.inner=` replaces a nested field."""
    row = verl_row(i, source)
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            row[outer] = {**row[outer], inner: value}
        else:
            row[key] = value
    return row
