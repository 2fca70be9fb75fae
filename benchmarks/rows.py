"""The row the store benchmarks write: verl-shaped, distinct for each number."""

from __future__ import annotations


def bench_row(i: int) -> dict:
    """One verl-format row, distinct for each `i`."""
    return {"data_source": "bench",
            "prompt": [{"role": "user", "content": f"Compute {i} * {i % 97} + {i % 13}."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i * (i % 97) + i % 13)},
            "extra_info": {"index": i}}
