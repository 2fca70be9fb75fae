"""`dyngen serve` next to a deployment made by `prefect deploy` (prefect.yaml)."""

from __future__ import annotations

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate

from dyngen.errors import ConfigError
from dyngen.flows.generation_round import generation_round
from dyngen.flows.serve import DEPLOYMENT_NAME, serve_rounds

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_serve_refuses_to_replace_the_work_pool_deployment_and_leaves_it_as_it_was() -> None:
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="dyngen-pool", type="process"),
                                overwrite=True)
        flow_id = client.create_flow_from_name(generation_round.name)
        deployment_id = client.create_deployment(
            flow_id, DEPLOYMENT_NAME, work_pool_name="dyngen-pool",
            entrypoint="dyngen/flows/generation_round.py:generation_round")
    try:
        with pytest.raises(ConfigError) as err:
            serve_rounds("ds", {})
        message = str(err.value)
        assert f"generation-round/{DEPLOYMENT_NAME}" in message and "dyngen-pool" in message
        assert "prefect worker start --pool dyngen-pool" in message
        with get_client(sync_client=True) as client:
            kept = client.read_deployment(deployment_id)
        assert kept.work_pool_name == "dyngen-pool"
        assert kept.entrypoint == "dyngen/flows/generation_round.py:generation_round"
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment_id)
