"""The generation round as a real Prefect flow run, under a temporary Prefect server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.flows.generation_round import generation_round
from dyngen.store import Store, gc, verify
from tests.rows import verl_rows

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(4))
    return store


def config(store: Store, name: str = "AddNewRows", **datagen: Any) -> dict[str, Any]:
    return {
        "store": {"root": str(store.root)},
        "data": {"filter_overlong_prompts": False,
                 "datagen": {"path": "pkg://tests.flows.gens", "name": name, **datagen}},
        "round": {"retries": 0, "retry_delay_seconds": 0},
    }


def indices(ds) -> list[int]:
    return [e["index"] for e in ds["extra_info"]]


def artifacts_of(flow_run_id: str) -> dict[str, Any]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return {a.key: a for a in found}


def test_round_commits_the_expected_rows_with_lineage_everywhere(store: Store) -> None:
    trigger = {"event_id": "evt-1", "step": 12, "metrics": {"score/mean": 0.75}}
    state = generation_round("ds", config(store, n=3), trigger, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert (result["version"], result["parent"], result["created"]) == (1, 0, True)

    head = store.head("ds")
    assert indices(store.load("ds")) == [0, 1, 2, 3, 100, 101, 102]
    assert store.load("ds")["_dyngen_version"][4:] == [1, 1, 1]
    lin = head.lineage
    assert lin["generator"]["class"] == "tests.flows.gens.AddNewRows"
    assert len(lin["generator"]["config_hash"]) == 64
    assert lin["trigger"] == {"event_id": "evt-1", "step": 12,
                              "metrics": {"score/mean": 0.75}, "rollouts": None}
    assert lin["counts"] == {"generated": 4, "kept": 3, "rejected": {"duplicate": 1}}
    assert set(lin["timings"]) == {"load", "generate", "filter", "concat"}
    assert head.idempotency_key == "event:evt-1"
    assert store.load_rejected("ds")["reason"] == ["duplicate"]

    flow_run_id = lin["flow_run_id"]
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    assert run.name == "ds-v1"
    assert "dataset:ds" in run.tags
    arts = artifacts_of(flow_run_id)
    assert set(arts) == {"dyngen-ds-round", "dyngen-ds-history"}
    md = arts["dyngen-ds-round"].data
    assert "v0 → v1" in md and "duplicate: 1" in md and "evt-1" in md and "| 12 |" in md
    table = arts["dyngen-ds-history"].data
    table = json.loads(table) if isinstance(table, str) else table
    assert [r["version"] for r in table] == [0, 1]

    out = CliRunner().invoke(app, ["--root", str(store.root), "log", "ds"])
    assert out.exit_code == 0, out.output
    assert "AddNewRows" in out.output and "step 12" in out.output
    assert verify(store, "ds") == []


def test_new_extra_info_fields_from_a_generator_are_committed_per_row(store: Store) -> None:
    state = generation_round("ds", config(store, name="AddsProvenance"), {"step": 1},
                             return_state=True)
    assert state.is_completed(), state.message
    extras = store.load("ds")["extra_info"]
    assert [(e["index"], e["seed_index"], e["model"]) for e in extras] == [
        (0, None, None), (1, None, None), (2, None, None), (3, None, None),
        (700, 0, "tiny"), (701, 1, "tiny")]
    rejected = store.load_rejected("ds")
    assert rejected["reason"] == ["schema"] and "surprise" in rejected["detail"][0]
    assert verify(store, "ds") == []


def test_generator_gets_the_round_context(store: Store) -> None:
    generation_round("ds", config(store, "UsesContext"), {"step": 7})
    assert store.load("ds")[-1]["data_source"] == "step-7"
    assert store.head("ds").idempotency_key == "ds:step:7"


def test_a_generator_failing_once_succeeds_through_task_retries(store: Store,
                                                                  tmp_path: Path) -> None:
    cfg = config(store, "FlakyOnce", marker=str(tmp_path / "calls"))
    cfg["round"]["retries"] = 2
    state = generation_round("ds", cfg, {"step": 1}, return_state=True)
    assert state.is_completed(), state.message
    assert (tmp_path / "calls").read_text() == "2"
    assert store.head("ds").version == 1
    assert indices(store.load("ds"))[-1] == 200


def test_a_generator_that_always_raises_fails_the_run_and_commits_nothing(store: Store) -> None:
    cfg = config(store, "AlwaysFails")
    cfg["round"]["retries"] = 1
    state = generation_round("ds", cfg, {"step": 1}, return_state=True)
    assert state.is_failed()
    with pytest.raises(RuntimeError, match="proposer crashed"):
        state.result()
    assert store.head("ds").version == 0
    assert gc(store, "ds", grace_seconds=0) == []
    assert verify(store, "ds") == []


def test_mock_generator_commits_a_version_with_one_duplicate_rejected(store: Store) -> None:
    cfg = config(store)
    cfg["data"]["datagen"] = {"path": "pkg://dyngen.generators.base", "name": "MockDataGenerator"}
    result = generation_round("ds", cfg)
    assert (result["version"], result["rows"]) == (1, 4)
    assert result["counts"] == {"generated": 1, "kept": 0, "rejected": {"duplicate": 1}}
    rejected = store.load_rejected("ds")
    assert rejected["reason"] == ["duplicate"]
    assert json.loads(rejected[0]["row"])["extra_info"]["index"] == 0


def test_dedup_reads_the_prompt_column_the_dataset_was_imported_with(tmp_path: Path) -> None:
    from dyngen.trainers.verl_format import import_files

    rows = [{("question" if k == "prompt" else k): v for k, v in r.items()}
            for r in verl_rows(3)]
    src = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(src))
    store = Store(tmp_path / "store")
    import_files(store, "q", [str(src)], prompt_key="question")
    cfg = config(store)
    cfg["data"].update(prompt_key="question",
                       datagen={"path": "pkg://dyngen.generators.base",
                               "name": "MockDataGenerator"})
    result = generation_round("q", cfg)
    assert result["counts"] == {"generated": 1, "kept": 0, "rejected": {"duplicate": 1}}
    cfg["data"]["prompt_key"] = "prompt"
    state = generation_round("q", cfg, return_state=True)
    assert state.is_failed()
    assert "column 'question' (set when it was created); data.prompt_key is 'prompt'" in (
        state.message)


QUARANTINED = {
    "missing_column": "reward_model must be a dict",
    "wrong_types": "data_source must be a string",
    "plain_string_prompt": "plain string",
    "empty_messages": "non-empty list",
    "non_string_role": "role must be",
    "nan_ground_truth": "finite",
    "huge_prompt": "max_prompt_length",
}


@pytest.mark.parametrize("case", QUARANTINED)
def test_bad_rows_are_quarantined_with_a_reason_and_good_rows_kept(
    store: Store, case: str, qwen_tokenizer_dir: str
) -> None:
    cfg = config(store, "BadOutput", case=case)
    cfg["data"].update(filter_overlong_prompts=True, tokenizer=qwen_tokenizer_dir)
    result = generation_round("ds", cfg, {"step": 5})
    assert result["counts"]["generated"] == 2 and result["counts"]["kept"] == 1
    assert indices(store.load("ds"))[-1] == 301
    rejected = store.load_rejected("ds")
    assert rejected.num_rows == 1
    assert QUARANTINED[case] in rejected[0]["detail"]
    expected_reason = "overlong_prompt" if case == "huge_prompt" else "schema"
    assert rejected[0]["reason"] == expected_reason


@pytest.mark.parametrize("case,wording", [("none", "returned None"),
                                          ("string", "returned a str"),
                                          ("dict_of_scalars", "returned a dict")])
def test_unusable_output_fails_the_round_naming_the_generator(store: Store, case: str,
                                                               wording: str) -> None:
    state = generation_round("ds", config(store, "BadOutput", case=case), return_state=True)
    assert state.is_failed()
    with pytest.raises(TypeError, match=f"generator BadOutput {wording}"):
        state.result()
    assert store.head("ds").version == 0
    assert gc(store, "ds", grace_seconds=0) == []


def test_same_idempotency_key_commits_nothing_new(store: Store) -> None:
    first = generation_round("ds", config(store), {"event_id": "e-9", "step": 3})
    again = generation_round("ds", config(store, start=900), {"event_id": "e-9", "step": 3})
    assert again == {**first, "created": False}
    assert store.head("ds").version == 1
    assert gc(store, "ds", grace_seconds=0) == []


@pytest.mark.parametrize("trigger,wording", [
    ({"step": "three"}, "step must be a non-negative integer"),
    ({"step": 1, "surprise": True}, "unknown fields"),
    ({"metrics": {"score": "high"}}, "must be a finite number"),
    ({"event_id": "x" * 500}, "event_id must be a string"),
])
def test_malformed_triggers_fail_clearly_and_touch_nothing(store: Store, trigger: dict,
                                                           wording: str) -> None:
    state = generation_round("ds", config(store), trigger, return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match=wording):
        state.result()
    assert store.head("ds").version == 0


def test_a_bad_dataset_name_fails_before_touching_disk(store: Store, tmp_path: Path) -> None:
    state = generation_round("../escape", config(store), return_state=True)
    assert state.is_failed()
    assert not (tmp_path / "escape").exists()


def asset_events(key: str, timeout: float = 20.0) -> list[Any]:
    import time

    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all()
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            events = client.read_events(filter=EventFilter(
                event=EventNameFilter(prefix=["prefect.asset.materialization."]),
                resource=EventResourceFilter(id=[key])), limit=50).events
            if events or time.monotonic() > deadline:
                return events
            time.sleep(0.25)


def test_each_round_materializes_its_version_asset_depending_on_the_parent(
    store: Store,
) -> None:
    # A dataset name no other test uses: asset events live on the shared server.
    store.create("asset-lineage", verl_rows(4))
    generation_round("asset-lineage", config(store, n=1), {"step": 1})
    generation_round("asset-lineage", config(store, start=300, n=1), {"step": 2})
    events = asset_events("dyngen://asset-lineage/v2")
    assert len(events) == 1, "expected one materialization event for dyngen://asset-lineage/v2"
    event = events[0]
    assert event.event == "prefect.asset.materialization.succeeded"
    assert event.payload["rows"] == 6
    related = {r.id for r in event.related}
    assert "dyngen://asset-lineage/v1" in related


def test_cli_round_runs_a_flow_and_prints_the_commit(store: Store, tmp_path: Path) -> None:
    cfg_file = tmp_path / "dyngen.yaml"
    cfg_file.write_text("data:\n  filter_overlong_prompts: false\n  datagen:\n"
                        "    path: pkg://tests.flows.gens\n    name: AddNewRows\n")
    args = ["--root", str(store.root), "round", "ds", "--config", str(cfg_file),
            "+data.datagen.n=2", "--step", "4"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "committed 'ds' version 1 (parent 0): 6 rows, kept 2 of 3" in out.output
    again = CliRunner().invoke(app, args)
    assert "already committed as version 1" in again.output
    (tmp_path / "batch.jsonl").write_text('{"prompt": "What is 1 + 1?", "score": 0.0}\n')
    with_rollouts = CliRunner().invoke(app, [*args[:6], "--step", "5", "--rollouts",
                                             str(tmp_path / "batch.jsonl")])
    assert with_rollouts.exit_code == 0, with_rollouts.output
    assert store.head("ds").lineage["trigger"]["rollouts"] == str(tmp_path / "batch.jsonl")
    bad = CliRunner().invoke(app, [*args[:6], "data.max_prompt_length=abc"])
    assert bad.exit_code == 2 and "data.max_prompt_length: expected an integer" in bad.output


def task_runs(flow_run_id: Any, names: set[str], timeout: float = 60.0) -> list[Any]:
    """The flow run's task runs once those named (less their suffix) are final: task runs
    reach the server as events, a moment after the flow run ends."""
    import time

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[flow_run_id])))
            final = {r.name.rsplit("-", 1)[0] for r in runs if r.state and r.state.is_final()}
            if names <= final or time.monotonic() > deadline:
                return runs
            time.sleep(0.5)  # polling the server, as tests/flows/test_round_rollouts.py does


def test_the_rounds_graph_is_its_stages_in_order_and_each_says_what_it_did(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """In Prefect's graph each stage is fed by the one before it and by nothing else (the UI
    draws an edge per task input that is another run's result), and each logs one line."""
    import logging

    caplog.set_level(logging.INFO, logger="prefect")  # run loggers are under it
    store.write_batch_end("ds", "run-a", 7, {"score": 0.5})
    state = generation_round("ds", config(store, n=3), {"event_id": "e7", "step": 7,
                                                        "run": "run-a"}, return_state=True)
    assert state.is_completed(), state.message
    runs = task_runs(state.state_details.flow_run_id, {"load", "generate", "filter", "concat",
                                                        "version", "publish-lineage"})
    stage_of = {run.id: run.name.rsplit("-", 1)[0] for run in runs}
    fed_by = {stage_of[run.id]: sorted({stage_of[i.id] for inputs in run.task_inputs.values()
                                        for i in inputs if getattr(i, "id", None) in stage_of})
              for run in runs}
    assert {s: fed_by[s] for s in ("load", "generate", "filter", "concat", "version")} == {
        "load": [], "generate": ["load"], "filter": ["generate"], "concat": ["filter"],
        "version": ["concat"]}
    assert fed_by["publish-lineage"] == ["version"]
    lines = [r.getMessage() for r in caplog.records]
    said = {stage: [ln for ln in lines if ln.startswith(f"{stage}: ")]
            for stage in ("load", "generate", "filter", "concat", "version")}
    assert said == {
        "load": ["load: ds v0, 4 rows in; 1 batch end(s) pending (run-a step 7)"],
        "generate": ["generate: AddNewRows made 4 new rows from 4 rows in"],
        "filter": ["filter: 4 rows in, 3 kept, 1 rejected {'duplicate': 1}"],
        "concat": ["concat: 3 kept rows in, 3 rows out in 1 new shard(s), 1 rejected rows "
                   "quarantined; none visible until committed"],
        "version": ["version: committed ds v1 (parent v0), 7 rows out"]}
