"""The round's filter chain, as configured: schema → over-long → duplicate → near-duplicate
→ semantic duplicate → user filters → solve rate (the expensive one, on what the others
kept).

The one place the round widens the dataset's schema for a round's rows (new extra_info
fields), and the one place the kept rows become what the store writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from omegaconf import DictConfig, OmegaConf

from dyngen.config import tokenizer_path
from dyngen.errors import ConfigError
from dyngen.filters.base import FilterOutcome, RowFilter, run_filters
from dyngen.filters.duplicate import DuplicateFilter
from dyngen.filters.near_duplicate import NearDuplicateFilter, params_of
from dyngen.filters.overlong import OverlongPromptFilter, load_tokenizer
from dyngen.filters.schema import SchemaFilter
from dyngen.filters.semantic_duplicate import SemanticDuplicateFilter
from dyngen.filters.semantic_duplicate import settings_of as vector_settings_of
from dyngen.filters.solve_rate import SolveRateFilter, settings_of
from dyngen.plugins import load_class
from dyngen.rows import RowBatch
from dyngen.store import Store, VersionRecord
from dyngen.store.embeddings import VectorSettings
from dyngen.store.minhash import LshParams
from dyngen.store.shards import schema_from_json, widen


def build_filters(cfg: DictConfig, store: Store, name: str, record: VersionRecord,
                  rows: Sequence[Any] = (),
                  grader: Callable[[RowBatch], list[dict[str, Any]]] | None = None,
                  ) -> list[RowFilter]:
    """schema → over-long prompt → duplicate → near-duplicate → semantic duplicate → user
    filters → solve rate, as configured.

    The schema is the parent's, with the extra_info fields the `rows` add (see `widen`).
    `grader` grades the solve-rate filter's rows (the round's partitions, each a share);
    without one the filter asks the policy itself.
    """
    key = cfg.data.prompt_key
    check_prompt_key(key, record, name)
    filters: list[RowFilter] = [SchemaFilter(round_schema(record, rows), key)]
    if cfg.data.filter_overlong_prompts:
        filters.append(OverlongPromptFilter(
            load_tokenizer(str(tokenizer_path(cfg))), cfg.data.max_prompt_length, key,
            OmegaConf.to_container(cfg.data.apply_chat_template_kwargs, resolve=True)))
    if cfg.round.dedup:
        filters.append(DuplicateFilter(store, name, record.version, key))
    if cfg.round.near_duplicate.enabled:
        filters.append(NearDuplicateFilter.from_config(cfg.round.near_duplicate, store, name,
                                                       record.version, key))
    if cfg.round.semantic_duplicate.enabled:
        filters.append(SemanticDuplicateFilter.from_config(
            cfg.round.semantic_duplicate, store, name, record.version, key))
    for i, entry in enumerate(cfg.round.filters):
        cls = load_class(entry.path, entry.name, RowFilter, key=f"round.filters[{i}]",
                         kind="filter")
        filters.append(cls(entry))
    if cfg.round.solve_rate.enabled:
        filters.append(SolveRateFilter(settings_of(cfg), key, grader=grader,
                                       salt=(name, record.version + 1)))
    return filters


def check_prompt_key(key: str, record: VersionRecord, name: str) -> None:
    """`data.prompt_key` must be the column the dataset was created with."""
    if key != record.prompt_key:
        raise ConfigError(
            f"dataset {name!r} keeps its prompts in column {record.prompt_key!r} (set when it "
            f"was created); data.prompt_key is {key!r}. Set data.prompt_key="
            f"{record.prompt_key}, or import the data as a new dataset.")


def round_schema(record: VersionRecord, rows: Sequence[Any]) -> pa.Schema:
    """The parent's schema widened by the extra_info fields the round's rows add."""
    return widen(schema_from_json(record.schema), _extra_info_schema(rows))


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
    kept = outcome.kept if isinstance(outcome.kept, RowBatch) else RowBatch(outcome.kept)
    for flt in filters:
        kept = flt.finish(kept)
    outcome.kept = kept
    outcome.rejected = RowBatch(outcome.rejected)
    outcome.records = {flt.lineage_key: record for flt in filters
                       if flt.lineage_key and (record := flt.lineage()) is not None}
    outcome.memos = {flt.lineage_key: memo for flt in filters
                     if flt.lineage_key and (memo := flt.memo()) is not None}
    return outcome


def index_params(cfg: DictConfig) -> LshParams | None:
    """How the round's new shard hashes its near-duplicate sidecar (None: detection off)."""
    near = cfg.round.near_duplicate
    return params_of(near) if near.enabled else None


def vector_params(cfg: DictConfig) -> VectorSettings | None:
    """How the round's new shard embeds its semantic sidecar (None: detection off)."""
    semantic = cfg.round.semantic_duplicate
    return vector_settings_of(semantic) if semantic.enabled else None
