"""A row's pass rate as a Beta posterior over what was observed, older evidence counting less.

An observation is `passed` of `samples` completions graded at a policy step: the band's
measurement when a round kept the row, or a trainer's group of completions of it at a batch
end. The posterior starts from Beta(1, 1) (every pass rate equally likely) and adds each
observation's passes and failures weighted by 0.5 ** (age / half_life), the age in training
steps from the observation to `now`: the policy moves, so what it did long ago says less.

What a trainer wants of a row is a group of its `group` completions whose rewards differ
(GRPO's advantage is zero otherwise). With pass rate p that chance is 1 − p^G − (1 − p)^G;
over the posterior, E[p^G] = Π_{j<G} (α + j) / (α + β + j), so `mixed_chance` is exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PRIOR = (1.0, 1.0)


@dataclass(frozen=True)
class Evidence:
    """`passed` of `samples` completions at training step `step`."""

    step: int
    passed: int
    samples: int


@dataclass(frozen=True)
class Posterior:
    """Beta(alpha, beta) over a row's pass rate, with what it was made from."""

    alpha: float
    beta: float
    samples: int  # completions observed (unweighted)
    last_step: int | None  # the newest observation's step; None: never observed

    @property
    def mean(self) -> float:
        """The expected pass rate."""
        return self.alpha / (self.alpha + self.beta)

    def mixed_chance(self, group: int) -> float:
        """The chance that `group` completions of the row do not all get the same grade."""
        return mixed_chance(self.alpha, self.beta, group)


def posterior(evidence: Iterable[Evidence], now: int, half_life: float) -> Posterior:
    """The Beta posterior at step `now` (observations after `now` count fully)."""
    alpha, beta = PRIOR
    samples, last = 0, None
    for e in evidence:
        weight = 0.5 ** (max(0, now - e.step) / half_life) if half_life > 0 else 1.0
        alpha += weight * e.passed
        beta += weight * (e.samples - e.passed)
        samples += e.samples
        last = e.step if last is None else max(last, e.step)
    return Posterior(alpha, beta, samples, last)


def mixed_chance(alpha: float, beta: float, group: int) -> float:
    """1 − E[p^G] − E[(1 − p)^G] for p ~ Beta(alpha, beta)."""
    if group < 2:
        return 0.0
    all_right = all_wrong = 1.0
    for j in range(group):
        all_right *= (alpha + j) / (alpha + beta + j)
        all_wrong *= (beta + j) / (alpha + beta + j)
    return max(0.0, 1.0 - all_right - all_wrong)
