"""Store maintenance as a flow run: compact every dataset, rebuild what its near-duplicate
index lacks, apply retention if asked, and keep each dataset's mirror current when
the config's `mirror.dest` is set.

The alternative to compacting after each round (`round.compaction.enabled`): the
`store-maintenance` deployment in prefect.yaml runs this on a schedule. It commits
through the store's optimistic protocol, so it may run while rounds do. The mirror comes
last, so it holds this run's compactions and vacuum too.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf
from prefect import get_run_logger

from dyngen.config import load_config
from dyngen.config.secrets import refuse_redacted, refuse_secrets
from dyngen.filters.chain import vector_params
from dyngen.filters.near_duplicate import params_of
from dyngen.round import compaction_policy
from dyngen.round.redaction import deployment_run, redacting_flow
from dyngen.store import Store
from dyngen.store.location import store_settings
from dyngen.store.names import validate_name
from dyngen.tasks.compact import compact_head
from dyngen.tasks.index import rebuild_index_of
from dyngen.tasks.mirror import mirror_head
from dyngen.tasks.vacuum import vacuum_dataset


@redacting_flow(name="store-maintenance")
def maintain_store(dataset: str | None = None, config: dict[str, Any] | None = None,
                   keep_versions: int | None = None, keep_days: float | None = None,
                   grace_seconds: float | None = None) -> dict[str, Any]:
    """Compact `dataset` (every dataset under the root if None), index what its
    near-duplicate (and, when enabled, semantic) sidecars miss (`dyngen rebuild-index`);
    vacuum if a rule is given; bring its mirror up to the head if `mirror.dest` is set."""
    cfg = load_config(base=config)
    refuse_redacted(cfg)
    if deployment_run():
        refuse_secrets(cfg, "this deployment's parameters")
    policy = compaction_policy(cfg)  # the numbers a round would use, enabled or not
    root = store_settings(cfg.store)
    names = [validate_name(dataset)] if dataset else Store.from_config(root).list_datasets()
    logger = get_run_logger()
    mirror = OmegaConf.to_container(cfg.mirror, resolve=True) if cfg.mirror.dest else None
    done: dict[str, Any] = {}
    near = cfg.round.near_duplicate
    for name in names:
        done[name] = {"compacted": compact_head(root, name, policy)}
        if near.enabled:
            done[name]["indexed_shards"] = rebuild_index_of(root, name, params_of(near))
        if (vectors := vector_params(cfg)) is not None:
            done[name]["embedded_shards"] = rebuild_index_of(root, name, vectors)
        if keep_versions is not None or keep_days is not None:
            done[name]["vacuum"] = vacuum_dataset(root, name, keep_versions, keep_days,
                                                  grace_seconds)
        if mirror is not None:
            done[name]["mirror"] = mirror_head(root, name, mirror)
        logger.info("%s: %s", name, done[name])
    return done
