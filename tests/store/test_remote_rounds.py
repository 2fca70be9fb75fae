"""A store on S3 (moto's server) used as a user would: a generation round, and the CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.config import load_config
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.store import Store, verify
from dyngen.store.location import local_folder_for
from tests.rows import verl_rows
from tests.store.conftest import new_bucket, s3_options


@pytest.mark.usefixtures("prefect_server")
def test_a_partitioned_round_commits_once_on_s3(s3_endpoint: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from dyngen.flows.generation_round import generation_round

    monkeypatch.chdir(tmp_path)
    root = f"s3://{new_bucket(s3_endpoint)}/stores/main"
    store_cfg = {"root": root, "storage_options": s3_options(s3_endpoint),
                 "cache_dir": str(tmp_path / "cache")}
    Store.from_config(store_cfg).create("ds", verl_rows(3))
    config = {
        "store": store_cfg,
        "data": {"filter_overlong_prompts": False,
                 "datagen": {"path": "pkg://tests.flows.gens", "name": "AddNewRows",
                             "start": 100, "n": 2}},
        "round": {"retries": 0, "retry_delay_seconds": 0, "partitions": 2},
    }
    first = generation_round("ds", config, {"event_id": "s3-1"})
    again = generation_round("ds", config, {"event_id": "s3-1"})  # re-delivered
    assert (first["version"], first["created"]) == (1, True)
    assert (again["version"], again["created"]) == (1, False)
    fresh = Store.from_config(store_cfg)
    assert fresh.head_version("ds") == 1
    assert [e["index"] for e in fresh.load("ds")["extra_info"]] == [0, 1, 2, 100, 101]
    assert set(fresh.load_rejected("ds")["reason"]) == {"duplicate"}
    assert verify(fresh, "ds") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no local `s3:` folder


def test_the_cli_reads_and_checks_a_store_on_s3(s3_endpoint: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_ENDPOINT_URL": s3_endpoint, "AWS_DEFAULT_REGION": "us-east-1",
           "DYNGEN_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    root = f"s3://{new_bucket(s3_endpoint)}/store"
    with monkeypatch.context() as m:
        for name, value in env.items():
            m.setenv(name, value)
        Store(root).create("ds", verl_rows(2))
        Store(root).append("ds", verl_rows(1, start=2))
    runner = CliRunner(env=env)
    listed = runner.invoke(app, ["--root", root, "datasets"])
    assert listed.exit_code == 0, listed.output
    assert "ds" in listed.output and root in listed.output
    checked = runner.invoke(app, ["--root", root, "verify", "ds"])
    assert checked.exit_code == 0, checked.output
    missing = runner.invoke(app, ["--root", root, "verify", "nope"])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    log = runner.invoke(app, ["--root", root, "log", "ds"])
    assert log.exit_code == 0 and "append" in log.output, log.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no local `s3:` folder


def test_rollouts_of_a_url_store_go_to_a_local_folder(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    cfg = load_config(overrides=["store.root=s3://bucket/stores/main"])
    policy = RolloutsPolicy.from_config(cfg)
    folder = tmp_path / "data" / "dyngen" / "s3" / "bucket" / "stores" / "main" / "rollouts"
    assert policy.dirs == (str(folder),)
    assert local_folder_for("s3://bucket/stores/main") / "rollouts" == folder
    allowed = folder / "ds" / "run" / "step-1.jsonl"
    allowed.parent.mkdir(parents=True)
    allowed.write_text('{"prompt": "p", "score": 1}\n')
    assert policy.check(str(allowed)) == os.path.realpath(allowed)
