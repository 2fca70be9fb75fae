"""A generation round's core, free of Prefect: its inputs, its stages, its generator.

The stages (load → generate → filter → concat → version) are plain functions here;
`tasks/` wraps each in a Prefect task and `dyngen/flows/generation_round.py` chains them. The
trigger and context are in `dyngen.round.context`, the filter chain in `dyngen.filters.chain`,
the round's lineage and its renderings in `dyngen.round.lineage`.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import datasets
from omegaconf import DictConfig

from dyngen.config import config_hash, load_config
from dyngen.config.secrets import refuse_redacted
from dyngen.errors import GeneratorOutputError
from dyngen.filters.base import rejection
from dyngen.filters.chain import build_filters, filter_rows
from dyngen.filters.overlong import load_tokenizer
from dyngen.filters.solve_rate import check_before_round
from dyngen.plugins import qualified_name
from dyngen.round.context import RoundContext, Trigger
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.rows import RowBatch, rows_from_output
from dyngen.store import CompactionPolicy, PendingCommit, Store, VersionRecord
from dyngen.store.index import Kind
from dyngen.store.minhash import LshParams
from dyngen.store.names import validate_name
from dyngen.store.store import DEFAULT_INDEX

# Moved to their own modules; importable from here as before.
__all__ = ["RoundContext", "Trigger", "build_filters", "filter_rows", "load_tokenizer",
           "rows_from_output"]


# ---- before the stages ---------------------------------------------------------------
def round_inputs(dataset: str, config: Mapping[str, Any] | None, trigger: Any,
                 overrides: Sequence[str] = ()) -> tuple[DictConfig, Trigger, RolloutsPolicy]:
    """What a round is asked, validated before anything runs: the dataset name, the config,
    the trigger, and where its rollouts file may be (the config's folders, never the
    event's: a path outside them, a FIFO or too large a file fails here)."""
    validate_name(dataset)
    cfg = load_config(overrides=list(overrides), base=config)
    refuse_redacted(cfg)
    trig = Trigger.parse(trigger)
    rollouts = RolloutsPolicy.from_config(cfg)
    check_before_round(cfg)  # a solve-rate reward that cannot load, a key not set
    if trig.rollouts is not None and trig.run is None:  # with a run, they are in the store
        rollouts.check(trig.rollouts)
    return cfg, trig, rollouts


def committed_for(store: Store, dataset: str, trigger: Trigger) -> VersionRecord | None:
    """The version a round with this trigger already committed, if any (its idempotency key:
    the event id, else the dataset and step). Whether a batch end of a training run is
    covered is the store's inbox's to say (dyngen.round.inbox); a trainer that records its
    batch ends in the store (`emit_batch_end(store=...)`) lands a re-sent step once
    whatever its event id."""
    key = trigger.idempotency_key(dataset)
    return store.find_idempotency_key(dataset, key) if key else None


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
    rows = rows_from_output(result, type(generator).__qualname__)
    rows.quarantined = refused_rows(generator)
    return rows


def refused_rows(generator: Any) -> list[dict[str, str]]:
    """The rows a generator refused (its `rejected`), as the quarantine keeps rejections."""
    out = []
    for item in getattr(generator, "rejected", None) or ():
        if not isinstance(item, Mapping) or not isinstance(item.get("reason"), str):
            raise GeneratorOutputError(
                f"generator {type(generator).__qualname__} set `rejected` to an item "
                f"{type(item).__name__}; expected {{'reason': str, 'detail': str, 'row': "
                "the row}} per refused row.")
        out.append(rejection(item.get("row"), (item["reason"], str(item.get("detail") or ""))))
    return out


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


def write_round(store: Store, context: RoundContext, outcome: Any,
                generator: str, lineage: dict[str, Any],
                index: LshParams | None = DEFAULT_INDEX, vectors: Kind | None = None
                ) -> PendingCommit:
    """Write the kept rows as one new shard (with its near-duplicate sidecar hashed by
    `index`, its semantic sidecar embedded by `vectors`) and the rejected rows as a
    quarantine shard; the commit covers the context's batch ends."""
    kept = outcome.kept
    return store.prepare_append(
        context.dataset, kept.for_store() if isinstance(kept, RowBatch) else list(kept),
        rejected=list(outcome.rejected) or None,
        idempotency_key=context.trigger.idempotency_key(context.dataset),
        lineage=lineage, round_id=f"round-{context.round}", generator=generator,
        index=index, vectors=vectors, covers=[b.key for b in context.batch_ends] or None,
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
    return qualified_name(type(obj))
