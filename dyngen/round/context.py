"""What a round knows about itself: the trigger that started it and its context.

A generator receives the `RoundContext` (`generate(dataset, context=None)`); the trigger
is parsed here from an untrusted event payload, field by field. A round covers every batch
end its dataset's inbox holds and no version covers yet (dyngen/round/inbox.py): the
context carries them all, their rollouts read from the store.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dyngen.errors import BatchEndError, TriggerError
from dyngen.rollout_format import Rollout
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.store.covered import check_run

MAX_METRICS = 256
MAX_TRIGGER_BYTES = 64 * 1024


FIELDS = ("event_id", "step", "metrics", "rollouts", "previous", "run", "catch_up")


@dataclass(frozen=True)
class PreviousEvent:
    """The batch end the same trainer sent before this one, as trainers before the store's
    inbox sent it: still accepted and validated, and no longer used (the store orders)."""

    event_id: str
    step: int
    seconds_before: float  # how long before this event it was sent, on the trainer's clock


@dataclass(frozen=True)
class Trigger:
    """What started a round: the batch-end event, its training run, step and metrics."""

    event_id: str | None = None
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    rollouts: str | None = None
    previous: PreviousEvent | None = None
    # The training run whose batch end this is: with `step`, the key of its entry in the
    # dataset's inbox (dyngen.store.inbox), which the round covers or finds covered.
    run: str | None = None
    # A catch-up round (`dyngen serve`'s schedule): it covers what is pending, and with
    # nothing pending ends at once and commits nothing.
    catch_up: bool = False

    @classmethod
    def parse(cls, value: Trigger | Mapping[str, Any] | None) -> Trigger:
        """Validate an untrusted trigger (an event payload): types, sizes, known fields."""
        if value is None:
            return cls()
        if isinstance(value, Trigger):
            return value
        if not isinstance(value, Mapping):
            raise TriggerError(f"trigger must be a mapping, found {type(value).__name__}.")
        if not value:
            # What a batch-end event without a "trigger" in its payload renders to. A round
            # no event started passes None; an empty trigger would commit without a step
            # and without an idempotency key, once per re-delivery.
            raise TriggerError("trigger is empty: a batch-end event's payload must carry "
                               '{"trigger": {"event_id", "step", "metrics", "rollouts"}} '
                               "(dyngen.trainers.events.emit_batch_end sends it); pass None for a "
                               "round that no event started.")
        if len(json.dumps(value, default=str)) > MAX_TRIGGER_BYTES:
            raise TriggerError(f"trigger payload is larger than {MAX_TRIGGER_BYTES} bytes; "
                               "send metrics as a few numbers and rollouts as a file path.")
        unknown = sorted(set(value) - set(FIELDS))
        if unknown:
            raise TriggerError(f"trigger has unknown fields {unknown}; expected "
                               f"{', '.join(FIELDS)}.")
        event_id, step, rollouts = value.get("event_id"), value.get("step"), value.get("rollouts")
        _check_event_id("trigger.event_id", event_id)
        catch_up = value.get("catch_up", False)
        if not isinstance(catch_up, bool):
            raise TriggerError(f"trigger.catch_up must be true or false, found {catch_up!r}.")
        _check_step("trigger.step", step)
        if rollouts is not None:
            _check_rollouts_path(rollouts)
        return cls(event_id=event_id, step=step, metrics=_metrics(value.get("metrics")),
                   rollouts=rollouts, previous=_previous(value.get("previous")),
                   run=_run(value.get("run")), catch_up=catch_up)

    @property
    def batch_end(self) -> tuple[str, int] | None:
        """The inbox key (run, step) this trigger names, if it names both."""
        return None if self.run is None or self.step is None else (self.run, self.step)

    def idempotency_key(self, dataset: str) -> str | None:
        """The event id, else dataset (+ run) + step: a re-delivered trigger lands once."""
        if self.event_id is not None:
            return f"event:{self.event_id}"
        if self.step is not None and self.run is not None:
            return f"{dataset}:run:{self.run}:step:{self.step}"
        if self.step is not None:
            return f"{dataset}:step:{self.step}"
        return None


def _check_event_id(where: str, event_id: Any) -> None:
    if event_id is not None and (not isinstance(event_id, str) or not 0 < len(event_id) <= 200):
        raise TriggerError(f"{where} must be a string of 1-200 characters, found {event_id!r}.")


def _check_step(where: str, step: Any) -> None:
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise TriggerError(f"{where} must be a non-negative integer, found {step!r}.")


def _previous(value: Any) -> PreviousEvent | None:
    """trigger.previous: {"event_id", "step", "seconds_before"}, all three, or absent."""
    if value is None:
        return None
    expected = {"event_id", "step", "seconds_before"}
    if not isinstance(value, Mapping) or set(value) != expected:
        found = sorted(value) if isinstance(value, Mapping) else type(value).__name__
        raise TriggerError(f"trigger.previous must be a mapping of event_id, step and "
                           f"seconds_before, found {found}.")
    event_id, step, before = value["event_id"], value["step"], value["seconds_before"]
    if event_id is None or step is None:
        raise TriggerError("trigger.previous.event_id and trigger.previous.step must be set, "
                           f"found {event_id!r} and {step!r}.")
    _check_event_id("trigger.previous.event_id", event_id)
    _check_step("trigger.previous.step", step)
    if isinstance(before, bool) or not isinstance(before, (int, float)) \
            or not math.isfinite(before) or before < 0:
        raise TriggerError("trigger.previous.seconds_before must be a non-negative number, "
                           f"found {before!r}.")
    return PreviousEvent(event_id, step, float(before))


def _run(value: Any) -> str | None:
    """trigger.run: a training run id as the store's inbox keys it, or absent."""
    if value is None:
        return None
    try:
        return check_run(value)
    except BatchEndError as exc:
        raise TriggerError(f"trigger.run: {exc}") from None


