"""What the solve-rate round tests share: a store of sums, a round's config, a recording reward."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from dyngen.generators.arithmetic import arithmetic_task
from dyngen.store import Store

# A reward of the test's own, in verl's signature: it records every score it returns. Rows
# with index % 3 == 0 always pass, == 1 never do; the others pass on an even-length reply.
RECORDING_REWARD = '''
import json

RECORDS = {records!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    index = extra_info["index"]
    if index % 3 == 0:
        score = 1.0
    elif index % 3 == 1:
        score = 0.0
    else:
        score = float(len(solution_str) % 2 == 0)
    with open(RECORDS, "a") as out:
        out.write(json.dumps({{"index": index, "score": score}}) + "\\n")
    return {{"score": score, "acc": score}} if index % 2 else score
'''


def sums_store(folder: Path, rows: int = 4) -> Store:
    """A store with one dataset, `sums`, of `rows` one-digit sums."""
    store = Store(folder / "store")
    rng = random.Random(1)
    store.create("sums", [arithmetic_task(rng, i, 1) for i in range(rows)])
    return store


def recording_reward(folder: Path) -> tuple[Path, Path]:
    """(reward file, records file) of a reward function that records each score it gives."""
    records = folder / "scores.jsonl"
    path = folder / "recording_reward.py"
    path.write_text(RECORDING_REWARD.format(records=str(records)))
    return path, records


def recorded(records: Path) -> list[dict[str, Any]]:
    """Every score the recording reward returned, in order."""
    if not records.exists():
        return []
    return [json.loads(line) for line in records.read_text().splitlines()]


def solve_round_config(store: Store, policy: dict[str, Any], tasks: int = 6,
                       datagen: dict[str, Any] | None = None, **round_cfg: Any
                       ) -> dict[str, Any]:
    """An arithmetic round on `store` with round.solve_rate on, asking `policy`."""
    solve = {"enabled": True, "samples": 4, "keep": [0.25, 0.75], "max_tokens": 8,
             "temperature": 1.0, **policy}
    return {"store": {"root": str(store.root)},
            "data": {"datagen": datagen or {"path": "pkg://dyngen.generators.arithmetic",
                                            "name": "ArithmeticCurriculum",
                                            "tasks_per_round": tasks, "seed": 3}},
            "round": {"retries": 0, "solve_rate": solve, **round_cfg}}


def store_files(store: Store) -> list[Path]:
    """Every file under the store, sorted (what a failed round must leave as it was)."""
    return sorted(p.relative_to(store.root) for p in Path(store.root).rglob("*"))


def key_found_in(state: Any, store: Store, key: str) -> list[str]:
    """Where `key` appears: the flow run's parameters, logs and artifacts, its error, the store."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )

    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        places = {"parameters": json.dumps(client.read_flow_run(run_id).parameters),
                  "state": str(state.message)}
        places["logs"] = "\n".join(log.message for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))))
        places["artifacts"] = json.dumps(
            [[a.key, a.data, a.description] for a in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
                    any_=[run_id])))], default=str)
    found = [name for name, text in places.items() if key in text]
    found += [str(p) for p in Path(store.root).rglob("*")
              if p.is_file() and key.encode() in p.read_bytes()]
    return found
