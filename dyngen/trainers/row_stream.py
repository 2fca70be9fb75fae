"""The newest committed version's rows as an endless, seeded stream that follows new versions.

`RowStream` is what TRL's `FollowingDataset` and the verifiers taskset
(`dyngen.trainers.verifiers`) iterate. Its sampler chooses the rows: `fresh_first` (the
default, the baseline) serves rows of versions committed meanwhile first, then a seeded
pass over all rows, pass after pass; `frontier` (dyngen.difficulty.frontier) draws by each
row's difficulty record. It looks at the head once per block of
`block_rows` rows, so a version committed while training runs is reached within one
block. Rows are read one at a time from the memory-mapped version: nothing is copied.
Several ranks reading one stream agree on each block's version (see `_Agreement`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dyngen.difficulty.frontier import FrontierPlan, FrontierSampler
from dyngen.difficulty.record import DIFFICULTY_COLUMN
from dyngen.errors import ConfigError
from dyngen.store import Store
from dyngen.trainers.rollouts import rollouts_dir


class RowStream:
    """Yields (key, row): fresh rows of newer versions first, then a seeded pass over all."""

    def __init__(self, store_root: Path, dataset: str, seed: int, block_rows: int,
                 run_id: str | None, one_reader: bool = False,
                 sampler: FrontierSampler | None = None) -> None:
        self.store_root, self.dataset, self.seed = store_root, dataset, seed
        self.block_rows, self.run_id, self.one_reader = block_rows, run_id, one_reader
        self.sampler = sampler  # None: fresh_first

    def __call__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The stream; every rank computes the same one from the same agreed versions."""
        for block, j, _, _, row in self.positioned():
            yield f"{block}-{j}", row

    def positioned(self) -> Iterator[tuple[int, int, int, int, dict[str, Any]]]:
        """(block, position in block, version, row index in that version, row), forever.

        `one_reader`: a single process reads the stream (prime-rl's orchestrator), so no
        agreement between ranks is written down whatever WORLD_SIZE says.
        """
        store = Store(self.store_root)
        agree = (_Agreement(None) if self.one_reader
                 else _Agreement.for_ranks(store.root, self.dataset, self.run_id))
        plan: _Plan | FrontierPlan = (_Plan(self.seed) if self.sampler is None else
                                      FrontierPlan(self.seed, self.sampler, store, self.dataset))
        data, record = None, None
        block = 0

        def decide() -> dict[str, Any]:  # the head, and the batch ends pending at it
            head = store.head(self.dataset).version
            pending = plan.pending_at(head) if isinstance(plan, FrontierPlan) else []
            return {"version": head, "pending": [list(k) for k in pending]}

        while True:
            agreed = agree.decide(block, decide)
            version = int(agreed["version"])
            if record is None or version != record.version:
                new_record = store.record(self.dataset, version)
                data = store.load(self.dataset, version)
                plan.update(record, new_record, record is not None and store.extends(
                    self.dataset, record.version, new_record.version), data)
                record = new_record
            assert data is not None
            if isinstance(plan, FrontierPlan):
                plan.fold(agreed["pending"])
            prompt_key = record.prompt_key
            for j, index in enumerate(plan.take(self.block_rows, len(data))):
                row = data[int(index)]
                if prompt_key != "prompt" and prompt_key in row:
                    row["prompt"] = row[prompt_key]
                if isinstance(plan, FrontierPlan):
                    row[DIFFICULTY_COLUMN] = plan.shown(int(index))
                yield block, j, record.version, int(index), row
            block += 1


class _Plan:
    """Which rows come next: rows new since the last version first, then seeded passes."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.fresh: list[int] = []
        self.order: np.ndarray = np.arange(0)
        self.cursor = 0
        self.epoch = 0

    def update(self, old: Any, new: Any, extends: bool, data: Any = None) -> None:
        """Serve the rows `new` adds to `old` first; a version that does not extend `old`
        (see Store.extends: a compaction does, a restore does not) restarts."""
        if old is not None and extends:
            self.fresh.extend(range(old.rows, new.rows))
        else:
            self.fresh, self.order, self.cursor = [], np.arange(0), 0

    def take(self, count: int, rows: int) -> list[int]:
        """The next `count` row indices of a version with `rows` rows."""
        out = self.fresh[:count]
        self.fresh = self.fresh[count:]
        while len(out) < count and rows:
            if self.cursor >= len(self.order):
                rng = np.random.default_rng([self.seed, self.epoch])
                self.order, self.cursor, self.epoch = rng.permutation(rows), 0, self.epoch + 1
            take = self.order[self.cursor:self.cursor + count - len(out)]
            self.cursor += len(take)
            out.extend(int(i) for i in take)
        return out


class _Agreement:
    """Which version each block reads (and which pending batch ends the frontier sampler
    weighs): the head on one rank; written down for many."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    @classmethod
    def for_ranks(cls, store_root: Path, dataset: str, run_id: str | None) -> _Agreement:
        """No files for one process; a folder under the run's rollouts folder for many."""
        world = _world_size()
        if world <= 1:
            return cls(None)
        if not run_id:
            raise ConfigError(f"FollowingDataset on {world} ranks: expected run_id (the same "
                              "on every rank, new for each training run), found none. Every "
                              "rank must read the same version per block to see the same rows.")
        return cls(rollouts_dir(store_root, dataset, run_id) / "blocks")

    def decide(self, block: int, decide: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """What block `block` reads: the first rank to get there decides."""
        if self.folder is None:
            return decide()
        path = self.folder / f"{block:012d}"
        if not path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{block:012d}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(decide()))
            try:
                os.link(tmp, path)  # exclusive: exactly one rank's choice lands
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return dict(json.loads(path.read_text()))


def _world_size() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except ImportError:
        pass
    return int(os.environ.get("WORLD_SIZE", "1") or 1)
