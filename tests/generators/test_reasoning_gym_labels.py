"""Label precision by construction, checked: on 24 families, rows from every one of their
levels score 1.0 with their ground truth through dyngen's reward (the family's own scorer on
the stored entry), and below 1.0 with a wrong answer."""

from __future__ import annotations

import pytest

from dyngen.generators.reasoning_gym import ReasoningGymCurriculum
from dyngen.generators.reasoning_gym.families import Family
from dyngen.generators.reasoning_gym.reward import compute_score
from dyngen.round.context import RoundContext, Trigger
from tests.generators.contract import make_seed_dataset

# Across reasoning-gym's categories; graph_color and propositional_logic have no single
# answer (their label is the entry's checked example), arc_1d and graph_color keep tuples
# and integer keys in their metadata, word_ladder's scorer reads its level's configuration.
FAMILIES = [
    "basic_arithmetic", "chain_sum", "leg_counting", "propositional_logic", "graph_color",
    "arc_1d", "word_ladder", "gcd", "lcm", "fraction_simplification", "decimal_arithmetic",
    "base_conversion", "binary_matrix", "count_bits", "letter_counting", "number_sorting",
    "spiral_matrix", "rotate_matrix", "mini_sudoku", "maze", "shortest_path", "syllogism",
    "family_relationships", "simple_equations",
]
ROWS = 3


def wrong(truth: str) -> str:
    """An answer that is not the label: a digit before it (never the same value or text)."""
    return "9" + truth


@pytest.mark.parametrize("family", FAMILIES)
def test_every_row_of_every_level_is_labelled_right(family: str) -> None:
    top = Family(family).top
    for level in range(top + 1):
        gen = ReasoningGymCurriculum({"tasks": [family], "rows_per_round": ROWS})
        previous = {"levels": {family: level}}
        rows = gen.generate(make_seed_dataset(1), RoundContext(
            "labels", level + 1, level, Trigger(), previous)).to_list()
        assert len(rows) == ROWS, (family, level, gen.stats)
        for row in rows:
            info, truth = row["extra_info"], row["reward_model"]["ground_truth"]
            assert info["reasoning_gym"]["level"] == level
            right = compute_score(row["data_source"], f"<answer>{truth}</answer>", truth, info)
            assert right == 1.0, (family, level, truth)
            bad = compute_score(row["data_source"], f"<answer>{wrong(truth)}</answer>", truth,
                                info)
            assert bad < 1.0, (family, level, truth)
            if "\n" not in truth:  # one line: the last line is read without answer tags
                assert compute_score(row["data_source"], f"Thinking.\n{truth}", truth,
                                     info) == 1.0
