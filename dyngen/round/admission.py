"""Admission: everything a round needs before its stages, in one context manager.

`admitted(...)` checks what the round is asked (the config, the trigger, the generator a
deployment must name, credentials a deployment's parameters must not hold, what the
config names loads), and answers whether the round's trigger already committed a version
(and, once the round has loaded its head, whether a version covers the batch end its
trigger names: dyngen.round.inbox). Nothing here waits for another round: rounds of one
dataset may run at once, and the store's commit decides (each batch end is covered once,
per training run in step order). The generation round's flow runs its stages inside it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig
from prefect import get_run_logger
from prefect.runtime import flow_run

from dyngen.config.generator_choice import require_generator
from dyngen.config.preflight import check_before_start
from dyngen.config.secrets import refuse_secrets
from dyngen.difficulty.observe import DifficultySettings, round_difficulty
from dyngen.difficulty.record import LINEAGE_KEY
from dyngen.round import committed_for, round_inputs
from dyngen.round.context import RoundBatchEnd, RoundContext, Trigger
from dyngen.round.inbox import covers_text
from dyngen.round.lineage import round_lineage
from dyngen.round.redaction import deployment_run
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.round.run_names import name_run, tag_run
from dyngen.round.stages import stage
from dyngen.round.top_up import TopUp
from dyngen.rows import RowBatch
from dyngen.store import Store, VersionRecord
from dyngen.store.location import StoreSpec, store_settings

# A round that loses its commit to a rival covering some of its batch ends, while what it
# was for stays pending, runs again: at most this many times in all.
MAX_ATTEMPTS = 3


@dataclass
class Admitted:
    """A round let in: what it was asked, validated, and where its store is."""

    dataset: str
    cfg: DictConfig
    trigger: Trigger
    rollouts: RolloutsPolicy
    where: StoreSpec  # the store's root and how to reach it
    store: Store
    committed: VersionRecord | None  # the version its trigger already committed, if any
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage

    attempts: int = 0  # how many times it lost its commit to a rival's covering version

    def nothing_to_do(self, parent: VersionRecord,
                      batch_ends: tuple[RoundBatchEnd, ...]) -> VersionRecord | None:
        """The version to answer with when the round has nothing to do at `parent`: the one
        covering the batch end its trigger names, or, with nothing pending, `parent` itself
        for a catch-up round and for a wake-up whose batch end is not in the inbox yet (a
        trainer's local retry queue holds it: the round that finds it pending covers it);
        None when it has work."""
        key = self.trigger.batch_end
        found = None if key is None else self.store.covering_version(
            self.dataset, *key, version=parent.version)
        if found is not None:
            get_run_logger().info("batch end run %s step %d is covered by version %d; "
                                  "nothing to do", key[0], key[1], found)
            return self.store.record(self.dataset, found)
        if (self.trigger.catch_up or key is not None) and not batch_ends:
            get_run_logger().info("nothing pending in %s's inbox at version %d; nothing to do",
                                  self.dataset, parent.version)
            return parent
        return None

    def again(self, covering: VersionRecord, batch_ends: tuple[RoundBatchEnd, ...]) -> bool:
        """After losing the commit to `covering` (a rival round covered some of its batch
        ends first): whether to load and run again, because what it was for is still
        pending (its trigger's batch end; a round no batch end started: any of its own),
        at most MAX_ATTEMPTS times. Otherwise it is done, and says so."""
        self.attempts += 1
        pending = {e.key for e in self.store.pending(self.dataset)}
        key = self.trigger.batch_end
        wanted = [key] if key is not None else [b.key for b in batch_ends]
        left = [k for k in wanted if k in pending]
        if left and self.attempts < MAX_ATTEMPTS:
            get_run_logger().info(
                "version %d covered some of this round's batch ends first; %s still pending: "
                "loading again", covering.version, covers_text(left))
            return True
        get_run_logger().info("the batch ends this round covers (%s) were covered meanwhile, "
                              "by version %d; nothing committed",
                              covers_text([b.key for b in batch_ends]), covering.version)
        return False

    def context(self, parent: VersionRecord,
                batch_ends: tuple[RoundBatchEnd, ...] = ()) -> RoundContext:
        """The round's context on top of `parent`, covering `batch_ends` (the inbox's
        entries pending at `parent`); its run is named after the new version."""
        context = RoundContext(self.dataset, parent.version + 1, parent.version, self.trigger,
                               rollouts_policy=self.rollouts, batch_ends=batch_ends)
        name_run(self.dataset, context.round)
        return context

    def lineage(self, asked: TopUp) -> dict[str, Any]:
        """What the version record keeps of this round (its filters' records included), and
        what it observed of its rows' difficulty (written into the store now, before the
        commit names it: dyngen.difficulty)."""
        context, outcome = asked.context, asked.outcome
        assert outcome is not None  # the round filtered its rows before it records them
        out = round_lineage(context, asked.generator, len(asked.rows), outcome, self.timings,
                            run_id=flow_run.id, run_name=flow_run.name,
                            partitions=asked.fanned_out).to_dict()
        if (top_up := asked.lineage()) is not None:
            out["top_up"] = top_up
        if (short := asked.message()) is not None:
            get_run_logger().warning(short)
        kept = outcome.kept
        difficulty = round_difficulty(
            self.store, DifficultySettings.from_config(self.cfg), context,
            self.store.record(self.dataset, context.parent),
            kept.to_list() if isinstance(kept, RowBatch) else list(kept),
            (outcome.records.get("solve_rate") or {}).get("policy_step"))
        if difficulty is not None:
            out[LINEAGE_KEY] = difficulty
        return out


@contextmanager
def admitted(dataset: str, config: Mapping[str, Any] | None, trigger: Any,
             overrides: Sequence[str] = ()) -> Iterator[Admitted]:
    """Check the round and open its store."""
    with stage("check"):  # everything the config names, before any work
        cfg, trig, rollouts = round_inputs(dataset, config, trigger, overrides)
        if deployment_run():
            refuse_secrets(cfg, "this deployment's parameters")
            # A deployment names its generator: it never runs the mock unasked.
            require_generator(config, overrides, what="this deployment's parameters")
        check_before_start(cfg)
    tag_run(dataset)
    where = store_settings(cfg.store)
    store = Store.from_config(where)
    yield Admitted(dataset, cfg, trig, rollouts, where, store,
                   committed_for(store, dataset, trig))
