"""Which rows an Augmenter augments (`data.datagen.select`), in the order it tries them.

  failed  the rows the trigger's rollouts scored lowest: rollouts of one prompt are
          averaged, lowest mean first (ties to the earlier line), those at or above
          `failed_below` left out; each is the newest row of the dataset asking its
          question. A round without rollouts selects nothing, and says so.
  band    the rows whose last measured solve rate (extra_info.solve_rate, written by the
          round's solve-rate filter) lies in `band`, lowest rate first, then newest first.
  random  rows drawn at random (seeded by seed, dataset and round).
A round of P partitions takes every P-th of them in each partition.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dyngen.generators.questions import BATCH_ROWS, rows_asking
from dyngen.llm import seed_int
from dyngen.round.context import RoundContext
from dyngen.text import question_of

SELECTIONS = ("failed", "band", "random")
# Sources tried per row wanted, for `band` and `random`: some skip, most do not.
TRIES_PER_ROW = 4


@dataclass(frozen=True)
class Source:
    """A row to augment: its position in the version read, and the score it was chosen by."""

    index: int
    score: float | None = None


def select_sources(cfg: Mapping[str, Any], rows: Any, context: RoundContext | None
                   ) -> tuple[list[Source], dict[str, Any]]:
    """This partition's sources in order, and what the selection saw (for the stats)."""
    how = cfg["select"]
    if how == "failed":
        sources, seen = failed(rows, context, float(cfg["failed_below"]))
    elif how == "band":
        sources, seen = in_band(rows, tuple(cfg["band"]))
    else:
        count = min(len(rows), int(cfg["rows_per_round"]) * TRIES_PER_ROW)
        round_no = context.round_seed if context is not None else 0
        dataset = context.dataset if context is not None else ""
        rng = random.Random(seed_int(cfg["seed"], dataset, round_no, "select"))
        sources, seen = [Source(i) for i in rng.sample(range(len(rows)), count)], {}
    if context is not None and context.partitions > 1:
        sources = sources[context.partition::context.partitions]
    return sources, {"how": how, **seen}


def failed(rows: Any, context: RoundContext | None, below: float
           ) -> tuple[list[Source], dict[str, Any]]:
    """The dataset's rows of the prompts the batch's rollouts scored lowest (see above)."""
    rollouts = context.read_rollouts() if context is not None else []
    if not rollouts:
        return [], {"rollouts": 0, "note": "the trigger names no rollouts: nothing failed"}
    groups: dict[str, tuple[int, list[float]]] = {}
    for r in rollouts:
        question = question_of(r.prompt)
        if question:
            groups.setdefault(question, (r.line, []))[1].append(r.score)
    means = {q: sum(s) / len(s) for q, (_, s) in groups.items()}
    wanted = {q for q, m in means.items() if m < below}
    found: dict[str, int] = {}
    if wanted and "prompt" in rows.column_names:
        for position, row in rows_asking(rows, wanted, ["prompt"]):
            question = question_of(row["prompt"])
            if question in wanted:
                found[question] = position  # in order: the newest row asking it wins
    ranked = sorted(found, key=lambda q: (means[q], groups[q][0]))
    return [Source(found[q], round(means[q], 4)) for q in ranked], {
        "rollouts": len(rollouts), "prompts": len(groups), "failed": len(wanted),
        "not_in_dataset": len(wanted) - len(found)}


def in_band(rows: Any, band: tuple[float, float]) -> tuple[list[Source], dict[str, Any]]:
    """The rows whose extra_info.solve_rate passed / samples lies in `band` (see above)."""
    measured: list[tuple[float, int]] = []
    if "extra_info" in rows.column_names:
        start = 0
        for batch in rows.select_columns(["extra_info"]).with_format("arrow").iter(
                batch_size=BATCH_ROWS):
            measured += _rates(batch["extra_info"].combine_chunks(), start)
            start += batch.num_rows
    inside = [(rate, i) for rate, i in measured if band[0] <= rate <= band[1]]
    inside.sort(key=lambda x: (x[0], -x[1]))
    return [Source(i, round(rate, 4)) for rate, i in inside], {
        "measured": len(measured), "in_band": len(inside), "band": list(band)}


def _rates(extra: pa.Array, start: int) -> list[tuple[float, int]]:
    """(solve rate, position) of each row of an extra_info column that has one measured."""
    if not pa.types.is_struct(extra.type) or extra.type.get_field_index("solve_rate") < 0:
        return []
    rate = pc.struct_field(extra, "solve_rate")  # null where extra_info itself is
    if not pa.types.is_struct(rate.type) or not all(
            rate.type.get_field_index(k) >= 0 for k in ("passed", "samples")):
        return []
    passed = pc.cast(pc.struct_field(rate, "passed"), pa.float64()).to_pylist()
    samples = pc.cast(pc.struct_field(rate, "samples"), pa.float64()).to_pylist()
    valid = pc.is_valid(rate).to_pylist()
    return [(p / n, start + i) for i, (p, n, ok) in enumerate(zip(passed, samples, valid,
                                                                strict=True))
            if ok and p is not None and n]
