"""Credentials in store.storage_options never reach Prefect's records, and a round that
uses them still commits (on S3: moto's server, which takes any credentials)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.events.filters import EventFilter, EventOccurredFilter
from prefect.flow_engine import run_flow

from dyngen.config.secrets import REDACTED
from dyngen.errors import ConfigError
from dyngen.flows.generation_round import generation_round
from dyngen.runtime.serve import round_deployment
from dyngen.store import Store
from tests.rows import verl_rows
from tests.store.conftest import new_bucket

pytestmark = pytest.mark.usefixtures("prefect_server")

KEY, SECRET, TOKEN = "AKIADYNGENKEY4242", "dyngen-Secret-Zq81xR", "dyngen-Session-Tk77"


def s3_config(endpoint: str, tmp_path: Path) -> dict[str, Any]:
    """A round on a new moto bucket, its credentials in storage_options."""
    store = {"root": f"s3://{new_bucket(endpoint)}/stores/main",
             "storage_options": {"endpoint_url": endpoint, "key": KEY, "secret": SECRET,
                                 "client_kwargs": {"region_name": "us-east-1"}},
             "cache_dir": str(tmp_path / "cache")}
    Store.from_config(store).create("ds", verl_rows(3))
    return {"store": store,
            "data": {"filter_overlong_prompts": False,
                     "datagen": {"path": "pkg://tests.flows.gens", "name": "AddNewRows"}},
            "round": {"retries": 0, "retry_delay_seconds": 0}}


def recorded_text(flow_run_id: Any, since: datetime) -> str:
    """Everything the Prefect server holds about a run: the run, its task runs, logs,
    artifacts and the events since `since`, as JSON text."""
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        of_run = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        parts = [run.model_dump_json()]
        parts += [t.model_dump_json() for t in client.read_task_runs(flow_run_filter=of_run)]
        parts += [g.model_dump_json() for g in client.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]
        parts += [a.model_dump_json() for a in client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))]
        parts += events_since(client, since, f"prefect.flow-run.{flow_run_id}",
                              "prefect.flow-run.Completed")
    return "\n".join(parts)


def events_since(client: Any, since: datetime, resource: str, name: str) -> list[str]:
    """Every event since `since` as JSON, once event `name` of `resource` is persisted."""
    deadline = time.monotonic() + 30
    while True:
        until = datetime.now(timezone.utc) + timedelta(seconds=1)
        page = client.read_events(
            EventFilter(occurred=EventOccurredFilter(since=since, until=until)), limit=50)
        found = []
        while True:
            found += [e.model_dump_json() for e in page.events]
            if not page.next_page:
                break
            page = client.read_events_page(page.next_page)
        if any(resource in e and f'"event":"{name}"' in e for e in found) \
                or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_a_rounds_credentials_are_used_but_never_recorded(s3_endpoint: str,
                                                          tmp_path: Path) -> None:
    since = datetime.now(timezone.utc) - timedelta(seconds=5)
    config = s3_config(s3_endpoint, tmp_path)
    overrides = [f"store.storage_options.client_kwargs.aws_session_token={TOKEN}",
                 "data.max_prompt_length=1024"]
    state = generation_round("ds", config, {"event_id": "secret-1"}, overrides,
                             return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["version"] == 1  # the credentials reached the store

    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        params = client.read_flow_run(run_id).parameters
    options = params["config"]["store"]["storage_options"]
    assert options == {"endpoint_url": s3_endpoint, "key": REDACTED, "secret": REDACTED,
                       "client_kwargs": {"region_name": "us-east-1"}}
    assert params["overrides"] == [
        f"store.storage_options.client_kwargs.aws_session_token={REDACTED}",
        "data.max_prompt_length=1024"]
    text = recorded_text(run_id, since)
    # The records are really there: the trigger in the run, an artifact, the run's events.
    assert "secret-1" in text and "dyngen-ds-round" in text
    assert "prefect.flow-run.Completed" in text
    for value in (KEY, SECRET, TOKEN):
        assert value not in text

    bucket = config["store"]["root"].split("/")[2]
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert any("/_versions/" in k for k in keys)
    stored = b"".join(s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys)
    for value in (KEY, SECRET, TOKEN):  # records, lineage, checkpoints, shards
        assert value.encode() not in stored


def test_a_copy_of_the_round_and_the_maintenance_flow_redact_too() -> None:
    from dyngen.flows.maintenance import maintain_store

    config = {"store": {"root": "s3://b/x", "storage_options": {"secret": SECRET}}}
    copy = generation_round.with_options(retries=1)
    for flow in (copy, maintain_store):
        shown = flow.serialize_parameters({"dataset": "ds", "config": config})
        assert shown["config"]["store"]["storage_options"] == {"secret": REDACTED}
    assert copy.retries == 1 and config["store"]["storage_options"]["secret"] == SECRET


def test_a_deployment_refuses_credentials_naming_the_option_and_the_variable(
        tmp_path: Path) -> None:
    config = {"store": {"root": "s3://bucket/stores/main",
                        "storage_options": {"key": KEY, "secret": SECRET,
                                            "endpoint_url": "http://minio:9000"}}}
    with pytest.raises(ConfigError) as refused:
        round_deployment("ds", config)
    message = str(refused.value)
    assert "store.storage_options.key, store.storage_options.secret" in message
    assert "AWS_ACCESS_KEY_ID for key" in message and "AWS_SECRET_ACCESS_KEY for secret" in message
    assert KEY not in message and SECRET not in message
    # gcsfs's token naming a way to find credentials is no credential.
    anon = {"store": {"root": "gs://bucket/x", "storage_options": {"token": "anon"}}}
    assert round_deployment("ds", anon).parameters["config"] == anon


def test_a_deployments_run_whose_parameters_hold_a_credential_fails_before_any_work(
        s3_endpoint: str, tmp_path: Path) -> None:
    config = s3_config(s3_endpoint, tmp_path)
    deployment_id = generation_round.to_deployment(name="secrets-test").apply()
    with get_client(sync_client=True) as client:  # as prefect.yaml or a custom run would
        run = client.create_flow_run_from_deployment(
            deployment_id, parameters={"dataset": "ds", "config": config})
    state = run_flow(generation_round, flow_run=run,
                     parameters={"dataset": "ds", "config": config}, return_type="state")
    assert state.is_failed()
    assert "store.storage_options.key, store.storage_options.secret" in state.message
    assert SECRET not in state.message
    assert Store.from_config(config["store"]).head_version("ds") == 0


def test_a_config_copied_from_a_recorded_run_says_what_to_do(tmp_path: Path) -> None:
    from dyngen.round import round_inputs

    copied = {"store": {"root": str(tmp_path), "storage_options": {"secret": REDACTED}}}
    with pytest.raises(ConfigError, match=r"store.storage_options.secret: expected a value, "
                                          r"found '<redacted>'.*environment"):
        round_inputs("ds", copied, None)
    assert json.dumps(copied)  # untouched
