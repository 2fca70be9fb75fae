"""A round covers everything pending in its dataset's inbox, as real flow runs on a real store:
every batch end no version covers reaches the generator (its rollouts read from the store)
and is covered by the one version the round commits; a trigger naming a covered batch end
commits nothing; a round that loses the race to a version covering its batch ends ends as
covered, not failed; on S3 the rollouts come from the bucket."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.flows.generation_round import generation_round
from dyngen.store import Store, gc, verify
from tests.rows import verl_rows
from tests.store.conftest import new_bucket, s3_options

pytestmark = pytest.mark.usefixtures("prefect_server")

BIG = 20_000  # characters per prompt: two of them are over the inbox's inline bound (32 KiB)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(4))
    return store


def config(store_cfg: dict[str, Any] | str, seen: Path, name: str = "SeesBatchEnds",
           **datagen: Any) -> dict[str, Any]:
    root = store_cfg if isinstance(store_cfg, str) else store_cfg["root"]
    return {"store": {"root": store_cfg} if isinstance(store_cfg, str) else store_cfg,
            "data": {"filter_overlong_prompts": False,
                     "datagen": {"path": "pkg://tests.flows.inbox_gens", "name": name,
                                 "seen": str(seen), "root": root, **datagen}},
            "round": {"retries": 0, "retry_delay_seconds": 0}}


def rollouts(run: str, step: int, n: int = 2, pad: int = 0) -> list[dict[str, Any]]:
    return [{"prompt": f"{run} {step} #{i}" + "x" * pad, "score": i / 2} for i in range(n)]


def prompts(run: str, step: int, n: int = 2, pad: int = 0) -> list[str]:
    return [r["prompt"] for r in rollouts(run, step, n, pad)]


def said(caplog: pytest.LogCaptureFixture) -> str:
    """What the rounds logged (their run logger's lines reach the test's log capture)."""
    return "\n".join(r.getMessage() for r in caplog.records)


def test_a_round_covers_every_pending_batch_end_once(store: Store, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="prefect")  # run loggers are under it
    for step in (3, 4, 5):
        store.write_batch_end("ds", "run-a", step, {"score": step / 10},
                              rollouts("run-a", step, pad=BIG if step == 5 else 0))
    store.write_batch_end("ds", "run-b", 1, {"score": 0.9}, rollouts("run-b", 1, n=1))
    assert store.batch_end("ds", "run-a", 5).rollouts.path is not None  # a file in the store
    seen = tmp_path / "seen.json"
    trigger = {"event_id": "e5", "run": "run-a", "step": 5}
    state = generation_round("ds", config(str(store.root), seen), trigger, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert (result["version"], result["created"]) == (1, True)

    head = store.head("ds")
    assert head.covers == (("run-a", 3), ("run-a", 4), ("run-a", 5), ("run-b", 1))
    assert head.lineage["batch_ends"] == {"run-a": [3, 4, 5], "run-b": [1]}
    assert head.lineage["trigger"]["run"] == "run-a"
    assert store.pending("ds") == []
    saw = json.loads(seen.read_text())
    assert [(b["run"], b["step"]) for b in saw["batch_ends"]] == [
        ("run-a", 3), ("run-a", 4), ("run-a", 5), ("run-b", 1)]
    # The trigger's own batch end is the one the round goes by, its metrics as stored.
    assert (saw["run"], saw["step"], saw["metrics"]) == ("run-a", 5, {"score": 0.5})
    assert saw["read_rollouts"] == [*prompts("run-a", 3), *prompts("run-a", 4),
                                    *prompts("run-a", 5, pad=BIG), *prompts("run-b", 1, n=1)]
    assert all(b["rollouts_error"] is None for b in saw["batch_ends"])

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[head.lineage["flow_run_id"]])))
    note = next(a.data for a in arts if a.key == "dyngen-ds-round")
    assert "| covers | run-a steps 3–5 · run-b step 1 |" in note
    cli = CliRunner(env={"COLUMNS": "200"})
    log = cli.invoke(app, ["--root", str(store.root), "log", "ds"])
    assert log.exit_code == 0 and "covers run-a steps 3–5 · run-b step 1" in log.output, log.output
    show = cli.invoke(app, ["--root", str(store.root), "show", "ds"])
    assert "ds v1 covers run-a steps 3–5 · run-b step 1" in show.output, show.output

    seen.unlink()
    again = generation_round("ds", config(str(store.root), seen), trigger)  # re-delivered
    assert (again["version"], again["created"]) == (1, False)
    late = generation_round("ds", config(str(store.root), seen),
                            {"event_id": "e4-resent", "run": "run-a", "step": 4},
                            return_state=True)
    assert late.is_completed(), late.message
    assert (late.result()["version"], late.result()["created"]) == (1, False)
    assert "batch end run run-a step 4 is covered by version 1" in said(caplog)
    assert not seen.exists(), "the generator ran"
    assert store.head_version("ds") == 1
    assert verify(store, "ds") == []


def test_a_round_whose_batch_ends_are_covered_meanwhile_commits_nothing(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="prefect")  # run loggers are under it
    for step in (1, 2):
        store.write_batch_end("ds", "run-a", step, {"score": 0.5}, rollouts("run-a", step))
    state = generation_round("ds", config(str(store.root), tmp_path / "seen.json",
                                          "CoveredMeanwhile"),
                             {"event_id": "r2", "run": "run-a", "step": 2}, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert (result["version"], result["created"]) == (1, False)
    head = store.head("ds")  # the rival's version, alone
    assert head.version == 1 and head.covers == (("run-a", 1), ("run-a", 2))
    assert [e["index"] for e in store.load("ds")["extra_info"]][4:] == [900]
    assert "(run-a steps 1–2) were covered meanwhile, by version 1" in said(caplog)
    assert gc(store, "ds", grace_seconds=0) == []  # the losing round's shards are gone
    assert verify(store, "ds") == []

    # A round no event started covers what arrived since, and goes by its newest step.
    store.write_batch_end("ds", "run-a", 3, {"score": 0.7})
    seen = tmp_path / "seen.json"
    done = generation_round("ds", config(str(store.root), seen))
    assert (done["version"], done["created"]) == (2, True)
    saw = json.loads(seen.read_text())
    assert (saw["step"], saw["trigger_step"], saw["metrics"]) == (3, None, {"score": 0.7})
    assert store.head("ds").covers == (("run-a", 3),)
    assert store.pending("ds") == []


def test_a_round_on_s3_reads_the_rollouts_from_the_bucket(
        s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store_cfg = {"root": f"s3://{new_bucket(s3_endpoint)}/stores/main",
                 "storage_options": s3_options(s3_endpoint), "cache_dir": str(tmp_path / "cache")}
    writer = Store.from_config(store_cfg)  # the trainer's side, on another host
    writer.create("ds", verl_rows(3))
    writer.write_batch_end("ds", "run-s3", 1, {"score": 0.1}, rollouts("run-s3", 1, pad=BIG))
    writer.write_batch_end("ds", "run-s3", 2, {"score": 0.2}, rollouts("run-s3", 2))
    assert writer.batch_end("ds", "run-s3", 1).rollouts.path is not None
    seen = tmp_path / "seen.json"
    result = generation_round("ds", config(store_cfg, seen), {"run": "run-s3", "step": 2})
    assert (result["version"], result["created"]) == (1, True)
    saw = json.loads(seen.read_text())
    assert saw["read_rollouts"] == [*prompts("run-s3", 1, pad=BIG), *prompts("run-s3", 2)]
    fresh = Store.from_config(store_cfg)
    assert fresh.head("ds").covers == (("run-s3", 1), ("run-s3", 2))
    assert fresh.head("ds").idempotency_key == "ds:run:run-s3:step:2"
    assert fresh.pending("ds") == []
    assert verify(fresh, "ds") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "seen.json"]


def test_a_catch_up_round_covers_what_is_pending_and_with_nothing_pending_commits_nothing(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="prefect")
    seen = tmp_path / "seen.json"
    catch_up = {"catch_up": True}
    nothing = generation_round("ds", config(str(store.root), seen), catch_up)
    assert (nothing["version"], nothing["created"]) == (0, False)
    assert not seen.exists(), "the generator ran with nothing pending"
    assert "nothing pending in ds's inbox at version 0" in said(caplog)

    # Batch ends whose wake-up events were lost: the catch-up round covers them all.
    for step in (1, 2):
        store.write_batch_end("ds", "run-a", step, {"score": step / 4})
    covered = generation_round("ds", config(str(store.root), seen), catch_up)
    assert (covered["version"], covered["created"]) == (1, True)
    assert store.head("ds").covers == (("run-a", 1), ("run-a", 2))
    assert store.pending("ds") == []
    assert generation_round("ds", config(str(store.root), seen), catch_up)["created"] is False
    assert store.head_version("ds") == 1 and verify(store, "ds") == []


def test_a_new_training_run_on_a_grown_dataset_gets_its_rounds(store: Store,
                                                                tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    for step in (1, 2, 3):  # the first run grew the dataset, a version per step
        store.write_batch_end("ds", "first", step, {"score": 0.5})
        generation_round("ds", config(str(store.root), seen),
                         {"event_id": f"first-{step}", "run": "first", "step": step})
    assert store.head_version("ds") == 3
    # A second run starts over at step 1: its steps are its own, not the first run's.
    store.write_batch_end("ds", "second", 1, {"score": 0.1})
    result = generation_round("ds", config(str(store.root), seen),
                              {"event_id": "second-1", "run": "second", "step": 1})
    assert (result["version"], result["created"]) == (4, True)
    assert store.head("ds").covers == (("second", 1),)
    assert json.loads(seen.read_text())["run"] == "second"


def test_a_round_that_loses_to_a_rival_while_its_own_batch_end_is_pending_runs_again(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The rival loaded when only step 1 was written and commits first; this round, started
    # by step 2's event, covered steps 1-2: it loses, loads again and covers step 2.
    caplog.set_level(logging.INFO, logger="prefect")
    for step in (1, 2):
        store.write_batch_end("ds", "run-a", step, {"score": 0.5})
    result = generation_round("ds", config(str(store.root), tmp_path / "seen.json",
                                           "FirstCoveredMeanwhile"),
                              {"event_id": "e2", "run": "run-a", "step": 2})
    assert (result["version"], result["created"]) == (2, True)
    assert [r.covers for r in store.history("ds")[1:]] == [(("run-a", 1),), (("run-a", 2),)]
    assert "version 1 covered some of this round's batch ends first; run-a step 2 still " \
           "pending: loading again" in said(caplog)
    assert store.pending("ds") == [] and verify(store, "ds") == []
    assert gc(store, "ds", grace_seconds=0) == []  # the lost attempt's shards are gone


def test_a_wake_up_whose_batch_end_is_not_in_the_store_yet_commits_nothing(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The trainer's store write was queued locally (the store was away); its event came.
    caplog.set_level(logging.INFO, logger="prefect")
    seen = tmp_path / "seen.json"
    early = generation_round("ds", config(str(store.root), seen),
                             {"event_id": "e1", "run": "run-a", "step": 1})
    assert (early["version"], early["created"]) == (0, False) and not seen.exists()
    assert "nothing pending in ds's inbox at version 0" in said(caplog)
    # Once written, the next round covers it.
    store.write_batch_end("ds", "run-a", 1, {"score": 0.5})
    later = generation_round("ds", config(str(store.root), seen), {"catch_up": True})
    assert later["created"] is True and store.head("ds").covers == (("run-a", 1),)
