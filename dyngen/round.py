"""A generation round's core, free of Prefect: trigger, context, stages and lineage.

The stages (load → generate → filter → concat → version) are plain functions here;
`tasks/` wraps each in a Prefect task and `flows/generation_round.py` chains them.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
from omegaconf import DictConfig, OmegaConf

from dyngen.config import config_hash, tokenizer_path
from dyngen.errors import ConfigError, GeneratorOutputError, TriggerError
from dyngen.filters import (
    DuplicateFilter,
    FilterOutcome,
    OverlongPromptFilter,
    RowBatch,
    RowFilter,
    run_filters,
)
from dyngen.plugins import load_class
from dyngen.rollouts import Rollout, RolloutsPolicy
from dyngen.schema_filter import SchemaFilter
from dyngen.store import CompactionPolicy, PendingCommit, Store, VersionRecord
from dyngen.store.names import validate_name
from dyngen.store.shards import schema_from_json, to_table, widen

MAX_METRICS = 256
MAX_TRIGGER_BYTES = 64 * 1024


@dataclass(frozen=True)
class Trigger:
    """What started a round: the batch-end event, its training step and metrics."""

    event_id: str | None = None
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    rollouts: str | None = None

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
                               "(dyngen.events.emit_batch_end sends it); pass None for a "
                               "round that no event started.")
        if len(json.dumps(value, default=str)) > MAX_TRIGGER_BYTES:
            raise TriggerError(f"trigger payload is larger than {MAX_TRIGGER_BYTES} bytes; "
                               "send metrics as a few numbers and rollouts as a file path.")
        unknown = sorted(set(value) - {"event_id", "step", "metrics", "rollouts"})
        if unknown:
            raise TriggerError(f"trigger has unknown fields {unknown}; expected event_id, "
                               "step, metrics, rollouts.")
        event_id, step, rollouts = value.get("event_id"), value.get("step"), value.get("rollouts")
        if event_id is not None and (not isinstance(event_id, str) or not 0 < len(event_id) <= 200):
            raise TriggerError(f"trigger.event_id must be a string of 1-200 characters, "
                               f"found {event_id!r}.")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise TriggerError(f"trigger.step must be a non-negative integer, found {step!r}.")
        if rollouts is not None:
            _check_rollouts_path(rollouts)
        return cls(event_id=event_id, step=step, metrics=_metrics(value.get("metrics")),
                   rollouts=rollouts)

    def idempotency_key(self, dataset: str) -> str | None:
        """The event id, else dataset + step: a re-delivered trigger lands once."""
        if self.event_id is not None:
            return f"event:{self.event_id}"
        if self.step is not None:
            return f"{dataset}:step:{self.step}"
        return None


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

    def read_rollouts(self) -> list[Rollout]:
        """The trigger's rollouts file, confined, bounded and parsed ([] if it names none)."""
        if self.trigger.rollouts is None:
            return []
        return self.rollouts_policy.read(self.trigger.rollouts)


# ---- stages ---------------------------------------------------------------------------
def load_head(store: Store, name: str) -> tuple[datasets.Dataset, VersionRecord]:
    """The head version's record and its rows, memory-mapped."""
    validate_name(name)
    record = store.head(name)
    return store.load(name, record.version), record


def call_generator(generator: Any, dataset: datasets.Dataset, context: RoundContext) -> RowBatch:
    """Run `generator.generate(dataset)` and return its new rows.

    verl's generators take only the dataset and reach rows through `.dataframe`; both
    keep working. The round context is offered as `generator.round_context`, and passed
    as `context=` to a `generate` that declares that parameter.
    """
    # verl hands generators its RLHFDataset, whose rows are in .dataframe.
    dataset.dataframe = dataset  # type: ignore[attr-defined]
    generator.round_context = context
    try:
        with _datasets_caching_off():
            result = _generate(generator, dataset, context)
    except BaseException as exc:  # its own error (or a timeout) keeps its type, for retries
        part = (f" (partition {context.partition} of {context.partitions})"
                if context.partitions > 1 else "")
        exc.add_note(f"dyngen: raised in generator {type(generator).__qualname__} "
                     f"({class_path(generator)}) during round {context.round}{part} of "
                     f"dataset {context.dataset!r}")
        raise
    return rows_from_output(result, type(generator).__qualname__)


