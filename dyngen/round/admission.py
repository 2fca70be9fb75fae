"""Admission: everything a round needs before its stages, in one context manager.

`admitted(...)` checks what the round is asked (the config, the trigger, the generator a
deployment must name, credentials a deployment's parameters must not hold, what the
config names loads), waits for its dataset's earlier steps (dyngen.round.step_order),
takes its dataset's slot (dyngen.round.slot) for the block, and answers whether the
round's trigger already committed a version (and, once the round has loaded its head,
whether a version covers the batch end its trigger names: dyngen.round.inbox). The
generation round's flow runs its five stages inside it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig
from prefect.runtime import flow_run

from dyngen.config.generator_choice import require_generator
from dyngen.config.preflight import check_before_start
from dyngen.config.secrets import refuse_secrets
from dyngen.filters.base import FilterOutcome
from dyngen.round import committed_for, round_inputs
from dyngen.round.context import RoundBatchEnd, RoundContext, Trigger
from dyngen.round.lineage import round_lineage
from dyngen.round.redaction import deployment_run
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.round.run_names import name_run
from dyngen.round.slot import dataset_slot
from dyngen.round.stages import stage
from dyngen.round.step_order import StepOrder, keep_step_order
from dyngen.store import Store, VersionRecord
from dyngen.store.location import StoreSpec, store_settings


@dataclass
class Admitted:
    """A round let in: what it was asked, validated, and where its store is."""

    dataset: str
    cfg: DictConfig
    trigger: Trigger
    rollouts: RolloutsPolicy
    where: StoreSpec  # the store's root and how to reach it
    store: Store
    order: StepOrder  # how it kept its dataset's step order
    committed: VersionRecord | None  # the version its trigger already committed, if any
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage

    def covering(self, parent: VersionRecord) -> VersionRecord | None:
        """The version up to `parent` that covers the batch end the trigger names (its run
        and step), if one does: then this round has nothing to do."""
        key = self.trigger.batch_end
        found = None if key is None else self.store.covering_version(
            self.dataset, *key, version=parent.version)
        return None if found is None else self.store.record(self.dataset, found)

    def context(self, parent: VersionRecord,
                batch_ends: tuple[RoundBatchEnd, ...] = ()) -> RoundContext:
        """The round's context on top of `parent`, covering `batch_ends` (the inbox's
        entries pending at `parent`); its run is named after the new version."""
        context = RoundContext(self.dataset, parent.version + 1, parent.version, self.trigger,
                               rollouts_policy=self.rollouts, batch_ends=batch_ends)
        name_run(self.dataset, context.round)
        return context

    def lineage(self, context: RoundContext, generator: dict[str, Any], generated: int,
                outcome: FilterOutcome, partitions: dict[str, Any] | None) -> dict[str, Any]:
        """What the version record keeps of this round (its filters' records included)."""
        return round_lineage(context, generator, generated, outcome, self.timings,
                             run_id=flow_run.id, run_name=flow_run.name, partitions=partitions,
                             step_order=self.order.lineage()).to_dict()


@contextmanager
def admitted(dataset: str, config: Mapping[str, Any] | None, trigger: Any,
             overrides: Sequence[str] = ()) -> Iterator[Admitted]:
    """Check the round, keep its step order, and hold its dataset's slot for the block."""
    with stage("check"):  # everything the config names, before any work
        cfg, trig, rollouts = round_inputs(dataset, config, trigger, overrides)
        if deployment_run():
            refuse_secrets(cfg, "this deployment's parameters")
            # A deployment names its generator: it never runs the mock unasked.
            require_generator(config, overrides, what="this deployment's parameters")
        check_before_start(cfg)
    # Before the dataset's slot, which the earlier rounds it waits for need.
    order = keep_step_order(dataset, trig, float(cfg.round.order_wait_seconds),
                            store_root=str(cfg.store.root))
    with dataset_slot(dataset):
        where = store_settings(cfg.store)
        store = Store.from_config(where)
        yield Admitted(dataset, cfg, trig, rollouts, where, store, order,
                       committed_for(store, dataset, trig))
