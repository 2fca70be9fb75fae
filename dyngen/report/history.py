"""What the report draws, read from version records' lineage (free-form: read leniently).

A round's lineage holds `counts` (generated, kept, rejected by reason), `trigger` (step,
metrics), `generator` (class, `state`) and `timings` (seconds per stage). Versions made
otherwise (import, restore, a plain `Store.append`) have rows but no round. The trigger's
`dyngen/zero_spread_share` (dyngen.trainers.spread) is what the trainer reported of the
batch that asked for the round: 1 − it is its effective-prompt share.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dyngen.store import VersionRecord
from dyngen.trainers.spread import ZERO_SPREAD_SHARE, finite

MAX_SERIES = 8  # metrics or state fields per chart: more would be unreadable
# A line (or sparkline) spans at least this share of its largest |value|: a near-constant
# series is drawn flat, not zoomed until its last digits look like a trend.
MIN_SPAN_SHARE = 0.1


@dataclass(frozen=True)
class RoundPoint:
    """One generation round, as the charts need it."""

    version: int
    step: int | None
    generated: int
    kept: int
    rejected: dict[str, int]
    metrics: dict[str, float]
    state: dict[str, float]
    timings: dict[str, float]
    generator: str
    # A curriculum's level per task family (its state's `levels`, e.g. ReasoningGymCurriculum).
    levels: dict[str, float] = field(default_factory=dict)
    solve_rate: SolveRatePoint | None = None  # the round's solve-rate stage, when it ran

    @property
    def effective_share(self) -> float | None:
        """The share of the trigger batch's prompts whose rewards differed, as the trainer
        reported it (1 − its zero-spread share); None where it reported none."""
        share = self.metrics.get(ZERO_SPREAD_SHARE)
        return None if share is None or not 0 <= share <= 1 else 1.0 - share


@dataclass(frozen=True)
class SolveRatePoint:
    """A round's measured pass counts (entry k: rows that passed k of `samples`), and its band."""

    samples: int
    histogram: tuple[int, ...]
    keep: tuple[float, float]
    policy_step: int | None = None  # the training step of the weights that measured them

    @property
    def kept_share(self) -> float | None:
        """The share of the measured rows inside the band (None: nothing measured)."""
        lo, hi = self.keep
        total = sum(self.histogram)
        inside = sum(n for k, n in enumerate(self.histogram) if lo <= k / self.samples <= hi)
        return inside / total if total else None


@dataclass
class History:
    """A window of a dataset's history, oldest first."""

    dataset: str
    total_versions: int  # in the whole dataset, not only the window
    versions: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    operations: list[str] = field(default_factory=list)
    rounds: list[RoundPoint] = field(default_factory=list)

    @property
    def first_version(self) -> int:
        """The oldest version in the window."""
        return self.versions[0] if self.versions else 0

    def reasons(self) -> list[str]:
        """Reject reasons, most frequent first."""
        total: Counter[str] = Counter()
        for r in self.rounds:
            total.update(r.rejected)
        return [reason for reason, _ in total.most_common()]

    def metric_names(self) -> list[str]:
        """Trigger metrics, most often reported first, at most MAX_SERIES."""
        return _most_common(r.metrics for r in self.rounds)

    def state_names(self) -> list[str]:
        """Numeric generator-state fields, most often recorded first, at most MAX_SERIES."""
        return _most_common(r.state for r in self.rounds)

    def level_names(self) -> list[str]:
        """Task families with a recorded level, in the order they first appear."""
        seen: dict[str, None] = {}
        for r in self.rounds:
            seen.update(dict.fromkeys(r.levels))
        return list(seen)

    def stage_names(self) -> list[str]:
        """Timed stages in the order rounds recorded them."""
        seen: dict[str, None] = {}
        for r in self.rounds:
            seen.update(dict.fromkeys(r.timings))
        return list(seen)


def history_of(records: Sequence[VersionRecord], total_versions: int | None = None) -> History:
    """The report's view of `records` (oldest first)."""
    dataset = records[0].dataset if records else ""
    total = total_versions if total_versions is not None else (
        records[-1].version + 1 if records else 0)
    out = History(dataset, total)
    for rec in records:
        out.versions.append(rec.version)
        out.rows.append(rec.rows)
        out.operations.append(rec.operation)
        point = round_point(rec)
        if point is not None:
            out.rounds.append(point)
    return out


def round_point(rec: VersionRecord) -> RoundPoint | None:
    """The round that made `rec`, or None if it was not made by a generation round."""
    lineage = rec.lineage if isinstance(rec.lineage, Mapping) else {}
    counts = lineage.get("counts")
    if not isinstance(counts, Mapping):
        return None
    trigger = _mapping(lineage.get("trigger"))
    generator = _mapping(lineage.get("generator"))
    state = _mapping(generator.get("state"))
    step = trigger.get("step")
    rejected = {str(k): int(v) for k, v in _mapping(counts.get("rejected")).items()
                if finite(v)}
    return RoundPoint(
        version=rec.version,
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
        generated=_int(counts.get("generated")), kept=_int(counts.get("kept")),
        rejected=rejected, metrics=numbers(_mapping(trigger.get("metrics"))),
        state=numbers(state),
        timings=numbers(_mapping(lineage.get("timings"))),
        generator=str(generator.get("name") or generator.get("class") or ""),
        levels={k: v for k, v in numbers(_mapping(state.get("levels"))).items() if "." not in k},
        solve_rate=solve_rate_point(lineage.get("solve_rate")),
    )


def solve_rate_point(stage: Any) -> SolveRatePoint | None:
    """The pass-count histogram and band a round's `solve_rate` lineage holds, if sound."""
    stage = _mapping(stage)
    samples, hist, keep = stage.get("samples"), stage.get("histogram"), stage.get("keep")
    if not (isinstance(samples, int) and samples >= 1 and isinstance(hist, list)
            and len(hist) == samples + 1 and all(finite(h) for h in hist)
            and isinstance(keep, list) and len(keep) == 2 and all(finite(k) for k in keep)):
        return None
    step = stage.get("policy_step")
    return SolveRatePoint(samples, tuple(int(h) for h in hist), (float(keep[0]), float(keep[1])),
                          step if isinstance(step, int) and not isinstance(step, bool) else None)


def numbers(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers in a mapping, nested mappings flattened as `outer.inner`."""
    out: dict[str, float] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(numbers(value, f"{name}."))
        elif finite(value):
            out[name] = float(value)
    return out


def bins(count: int, most: int) -> list[range]:
    """`count` consecutive items in at most `most` contiguous groups of equal size."""
    size = max(1, math.ceil(count / most)) if most > 0 else max(count, 1)
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def _most_common(dicts: Any) -> list[str]:
    seen: Counter[str] = Counter()
    for d in dicts:
        seen.update(d.keys())
    return [name for name, _ in sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))][:MAX_SERIES]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int:
    return int(value) if finite(value) else 0