def _generate(generator: Any, dataset: datasets.Dataset, context: RoundContext) -> Any:
    """generate(dataset), with context= where the generator's signature declares it."""
    if "context" in inspect.signature(generator.generate).parameters:
        return generator.generate(dataset, context=context)
    return generator.generate(dataset)


_caching_lock = threading.Lock()
_caching_off_calls = 0
_caching_was_on = False


@contextmanager
def _datasets_caching_off() -> Iterator[None]:
    """datasets' caching off while any generator of this process runs.

    A generator's dataset.map/filter would write cache files beside the store's shards;
    with caching off, datasets writes them to a temporary folder instead. Counted, since
    partitions on a thread pool overlap: the last one out restores the setting.
    """
    global _caching_off_calls, _caching_was_on
    with _caching_lock:
        if _caching_off_calls == 0:
            _caching_was_on = datasets.is_caching_enabled()
            datasets.disable_caching()
        _caching_off_calls += 1
    try:
        yield
    finally:
        with _caching_lock:
            _caching_off_calls -= 1
            if _caching_off_calls == 0 and _caching_was_on:
                datasets.enable_caching()


def previous_generator_state(store: Store, name: str, generator_class: str, before: int,
                             partition: int = 0, partitions: int = 1) -> dict[str, Any] | None:
    """The `state` the newest version up to `before` made by `generator_class` recorded.

    A round fanned out over as many partitions as this one recorded one state per
    partition; each partition gets its own back. Otherwise every partition gets `state`.
    Each version's state knows the newest version of every generator class, so this reads
    one record however long ago that generator last ran.
    """
    record = store.newest_by_generator(name, generator_class, at=before)
    if record is None:
        return None
    gen = record.lineage.get("generator") or {}
    states = gen.get("partition_states")
    if isinstance(states, list) and len(states) == partitions > 1:
        state = states[partition]
    else:
        state = gen.get("state")
    return dict(state) if isinstance(state, Mapping) else None


def rows_from_output(result: Any, generator: str) -> RowBatch:
    """Take a generator's return value as rows where that is unambiguous, else fail.

    A `datasets.Dataset` or Arrow table stays in Arrow (the filters read it by column).
    """
    expected = "expected a datasets.Dataset of new rows in verl's schema"
    if isinstance(result, (datasets.Dataset, pa.Table)):
        return RowBatch(to_table(result))
    if isinstance(result, (list, tuple)):
        return RowBatch(result)
    if type(result).__module__.startswith("pandas") and hasattr(result, "to_dict"):
        return RowBatch(result.to_dict("records"))
    if isinstance(result, Mapping):
        columns = list(result.values())
        if columns and all(isinstance(c, list) for c in columns):
            lengths = {str(k): len(c) for k, c in result.items()}
            if len(set(lengths.values())) == 1:
                return RowBatch([dict(zip(result.keys(), vals, strict=True))
                                 for vals in zip(*columns, strict=True)])
            raise GeneratorOutputError(
                f"generator {generator} returned a dict of columns of unequal lengths "
                f"{dict(list(lengths.items())[:8])}; {expected}, or a dict of equal-length "
                "column lists.")
        raise GeneratorOutputError(
            f"generator {generator} returned a dict with keys {list(result)[:8]}; {expected} "
            "(a dict of equal-length column lists is also accepted)."
        )
    shown = "None" if result is None else f"a {type(result).__name__}"
    raise GeneratorOutputError(f"generator {generator} returned {shown}; {expected}. "
                               "Return only the new rows, e.g. datasets.Dataset.from_list(rows).")


def build_filters(cfg: DictConfig, store: Store, name: str, record: VersionRecord,
                  rows: Sequence[Any] = ()) -> list[RowFilter]:
    """schema → over-long prompt → duplicate → user filters, as configured.

    The schema is the parent's, with the extra_info fields the `rows` add (see `widen`).
    """
    key = cfg.data.prompt_key
    if key != record.prompt_key:
        raise ConfigError(
            f"dataset {name!r} keeps its prompts in column {record.prompt_key!r} (set when it "
            f"was created); data.prompt_key is {key!r}. Set data.prompt_key="
            f"{record.prompt_key}, or import the data as a new dataset.")
    schema = widen(schema_from_json(record.schema), _extra_info_schema(rows))
    filters: list[RowFilter] = [SchemaFilter(schema, key)]
    if cfg.data.filter_overlong_prompts:
        filters.append(OverlongPromptFilter(
            load_tokenizer(str(tokenizer_path(cfg))), cfg.data.max_prompt_length, key,
            OmegaConf.to_container(cfg.data.apply_chat_template_kwargs, resolve=True)))
    if cfg.round.dedup:
        filters.append(DuplicateFilter(store, name, record.version, key))
    for i, entry in enumerate(cfg.round.filters):
        cls = load_class(entry.path, entry.name, RowFilter, key=f"round.filters[{i}]",
                         kind="filter")
        filters.append(cls(entry))
    return filters


