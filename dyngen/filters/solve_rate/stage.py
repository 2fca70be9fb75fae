"""The solve-rate filter: keep a row only if the live policy passes it within the band.

Each row is graded (grading.py) and its pass rate `passed / samples` compared with `keep`
= [low, high], both ends kept. Above the band: `too_easy`; below: `too_hard`, each with the
measured rate (`7/8 passed`); a request that failed after its retries: `model_error`. Kept
rows carry `extra_info.solve_rate = {passed, samples, model, version}`: `model` is the name
the policy was asked by, `version` the model its server said answered (vLLM names the
weights it serves), else that name. `policy_step` is the training step of the weights that
answered, where it is known: an in-process policy loaded from a trainer's checkpoint, or a
served model whose name holds `checkpoint-N` / `global_step_N` (dyngen.llm.checkpoints).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from dyngen.errors import FilterError
from dyngen.filters.base import Answer, RowFilter
from dyngen.filters.solve_rate.grading import Grade, band_verdict, grade_rows
from dyngen.filters.solve_rate.lineage import stage_lineage
from dyngen.filters.solve_rate.rewards import RewardChooser
from dyngen.llm import ChatModel, chat_model
from dyngen.llm.checkpoints import step_in_name
from dyngen.rows import Row, RowBatch

SECTION = "round.solve_rate"
FIELD = "solve_rate"  # in extra_info
RECORD_TYPE = pa.struct([("passed", pa.int64()), ("samples", pa.int64()),
                         ("model", pa.string()), ("version", pa.string())])
# The keys of round.solve_rate that choose and tune the policy's client (dyngen.llm).
MODEL_KEYS = ("endpoint", "model_name", "api_key_env", "model_path", "gguf_file",
              "max_concurrency", "max_retries", "request_timeout_seconds")


def policy_model(settings: Mapping[str, Any]) -> ChatModel:
    """The policy the settings name: served at `endpoint`, else in-process at `model_path`."""
    return chat_model({**{k: settings.get(k) for k in MODEL_KEYS}, "config_section": SECTION})


class SolveRateFilter(RowFilter):
    """Drop rows the policy always or never solves; record the rate on the rows it keeps.

    Given `grades`, it judges by them; given a `grader`, it has it grade the rows (the
    round's partitions: each share's {grades, usage, model, n_in_one_request, seconds});
    otherwise it asks the policy itself, through `model` or the one the settings name.
    `finish` finds each kept row's grade by its prompt and extra_info.index; `lineage` is
    what the round records of the stage.
    """

    reason = "solve_rate"
    lineage_key = "solve_rate"

    def __init__(self, settings: Mapping[str, Any], prompt_key: str = "prompt", *,
                 model: ChatModel | None = None, grades: Sequence[Grade] | None = None,
                 grader: Callable[[RowBatch], list[dict[str, Any]]] | None = None,
                 salt: Any = ()) -> None:
        super().__init__(settings)
        self.settings, self.prompt_key, self.salt = dict(settings), prompt_key, salt
        self.model, self.given = model, None if grades is None else list(grades)
        self.grader = grader
        self.rewards = RewardChooser(_reward(settings, "path"), _reward(settings, "name"))
        self.grades: list[Grade] = []  # every row judged, in order
        self.model_name = model.name if model is not None else str(
            settings.get("model_name") or "")
        self.usage: dict[str, Any] = {}  # what asking cost (ModelUsage), when it asked itself
        self.n_in_one_request: bool | None = None
        self.policy_step: int | None = None  # the step of the weights that answered
        self._kept: dict[str, list[Grade]] = {}  # kept rows' grades, by the row's fingerprint
        self.shares: list[dict[str, Any]] = []  # what each share's grading cost
        self.labels: dict[str, str] = {}  # the reward function of each data source
        # An earlier pass of this round (round.top_up): its grades by fingerprint, its shares.
        self._known: dict[str, Grade] = {}
        self._earlier_shares: list[dict[str, Any]] = []
        self.seconds = 0.0

    def check(self, rows: Sequence[Row]) -> list[Answer]:
        started = time.perf_counter()
        if self.given is not None:
            grades = self.given
        elif self.grader is not None:
            grades = self._graded(rows)
        else:
            grades = self.measure(rows)
            self.shares = [{"usage": self.usage, "model": self.model_name,
                            "n_in_one_request": self.n_in_one_request,
                            "policy_step": self.policy_step}]
        self.seconds += time.perf_counter() - started
        if len(grades) != len(rows):
            raise FilterError(f"SolveRateFilter was given {len(grades)} grades for "
                              f"{len(rows)} rows; expected one per row.")
        verdicts = [band_verdict(g, self.settings["keep"]) for g in grades]
        self.grades += grades
        for row, grade, verdict in zip(rows, grades, verdicts, strict=True):
            if verdict is None:
                self._kept.setdefault(self._fingerprint(row), []).append(grade)
        return verdicts

    def _graded(self, rows: Sequence[Row]) -> list[Grade]:
        """Each row's grade from the grader's shares (every data source graded, first); a
        row this round's earlier pass graded keeps its grade and is not asked again."""
        batch = rows if isinstance(rows, RowBatch) else RowBatch(list(rows))
        listed = batch.to_list()
        self.labels = self.rewards.check(listed)  # before any request
        prints = [self._fingerprint(row) for row in listed]
        new = [row for row, fp in zip(listed, prints, strict=True) if fp not in self._known]
        asked = self.grader(RowBatch(new)) if new else []
        self.shares = self._earlier_shares + asked
        fresh = [g for share in asked for g in share["grades"]]
        if len(fresh) != len(new):
            return fresh  # `check` refuses grades that are not one per row
        queue = iter(fresh)
        grades = [self._known[fp] if fp in self._known else next(queue) for fp in prints]
        self._known.update(zip(prints, grades, strict=True))
        self.model_name = next((s["model"] for s in self.shares if s.get("model")),
                               self.model_name)
        return grades

    def memo(self) -> dict[str, Any] | None:
        """Every row graded so far, by fingerprint, and what asking cost (the shares)."""
        return {"grades": dict(self._known), "shares": list(self.shares)} \
            if self.grader is not None else None

    def recall(self, memo: Any) -> None:
        self._known = dict(memo["grades"])
        self._earlier_shares = list(memo["shares"])

    def lineage(self) -> dict[str, Any]:
        """The `solve_rate` entry of the round's lineage: the policy, band, cost, histogram."""
        out = stage_lineage(self.settings, self.grades, self.shares, self.seconds, self.labels)
        if self.grader is not None:
            out["share_seconds"] = [share.get("seconds", 0.0) for share in self.shares]
        return out

    def measure(self, rows: Sequence[Row]) -> list[Grade]:
        """Ask the policy: each row's grade (the model is opened and closed here if ours)."""
        listed = rows.to_list() if isinstance(rows, RowBatch) else list(rows)
        self.labels = self.rewards.check(listed)  # refused before the model is even reached
        if not listed:
            return []
        own = self.model is None
        model = self.model or policy_model(self.settings)
        try:
            model.check()
            self.model_name = model.name
            grades = grade_rows(model, listed, self.prompt_key, self.settings, self.rewards,
                                self.salt)
            self.policy_step = answering_step(model, grades)
            return grades
        finally:
            if own:
                self.usage = model.usage.as_dict()
                self.n_in_one_request = getattr(model, "n_in_one_request", None)
                model.close()

    def finish(self, kept: RowBatch) -> RowBatch:
        """The kept rows, each it graded with extra_info.solve_rate set (others as they are)."""
        waiting = {k: list(v) for k, v in self._kept.items()}
        records = []
        for row in kept:
            queue = waiting.get(self._fingerprint(row))
            records.append(self.record(queue.pop(0)) if queue else None)
        return with_records(kept, records)

    def _fingerprint(self, row: Row) -> str:
        """Which row this is, in any form the chain hands it on in (conformed or not)."""
        prompt = row.get(self.prompt_key)
        turns = [[m.get("role"), m.get("content")] for m in prompt] \
            if isinstance(prompt, list) else prompt
        info = row.get("extra_info")
        index = info.get("index") if isinstance(info, Mapping) else None
        return json.dumps([turns, index], default=str)

    def record(self, grade: Grade) -> dict[str, Any]:
        """What a kept row's extra_info.solve_rate holds."""
        return {"passed": grade.passed, "samples": grade.samples, "model": self.model_name,
                "version": grade.answered_by or self.model_name}


