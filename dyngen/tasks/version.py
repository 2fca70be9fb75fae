"""Stage 5: commit the version record, then publish its lineage to Prefect."""

from __future__ import annotations

import re
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.assets import add_asset_metadata, materialize
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)
from prefect.utilities.annotations import opaque

from dyngen.errors import AlreadyCoveredError
from dyngen.faults import crash_point
from dyngen.report.history import history_of
from dyngen.report.trend import trend_markdown
from dyngen.round import commit_round
from dyngen.round.inbox import covering_record
from dyngen.round.lineage import history_row, round_markdown
from dyngen.store import PendingCommit, Store, VersionRecord
from dyngen.store.location import StoreSpec


@task(name="version", cache_policy=NO_CACHE)
def commit_version(store_root: StoreSpec, pending: PendingCommit) -> tuple[VersionRecord, bool]:
    """Commit atomically (rebasing over concurrent commits); on failure remove the shards.

    (the record, True); or, when a version committed meanwhile covers any of the batch ends
    this one covers (a concurrent or retried round won), (that version's record, False):
    nothing was committed.
    """
    store = Store.from_config(store_root)
    try:
        record = commit_round(store, pending)
    except AlreadyCoveredError as exc:
        covering = covering_record(store, exc)
        get_run_logger().info("version: nothing committed; v%d already covers its batch "
                              "ends", covering.version)
        return covering, False
    get_run_logger().info("version: committed %s v%d (parent v%s), %d rows out",
                          record.dataset, record.version, record.parent, record.rows)
    crash_point("round.after_version")
    return record, True


def asset_key(dataset: str, version: int) -> str:
    """The Prefect asset of one dataset version."""
    return f"dyngen://{dataset}/v{version}"


def artifact_key(dataset: str, what: str) -> str:
    """A stable artifact key per dataset (Prefect keys: lowercase letters, digits, dashes)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", dataset.lower()).strip("-")
    return f"dyngen-{slug}-{what}"


@materialize("dyngen://dataset", cache_policy=NO_CACHE)
def _materialize(record: VersionRecord) -> None:
    add_asset_metadata(asset_key(record.dataset, record.version), {
        "rows": record.rows, "operation": record.operation, "parent": record.parent,
        "shards": len(record.shards), "created_at": record.created_at,
    })


@task(name="publish-lineage", cache_policy=NO_CACHE)
def publish_lineage(record: VersionRecord, history: list[VersionRecord]) -> None:
    """Markdown + history table artifacts under stable keys, and the version's asset."""
    markdown = round_markdown(record) + "\n" + trend_markdown(history_of(history))
    create_markdown_artifact(
        key=artifact_key(record.dataset, "round"), markdown=markdown,
        description=f"{record.dataset}: v{record.parent} → v{record.version}",
    )
    create_table_artifact(
        key=artifact_key(record.dataset, "history"), table=[history_row(r) for r in history],
        description=f"{record.dataset}: version history" + (
            f", newest {len(history)} of {history[-1].version + 1}" if history[0].version else ""),
    )
    deps = [] if record.parent is None else [asset_key(record.dataset, record.parent)]
    _materialize.with_options(assets=[asset_key(record.dataset, record.version)],
                              asset_deps=deps)(opaque(record))


def lineage_published(record: VersionRecord) -> bool:
    """Whether the run that committed `record` published its round artifact (it may have
    been killed between the commit and publishing)."""
    run_id = record.lineage.get("flow_run_id")
    if not run_id:
        return True  # committed outside a flow run: nothing was to be published
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[artifact_key(record.dataset, "round")]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(str(run_id))])), limit=1)
    return bool(found)