def _extra_info_schema(rows: Sequence[Any]) -> pa.Schema:
    """The Arrow type of the rows' extra_info, or an empty schema where it has none."""
    table = rows.table if isinstance(rows, RowBatch) else None
    if table is not None:
        return table.schema
    extras = [r.get("extra_info") for r in rows if isinstance(r, Mapping)]
    try:
        return pa.table({"extra_info": pa.array([e for e in extras if isinstance(e, Mapping)])}
                        ).schema
    except (pa.ArrowException, TypeError, ValueError):
        return pa.schema([])  # mixed types: the schema filter rejects rows one by one


def filter_rows(rows: Sequence[Any], filters: list[RowFilter]) -> FilterOutcome:
    """Run the filters; the kept rows come back in their stored form (an Arrow table).

    Kept and rejected rows come back as RowBatches: one opaque value each for Prefect to
    hand to the next task, however many rows they hold.
    """
    outcome = run_filters(rows if isinstance(rows, RowBatch) else RowBatch(rows), filters)
    schema_filter = next((f for f in filters if isinstance(f, SchemaFilter)), None)
    if schema_filter is not None:
        outcome.kept = RowBatch(schema_filter.stored(outcome.kept))
    outcome.rejected = RowBatch(outcome.rejected)
    return outcome


def write_round(store: Store, context: RoundContext, outcome: FilterOutcome,
                generator: str, lineage: dict[str, Any]) -> PendingCommit:
    """Write the kept rows as one new shard and the rejected rows as a quarantine shard."""
    kept = outcome.kept
    return store.prepare_append(
        context.dataset, kept.for_store() if isinstance(kept, RowBatch) else list(kept),
        rejected=list(outcome.rejected) or None,
        idempotency_key=context.trigger.idempotency_key(context.dataset),
        lineage=lineage, round_id=f"round-{context.round}", generator=generator,
    )


def compaction_policy(cfg: DictConfig) -> CompactionPolicy:
    """The compaction policy `round.compaction` sets (applied when it is enabled)."""
    settings = cfg.round.compaction
    return CompactionPolicy(max_small_shards=int(settings.max_small_shards),
                            fan_in=int(settings.fan_in),
                            target_bytes=max(1, int(float(settings.target_shard_mb) * 2**20)))


def commit_round(store: Store, pending: PendingCommit) -> VersionRecord:
    """Commit (rebasing over concurrent commits); on failure remove the round's shards."""
    try:
        return store.commit_with_rebase(pending)
    except BaseException:
        store.abort(pending)
        raise


# ---- lineage ----------------------------------------------------------------------------
def generator_lineage(datagen: DictConfig, generator: Any) -> dict[str, Any]:
    """Which generator made the rows: class, where it came from, its config hash, and the
    `state` and `stats` mappings it set in this round (as JSON)."""
    cls = type(generator)
    out = {"class": class_path(generator), "name": cls.__qualname__,
           "path": str(datagen.path), "config_hash": config_hash(datagen)}
    for attr in ("state", "stats"):
        value = getattr(generator, attr, None)
        if isinstance(value, Mapping):
            out[attr] = json.loads(json.dumps(dict(value), default=str))  # JSON-safe
    return out


def class_path(obj: Any) -> str:
    """`module.QualName` of an object's class: how lineage names a generator."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@lru_cache(maxsize=4)
def load_tokenizer(path: str) -> Any:
    """A local tokenizer (never from a hub), cached per process."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise ConfigError(f"data.tokenizer: expected a local tokenizer folder, found {path!r}, "
                          "which is not a directory. Point it at a folder with tokenizer.json.")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)

