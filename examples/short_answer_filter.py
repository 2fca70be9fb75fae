"""A complete dyngen row filter: drop tasks whose ground truth is longer than a limit.

Name it in the round's config (extra keys of the entry reach the filter as `config`):

    round:
      filters:
        - {path: examples/short_answer_filter.py, name: ShortAnswers, max_chars: 8}

A filter subclasses RowFilter, answers one verdict per row (None keeps it, a detail
drops it for the filter's `reason`), and never changes the rows. Its tests inherit the
RowFilter contract suite in tests/filters/contract.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from dyngen.filters import Answer, Row, RowFilter


class ShortAnswers(RowFilter):
    """Keep rows whose reward_model.ground_truth has at most `max_chars` characters."""

    reason = "long_answer"

    def check(self, rows: Sequence[Row]) -> list[Answer]:
        """None for a short enough answer, else how long it is."""
        limit = int((self.config or {}).get("max_chars", 8))
        truths = [(row.get("reward_model") or {}).get("ground_truth", "") for row in rows]
        lengths = [len(str(truth)) for truth in truths]
        return [None if n <= limit else f"answer of {n} characters > {limit}" for n in lengths]
