"""Run generation rounds in child processes against the session's Prefect server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dyngen.store import Store
from dyngen.store.index import INDEX_DIR
from dyngen.store.store import DATA_DIR, REJECTED_DIR, VERSIONS_DIR

REPO = Path(__file__).resolve().parents[2]

# Runs the rounds given as JSON ([{"config": ..., "trigger": ...}, ...]) one after another
# and prints each round's summary as one JSON line. Heartbeats are off, as in the session
# (each costs up to 1 s at the end of a flow run, and they only serve crash detection).
_ROUNDS_IN_PROCESS = """
import json, sys
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from dyngen.flows.generation_round import generation_round
dataset, rounds = sys.argv[1], json.loads(sys.argv[2])
with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
    for r in rounds:
        print(json.dumps(generation_round(dataset, r["config"], r["trigger"])), flush=True)
"""


def round_config(store: Store, **datagen: Any) -> dict[str, Any]:
    """A round that adds AddNewRows' rows (`start`, `n`) plus one duplicate to reject."""
    return {
        "store": {"root": str(store.root)},
        "data": {"filter_overlong_prompts": False,
                 "datagen": {"path": "pkg://tests.flows.gens", "name": "AddNewRows", **datagen}},
        "round": {"retries": 0, "retry_delay_seconds": 0},
    }


@dataclass
class Child:
    """A child process running rounds; its output goes to files, so it never blocks."""

    proc: subprocess.Popen[bytes]
    out: IO[bytes]
    err: IO[bytes]

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Wait (killing it after `timeout` seconds); return exit status, stdout, stderr."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        texts = []
        for fh in (self.out, self.err):
            fh.seek(0)
            texts.append(fh.read().decode(errors="replace"))
            fh.close()
        return self.proc.returncode, texts[0], texts[1]


def launch_rounds(dataset: str, rounds: list[dict[str, Any]],
                  env: dict[str, str] | None = None) -> Child:
    """Start a child process that runs `rounds` of `dataset` as real flow runs."""
    from prefect.settings import PREFECT_API_URL

    child_env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()),
                 "PYTHONPATH": str(REPO), **(env or {})}
    # Closed by Child.finish; files, not pipes, so a chatty child never blocks on a write.
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-c", _ROUNDS_IN_PROCESS, dataset,
                             json.dumps(rounds)], env=child_env, cwd=REPO, stdout=out,
                            stderr=err)
    return Child(proc, out, err)


def summaries(stdout: str) -> list[dict[str, Any]]:
    """The round summaries a child printed."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def indices(store: Store, name: str) -> list[int]:
    """`extra_info.index` of every row of the head version."""
    return [e["index"] for e in store.load(name)["extra_info"]]


def files_named_by_records(store: Store, name: str) -> set[str]:
    """Every shard file some version names, relative to the dataset folder."""
    return {f for rec in Store(store.root).history(name)
            for s in rec.shards + rec.rejected for f in s.files}


def files_on_disk(store: Store, name: str) -> set[str]:
    """Every file under data/, rejected/ and _index/, plus temp files under _versions/."""
    base = store.dataset_dir(name)
    found = {f"{sub}/{p.name}" for sub in (DATA_DIR, REJECTED_DIR, INDEX_DIR)
             if (base / sub).is_dir() for p in (base / sub).iterdir()}
    return found | {f"{VERSIONS_DIR}/{p.name}" for p in (base / VERSIONS_DIR).iterdir()
                    if not p.name.endswith(".json") or p.name.startswith(".")}