def answering_step(model: ChatModel, grades: Sequence[Grade]) -> int | None:
    """The training step of the weights that answered: the model's own (an in-process
    checkpoint), else the oldest step the served model's answered names hold."""
    if model.policy_step is not None:
        return model.policy_step
    steps = [s for g in grades if (s := step_in_name(g.answered_by)) is not None]
    return min(steps) if steps else None


def with_records(kept: RowBatch, records: Sequence[dict[str, Any] | None]) -> RowBatch:
    """`kept` with extra_info.solve_rate set to `records`, one per row (None: left as is)."""
    if all(r is None for r in records):
        return kept
    table = kept.table
    if table is None:
        rows = kept.to_list()
        for row, rec in zip(rows, records, strict=True):
            if rec is not None:
                row["extra_info"] = {**(row.get("extra_info") or {}), FIELD: rec}
        return RowBatch(rows)
    if "extra_info" not in table.column_names:
        raise FilterError("rows to record a solve rate on have no extra_info column")
    info = table.column("extra_info").combine_chunks()
    if isinstance(info, pa.ChunkedArray):  # an empty table
        info = pa.array([], info.type)
    names = [info.type.field(i).name for i in range(info.type.num_fields)]
    fields = [info.type.field(i) for i in range(info.type.num_fields)]
    children = [info.field(i) for i in range(info.type.num_fields)]
    if FIELD in names:
        at = names.index(FIELD)
        old = info.field(at).to_pylist()
        added = pa.array([r if r is not None else o for r, o in zip(records, old, strict=True)],
                         type=RECORD_TYPE)
        fields[at], children[at] = pa.field(FIELD, RECORD_TYPE), added
    else:
        added = pa.array(records, type=RECORD_TYPE)
        fields.append(pa.field(FIELD, RECORD_TYPE))
        children.append(added)
    merged = pa.StructArray.from_arrays(children, fields=fields)
    return RowBatch(table.set_column(table.column_names.index("extra_info"), "extra_info",
                                     merged))


def _reward(settings: Mapping[str, Any], key: str) -> Any:
    reward = settings.get("reward") or {}
    return reward.get(key) if key == "path" else reward.get(key) or "compute_score"
