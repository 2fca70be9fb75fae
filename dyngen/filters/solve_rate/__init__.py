"""The solve-rate stage (`round.solve_rate`): keep what the live policy can learn from.

The policy (a served endpoint, or an in-process model) completes each new row's prompt
`samples` times (or, with `sequential` on, a few times first and more only while the
verdict is uncertain: sequential.py); a verl-form reward function grades each completion
(rewards.py); rows whose pass rate falls outside the inclusive band `keep` are quarantined
as `too_easy` or `too_hard` with the measured rate, and kept rows carry
`extra_info.solve_rate`. It runs last in the round's filter chain (it is the expensive
one), each partition grading its own share (dyngen.tasks.solve_rate).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from dyngen.filters.solve_rate.grading import Grade, band_verdict, grade_rows, requests_for
from dyngen.filters.solve_rate.lineage import histogram, host_port, stage_lineage
from dyngen.filters.solve_rate.rewards import DEFAULT_REWARDS, RewardChooser, score_of
from dyngen.filters.solve_rate.sequential import SamplingPlan
from dyngen.filters.solve_rate.shares import grade_share, split
from dyngen.filters.solve_rate.stage import SECTION, SolveRateFilter, policy_model, with_records


def settings_of(cfg: DictConfig) -> dict[str, Any]:
    """round.solve_rate as a plain dict (what the stage and its tasks take)."""
    out = OmegaConf.to_container(cfg.round.solve_rate, resolve=True)
    assert isinstance(out, dict)
    return out


def check_before_round(cfg: DictConfig) -> None:
    """What can be checked before a round starts: the configured reward function loads and
    the key's variable is set (the endpoint is reached when the stage starts)."""
    if not cfg.round.solve_rate.enabled:
        return
    settings = settings_of(cfg)
    RewardChooser(settings["reward"]["path"], settings["reward"]["name"]).configured()
    if settings.get("endpoint"):
        from dyngen.llm.served import api_key, base_url

        base_url(settings["endpoint"], SECTION)
        api_key(settings.get("api_key_env"), SECTION)


__all__ = [
    "DEFAULT_REWARDS",
    "Grade",
    "RewardChooser",
    "SamplingPlan",
    "SolveRateFilter",
    "band_verdict",
    "check_before_round",
    "grade_rows",
    "grade_share",
    "histogram",
    "host_port",
    "policy_model",
    "requests_for",
    "score_of",
    "settings_of",
    "split",
    "stage_lineage",
    "with_records",
]
