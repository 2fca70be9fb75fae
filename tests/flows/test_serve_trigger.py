"""`dyngen serve` and prefect.yaml deploy the same trigger: one definition, checked here.

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
