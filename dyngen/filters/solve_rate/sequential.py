"""How many samples each row gets: all `samples` at once, or sequentially (`sequential`).

Sequentially, every row is first asked for `first` completions; a row is then *decided*
when the band's verdict on its pass rate is credible: the posterior of its solve rate
(a Beta with a uniform prior, Beta(passed + 1, failed + 1)) puts at least `confidence` of
its mass on the side of the band its measured rate is on (below `low`, inside [low, high],
or above `high`). Undecided rows are asked for `step` more, until decided or at `cap`
samples, where the measured rate decides as it always does (band_verdict). A row in the
middle of the band stops early; one near an edge gets the samples an edge needs.

Pure arithmetic: no model, no I/O. The stage sizes of a row follow from its total alone,
so a round's lineage can count the rows of each stage from the grades of every share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingPlan:
    """The stage sizes every row may go through, and when a row stops early."""

    sizes: tuple[int, ...]  # completions asked in stage 0, 1, ...; they sum to the cap
    keep: tuple[float, float]
    confidence: float | None = None  # None: one stage, nothing to decide between stages

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> SamplingPlan:
        """The plan round.solve_rate's settings give (`sequential` off or absent: one stage)."""
        seq = settings.get("sequential") or {}
        if not seq.get("enabled"):  # no band needed: other graders reuse grade_rows
            return cls((int(settings["samples"]),), (0.0, 1.0))
        keep = (float(settings["keep"][0]), float(settings["keep"][1]))
        first, step, cap = int(seq["first"]), int(seq["step"]), int(seq["cap"])
        sizes = [min(first, cap)]
        while sum(sizes) < cap:
            sizes.append(min(step, cap - sum(sizes)))
        return cls(tuple(sizes), keep, float(seq["confidence"]))

    @property
    def cap(self) -> int:
        """The most samples a row is asked for."""
        return sum(self.sizes)

    def decided(self, passed: int, samples: int) -> bool:
        """Whether a row that passed `passed` of `samples` needs no more samples."""
        if self.confidence is None or samples >= self.cap:
            return True
        if samples <= 0:  # no completion came back: nothing measured yet
            return False
        return side_mass(passed, samples, self.keep) >= self.confidence

    def stage_counts(self, totals: Sequence[int]) -> list[dict[str, int]]:
        """[{samples, rows}] per stage asked: the rows asked in it and the samples each got,
        from each row's total samples (a row with total t went through every stage that
        starts below t)."""
        out, start = [], 0
        for size in self.sizes:
            rows = sum(1 for t in totals if t > start)
            if not rows:
                break
            out.append({"samples": size, "rows": rows})
            start += size
        return out


def side_mass(passed: int, samples: int, keep: Sequence[float]) -> float:
    """The posterior probability, under a uniform prior, that the solve rate is on the same
    side of the band (below, inside, above) as the measured rate passed / samples."""
    low, high = float(keep[0]), float(keep[1])
    rate = passed / samples
    below_low = beta_cdf(low, passed, samples - passed)
    if rate < low:
        return below_low
    upto_high = beta_cdf(high, passed, samples - passed)
    if rate > high:
        return 1.0 - upto_high
    return upto_high - below_low


def beta_cdf(x: float, passed: int, failed: int) -> float:
    """P(p <= x) for p ~ Beta(passed + 1, failed + 1): with whole parameters it equals
    P(Binomial(passed + failed + 1, x) >= passed + 1), summed here in logs (no overflow)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    n = passed + failed + 1
    log_x, log_rest = math.log(x), math.log1p(-x)
    total = 0.0
    for j in range(passed + 1, n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
                          + j * log_x + (n - j) * log_rest)
    return min(total, 1.0)
