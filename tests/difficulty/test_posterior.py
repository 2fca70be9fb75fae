"""The posterior over a row's pass rate, and the chance a group has mixed rewards, on
constructed observations (exact values, and properties over any evidence)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dyngen.difficulty.posterior import Evidence, mixed_chance, posterior


def test_no_evidence_is_the_uniform_prior() -> None:
    post = posterior([], now=10, half_life=4)
    assert (post.alpha, post.beta, post.samples, post.last_step) == (1, 1, 0, None)
    # Under a uniform pass rate, P(all G right) = P(all G wrong) = 1 / (G + 1).
    assert math.isclose(post.mixed_chance(8), 1 - 2 / 9)


def test_observations_add_passes_and_failures_and_old_ones_count_half_per_half_life() -> None:
    fresh = posterior([Evidence(10, 6, 8)], now=10, half_life=4)
    assert (fresh.alpha, fresh.beta, fresh.samples, fresh.last_step) == (7, 3, 8, 10)
    old = posterior([Evidence(2, 6, 8), Evidence(10, 1, 4)], now=10, half_life=4)
    # step 2 is two half-lives before step 10: its 6 passes and 2 failures count a quarter.
    assert math.isclose(old.alpha, 1 + 6 / 4 + 1) and math.isclose(old.beta, 1 + 2 / 4 + 3)
    assert old.last_step == 10 and old.samples == 12


def test_a_row_always_solved_has_little_chance_of_a_mixed_group() -> None:
    solved = posterior([Evidence(5, 16, 16)], now=5, half_life=4)
    edge = posterior([Evidence(5, 8, 16)], now=5, half_life=4)
    # E[p^8] under Beta(17, 1) is 17/25; (1 - p)^8 is negligible.
    assert math.isclose(solved.mixed_chance(8), 1 - 17 / 25 - math.prod(
        (1 + j) / (18 + j) for j in range(8)))
    assert edge.mixed_chance(8) > 0.9 > 0.4 > solved.mixed_chance(8)
    assert mixed_chance(5, 5, 1) == 0.0  # one completion is never a mixed group


def test_mixed_chance_matches_sampling_the_posterior() -> None:
    rng = np.random.default_rng(0)
    p = rng.beta(3.5, 2.0, size=200_000)
    sampled = float(np.mean(1 - p ** 6 - (1 - p) ** 6))
    assert abs(mixed_chance(3.5, 2.0, 6) - sampled) < 0.005


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 32), st.integers(1, 32)),
                max_size=12), st.integers(0, 60), st.floats(0.5, 20), st.integers(2, 32))
def test_any_evidence_gives_a_proper_posterior(raw: list[tuple[int, int, int]], now: int,
                                               half_life: float, group: int) -> None:
    evidence = [Evidence(step, min(p, n), n) for step, p, n in raw]
    post = posterior(evidence, now, half_life)
    assert post.alpha >= 1 and post.beta >= 1 and 0 < post.mean < 1
    chance = post.mixed_chance(group)
    assert 0 <= chance <= 1
    # Swapping passes and failures leaves the chance of a mixed group as it was.
    flipped = posterior([Evidence(e.step, e.samples - e.passed, e.samples) for e in evidence],
                        now, half_life)
    assert math.isclose(flipped.mixed_chance(group), chance, abs_tol=1e-9)
    assert post.samples == sum(e.samples for e in evidence)
