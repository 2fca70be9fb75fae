"""`dyngen serve` and prefect.yaml deploy the same trigger and catch-up schedule: one
definition, checked here.

prefect.yaml cannot import Python and an installed `flows` package has no prefect.yaml,
so each states the trigger; this test keeps them the same.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import yaml

from dyngen.runtime.serve import batch_end_trigger

REPO = Path(__file__).resolve().parents[2]


def _definitions() -> dict:
    return yaml.safe_load((REPO / "prefect.yaml").read_text(encoding="utf-8"))["definitions"]


def test_serve_builds_the_trigger_prefect_yaml_declares() -> None:
    declared = _definitions()["batch_end_trigger"]
    built = batch_end_trigger(config={"store": {"root": "/s"}})
    assert built.name == declared["name"]
    assert set(built.expect) == set(declared["expect"])
    assert built.match.model_dump() == declared["match"]
    assert built.threshold == 1 and built.within == timedelta(0)
    # serve adds the deployment's config; every event-derived parameter is the same.
    assert {k: v for k, v in built.parameters.items() if k != "config"} == \
        declared["parameters"]
    assert built.parameters["config"] == {"store": {"root": "/s"}}


def test_every_n_batches_matches_the_throttled_trigger() -> None:
    declared = _definitions()["every_4_batches"]
    built = batch_end_trigger(threshold=4)
    assert built.threshold == declared["threshold"]
    assert built.within == timedelta(seconds=declared["within"])


def test_prefect_yaml_declares_the_catch_up_schedule_serve_deploys() -> None:
    """The round's deployment in prefect.yaml carries serve's catch-up schedule, off until
    a dataset is named (a schedule names its dataset), and Prefect's deploy reads it."""
    from prefect.cli.deploy._schedules import _schedule_config_to_deployment_schedule

    from dyngen.runtime.serve import CATCH_UP_SECONDS, catch_up_schedule

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text(encoding="utf-8"))
    (deployment,) = [d for d in spec["deployments"] if d["name"] == "on-batch-end"]
    (declared,) = deployment["schedules"]
    built = catch_up_schedule(declared["parameters"]["dataset"])
    assert declared["interval"] == CATCH_UP_SECONDS == built.interval.total_seconds()
    assert declared["slug"] == built.slug
    assert declared["parameters"] == built.parameters
    assert declared["active"] is False
    read = _schedule_config_to_deployment_schedule(declared)
    assert read["parameters"] == {"dataset": "my-data", "trigger": {"catch_up": True}}
    assert read["schedule"].interval == timedelta(seconds=CATCH_UP_SECONDS)
