"""With verl installed, the solve-rate stage grades verl's own data sources with verl's
default_compute_score, and still refuses a source verl does not know."""

from __future__ import annotations

import pytest

from dyngen.errors import ConfigError
from dyngen.filters.solve_rate import RewardChooser, score_of


def test_verls_sources_are_graded_by_its_default_compute_score() -> None:
    from verl.utils.reward_score import default_compute_score

    chooser = RewardChooser()
    choice = chooser.for_source("openai/gsm8k", {"reward_model": {"ground_truth": "42"}})
    assert choice.function is default_compute_score
    assert score_of(choice.function(data_source="openai/gsm8k", solution_str="#### 42",
                                    ground_truth="42", extra_info={}), choice.label) == 1.0
    # dyngen's own sources keep dyngen's rewards
    assert "exact_match" in chooser.for_source("dyngen-arithmetic").label


def test_a_source_verl_does_not_know_is_still_refused() -> None:
    with pytest.raises(ConfigError, match="does not know it"):
        RewardChooser().check([{"data_source": "my-bench", "reward_model": {
            "ground_truth": "1"}, "extra_info": {}}])
