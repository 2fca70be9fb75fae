"""Which reward function grades a row: the configured one, else dyngen's own by data_source.

Every reward is called in verl's signature, `compute_score(data_source, solution_str,
ground_truth, extra_info) -> float | {"score": float, ...}`. With `round.solve_rate.reward.path`
set, that function grades every row. Without it, the row's `data_source` picks one:
`DEFAULT_REWARDS` maps a prefix to a function (the longest prefix wins), and rows no prefix
matches go to verl's `default_compute_score` when verl is installed and knows the source.
A data source nothing grades is refused before any completion is asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dyngen.errors import ConfigError, DyngenError, FilterError
from dyngen.plugins import load_function

KEY = "round.solve_rate.reward"
# data_source prefix -> (path, name) of the reward function that grades its rows. A generator
# adds its own with one line; its module is imported only when such rows occur.
DEFAULT_REWARDS: dict[str, tuple[str, str]] = {
    "dyngen-arithmetic": ("pkg://dyngen.generators.exact_match", "compute_score"),
    "dyngen-proposer": ("pkg://dyngen.generators.exact_match", "compute_score"),
    "dyngen-code-": ("pkg://dyngen.generators.code_tasks.reward", "compute_score"),
    "reasoning_gym/": ("pkg://dyngen.generators.reasoning_gym.reward", "compute_score"),
}
VERL_DEFAULT = ("verl.utils.reward_score", "default_compute_score")

Reward = Callable[..., Any]


@dataclass(frozen=True)
class RewardChoice:
    """The function that grades one data source, and how lineage names it."""

    function: Reward
    label: str  # "path:name"


def score_of(result: Any, label: str) -> float:
    """A reward's result as a number: a float, or the "score" of a dict (verl's two forms)."""
    value = result.get("score") if isinstance(result, Mapping) else result
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise FilterError(f"reward function {label} returned {result!r}; expected a number or "
                          "a dict with a numeric 'score' (verl's compute_score forms).")
    return float(value)


class RewardChooser:
    """Picks (and loads once) the reward of each data source."""

    def __init__(self, path: str | None = None, name: str = "compute_score", *,
                 key: str = KEY) -> None:
        self.path, self.name = path, name
        self.key = key  # the setting its errors name (the verifiers taskset has its own)
        self._chosen: dict[str, RewardChoice] = {}
        self._configured: RewardChoice | None = None

    def configured(self) -> RewardChoice | None:
        """The configured reward function (loaded now: a bad path fails before any work)."""
        if self.path is None:
            return None
        if self._configured is None:
            fn = load_function(self.path, self.name, key=self.key, kind="reward function")
            self._configured = RewardChoice(fn, f"{self.path}:{self.name}")
        return self._configured

    def for_source(self, data_source: str, example: Mapping[str, Any] | None = None
                   ) -> RewardChoice:
        """The reward of `data_source`, or a ConfigError naming it and the key to set."""
        configured = self.configured()
        if configured is not None:
            return configured
        if data_source not in self._chosen:
            self._chosen[data_source] = self._default(data_source, example)
        return self._chosen[data_source]

    def check(self, rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
        """Every data source among `rows` has a reward (loaded now), else a ConfigError.

        Returns each data source's reward label, for lineage.
        """
        firsts: dict[str, Mapping[str, Any]] = {}
        for row in rows:
            firsts.setdefault(str(row.get("data_source")), row)
        return {source: self.for_source(source, row).label for source, row in firsts.items()}

    def _default(self, source: str, example: Mapping[str, Any] | None) -> RewardChoice:
        matches = [p for p in DEFAULT_REWARDS if source.startswith(p)]
        if matches:
            path, name = DEFAULT_REWARDS[max(matches, key=len)]
            try:
                fn = load_function(path, name, key=f"{self.key} (default for {source!r})",
                                   kind="reward function")
            except DyngenError as exc:
                raise ConfigError(
                    f"rows of data_source {source!r} are graded by default with {path}:{name}, "
                    f"which cannot be loaded ({exc}). Install what it needs, or set "
                    f"{self.key}.path and {self.key}.name to a reward function for these rows."
                ) from exc
            return RewardChoice(fn, f"{path}:{name}")
        verl = _verl_default(source, example)
        if verl is not None:
            return verl
        known = ", ".join(f"{p}*" for p in DEFAULT_REWARDS)
        raise ConfigError(
            f"{self.key} cannot grade rows of data_source {source!r}: dyngen's own rewards "
            f"cover {known}, and verl's default_compute_score "
            f"{'does not know it' if _verl_installed() else 'is not installed'}. Set "
            f"{self.key}.path (a .py file or pkg://module) and {self.key}.name (e.g. "
            "compute_score) to a "
            "reward function in verl's form: compute_score(data_source, solution_str, "
            "ground_truth, extra_info).")


def _verl_installed() -> bool:
    try:
        __import__(VERL_DEFAULT[0])
    except ImportError:
        return False
    return True


def _verl_default(source: str, example: Mapping[str, Any] | None) -> RewardChoice | None:
    """verl's default_compute_score if verl is installed and grades `source` (asked once,
    with an empty answer: verl raises NotImplementedError for a source it does not know)."""
    try:
        module = __import__(VERL_DEFAULT[0], fromlist=[VERL_DEFAULT[1]])
        fn = getattr(module, VERL_DEFAULT[1])
    except (ImportError, AttributeError):
        return None
    truth = ((example or {}).get("reward_model") or {}).get("ground_truth", "")
    try:
        fn(source, "", truth, (example or {}).get("extra_info"))
    except NotImplementedError:
        return None
    except Exception:  # noqa: BLE001 - a scorer that chokes on an empty answer still knows it
        pass
    return RewardChoice(fn, f"pkg://{VERL_DEFAULT[0]}:{VERL_DEFAULT[1]}")
