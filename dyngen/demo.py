"""`dyngen demo`: a walkthrough of the versioned store on a small verl-format dataset.

It seeds a parquet file in verl's RL schema, imports it as version 0, appends two
"rounds" of new tasks, then shows the history, time travel, verification and the
export that verl's `data.train_files` reads. Everything lives under one folder.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from dyngen.store import Store, verify
from dyngen.verl_format import export_version, import_files


def arithmetic_task(rng: random.Random, index: int, digits: int, source: str) -> dict[str, Any]:
    """One verifiable addition/multiplication task in verl's row schema."""
    a, b = rng.randrange(10 ** (digits - 1), 10**digits), rng.randrange(1, 10**digits)
    op = rng.choice("+*")
    answer = a + b if op == "+" else a * b
    return {
        "data_source": source,
        "prompt": [
            {"role": "system", "content": "Answer with the final number only."},
            {"role": "user", "content": f"What is {a} {op} {b}?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"index": index, "digits": digits},
    }


def run_demo(workdir: Path, console: Console, seed: int = 0) -> Store:
    """Run the walkthrough under `workdir`, printing each step; return the store."""
    rng = random.Random(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    store = Store(workdir / "store")
    name = f"arith-{seed}"
    if store.head_version(name) is not None:
        console.print(f"[yellow]dataset {name} exists in {store.root}; reusing it[/]")
    else:
        seed_file = workdir / "seed.parquet"
        pq.write_table(pa.Table.from_pylist(
            [arithmetic_task(rng, i, 1, "seed") for i in range(16)]), seed_file)
        rec = import_files(store, name, [seed_file])
        console.print(f"1. imported {seed_file.name} → {name} v{rec.version} ({rec.rows} rows)")
        for round_no, digits in ((1, 2), (2, 3)):
            new = [arithmetic_task(rng, 100 * round_no + i, digits, "demo-curriculum")
                   for i in range(8)]
            rec = store.append(name, new, generator="demo-curriculum",
                               round_id=f"round-{round_no}", idempotency_key=f"round-{round_no}",
                               lineage={"generator": {"class": "demo-curriculum"},
                                        "counts": {"generated": 8, "kept": 8}})
            console.print(f"2.{round_no} round {round_no} appended 8 tasks with {digits} digits "
                          f"→ v{rec.version} ({rec.rows} rows)")
    for rec in store.history(name):
        console.print(f"   v{rec.version:<3} {rec.operation:<7} parent={rec.parent} "
                      f"rows={rec.rows:<4} {rec.created_at}")
    console.print(f"3. time travel: v0 has {store.load(name, 0).num_rows} rows, head has "
                  f"{store.load(name).num_rows}")
    problems = verify(store, name)
    verdict = "ok" if not problems else "; ".join(map(str, problems))
    console.print(f"4. verify: {verdict}")
    out = export_version(store, name, workdir / f"{name}.parquet")
    console.print(f"5. exported the head to {out} (set verl's data.train_files to it)")
    console.print(f"   explore: dyngen --root {store.root} log {name}")
    return store