def _check_rollouts_path(value: Any) -> None:
    """An absolute path; where it may point is checked against the config (rollouts.py)."""
    if not isinstance(value, str):
        raise TriggerError(f"trigger.rollouts must be a file path, found {type(value).__name__}.")
    if not value or "\0" in value or not os.path.isabs(value):
        found = "a relative path" if value and "\0" not in value else "an empty or malformed one"
        raise TriggerError(f"trigger.rollouts must be an absolute file path (the round runs in "
                           f"another folder than the trainer), found {found}.")


def _metrics(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > MAX_METRICS:
        raise TriggerError(f"trigger.metrics must be a mapping of at most {MAX_METRICS} "
                           f"names to numbers, found {type(value).__name__}.")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not math.isfinite(v):
            raise TriggerError(f"trigger.metrics[{k!r}] must be a finite number, found {v!r}.")
        out[k] = float(v)
    return out


@dataclass(frozen=True)
class RoundBatchEnd:
    """A batch end a round covers: its entry in the dataset's inbox, with its rollouts read
    from the store and checked as a trigger's rollouts file is (dyngen/round/inbox.py)."""

    run: str
    step: int
    metrics: dict[str, float]
    written_at: str  # ISO 8601, UTC, when the trainer's entry was created
    event_id: str
    rollouts: tuple[Rollout, ...] = ()
    # Why its rollouts could not be used (then it has none; its metrics still count).
    rollouts_error: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        """(run, step): the inbox's key, as a version's `covers` names it."""
        return self.run, self.step


@dataclass(frozen=True)
class RoundContext:
    """What a generator may know about the round it runs in."""

    dataset: str
    round: int  # the version this round will commit
    parent: int
    trigger: Trigger
    # What this generator class recorded as `state` in the newest version it made: a
    # generator's memory lives in the dataset's lineage, so it survives restarts.
    previous_state: dict[str, Any] | None = None
    # Which share of the round's generation this call makes (round.partitions).
    partition: int = 0
    partitions: int = 1
    # Where the trigger's rollouts file may be, from the deployment's config (never the
    # event's); the default allows no folder at all.
    rollouts_policy: RolloutsPolicy = field(default_factory=RolloutsPolicy)
    # The batch ends this round covers: every one its dataset's inbox held that no version
    # covered at the head it loaded, oldest written first. Empty for a round with none
    # pending (then the trigger alone says what the round is about).
    batch_ends: tuple[RoundBatchEnd, ...] = ()
    # Which time this round asks the generator: 0, then 1, 2, ... when the round kept fewer
    # rows than the trainer will draw and asks again (round.top_up).
    attempt: int = 0

    @property
    def round_seed(self) -> int | str:
        """What a generator seeds its draws by: the round, and the attempt when the round
        asks again (the same rows twice would be rejected as duplicates)."""
        return self.round if self.attempt == 0 else f"{self.round}+{self.attempt}"

    @property
    def newest(self) -> RoundBatchEnd | None:
        """The batch end the round goes by: the trigger's own if the round covers it, else
        the newest written; None when the round covers none."""
        mine = self.trigger.batch_end
        own = [b for b in self.batch_ends if b.key == mine]
        return own[0] if own else (self.batch_ends[-1] if self.batch_ends else None)

    @property
    def step(self) -> int | None:
        """The training step the round is about: the newest batch end's, else the trigger's."""
        newest = self.newest
        return newest.step if newest is not None else self.trigger.step

    @property
    def metrics(self) -> dict[str, float]:
        """The newest batch end's metrics (as stored), else the trigger's."""
        newest = self.newest
        return dict(newest.metrics) if newest is not None else dict(self.trigger.metrics)

    @property
    def run(self) -> str | None:
        """The training run of the newest batch end, else the trigger's (None: not named)."""
        newest = self.newest
        return newest.run if newest is not None else self.trigger.run

    def read_rollouts(self) -> list[Rollout]:
        """The rollouts of every batch end the round covers, read from the store (in their
        order), then the trigger's rollouts file, confined, bounded and parsed; [] if there
        are none. A trigger that names its training run has its rollouts in the store (a
        worker on another host could not open the trainer's file): its file is not read."""
        out = [r for b in self.batch_ends for r in b.rollouts]
        if self.trigger.rollouts is not None and self.trigger.run is None:
            out += self.rollouts_policy.read(self.trigger.rollouts)
        return out
