"""Each row's difficulty record: observations a version adds, and the book that folds them.

A round writes what it observed (the band's measurement of each row it keeps, and each
covered batch end's groups of completions, mapped to dataset rows) as one Parquet file,
`<dataset>/_difficulty/<sha256>.parquet`, named by its content and written before the
commit, and its version's lineage names it under `difficulty` with the rows it retires or
revives. No row is rewritten: reading version N folds the difficulty entries of versions
0..N (`DifficultyBook`), so each row's observations are those made up to N. Rows are known
by their prompt key (dyngen.store.keys.prompt_key), the key dedup uses, so a record
survives compaction and restore. Files here are never vacuumed: like version records,
they are the audit.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dyngen.difficulty.posterior import Evidence, Posterior, posterior
from dyngen.errors import CorruptionError
from dyngen.store.keys import prompt_key

FOLDER = "_difficulty"
LINEAGE_KEY = "difficulty"
# How a row's difficulty is shown beside it (`dyngen show --json`, the frontier sampler's
# rows): {pass_rate, samples, last_step, and retired or weight}.
DIFFICULTY_COLUMN = "_dyngen_difficulty"
SCHEMA = pa.schema([("key", pa.uint64()), ("step", pa.int64()), ("passed", pa.int64()),
                    ("samples", pa.int64()), ("source", pa.string()), ("kind", pa.string())])
KINDS = ("band", "trainer")
MARKS = "dyngen.difficulty.marks"  # a snapshot file's metadata: retirements, warnings
# A round writes a snapshot of the whole book once SNAPSHOT_EVERY versions have passed
# since the one its book started from; `at` looks back SNAPSHOT_REACH versions for one.
SNAPSHOT_EVERY = 64
SNAPSHOT_REACH = 4 * SNAPSHOT_EVERY


@dataclass(frozen=True)
class Observation:
    """`passed` of `samples` completions of the row with prompt key `key` at `step`."""

    key: int
    step: int
    passed: int
    samples: int
    source: str = ""  # the row's data_source
    kind: str = "trainer"  # band: a round's measurement; trainer: a batch end's group


def shown_text(shown: Mapping[str, Any] | None) -> str:
    """A row's difficulty in a few words: `p≈0.62 n=24 @14`, `retired: all_right`, `-`."""
    if not shown:
        return "-"
    text = f"p≈{shown['pass_rate']:.2f} n={shown['samples']} @{shown['last_step']}"
    return f"retired ({shown['retired']}); {text}" if shown.get("retired") else text


def key_text(key: int) -> str:
    """How lineage writes a prompt key: 16 hex digits."""
    return f"{int(key):016x}"


def write_observations(store: Any, dataset: str, observations: Iterable[Observation],
                       marks: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Write the observations' file into the store (if absent); the lineage's reference to
    it, or None when there are none. `marks`: JSON kept in the file's metadata (a
    snapshot's retirements and warnings)."""
    obs = list(observations)
    if not obs:
        return None
    schema = SCHEMA if marks is None else SCHEMA.with_metadata(
        {MARKS: json.dumps(marks, sort_keys=True)})
    table = pa.table({"key": [o.key for o in obs], "step": [o.step for o in obs],
                      "passed": [o.passed for o in obs], "samples": [o.samples for o in obs],
                      "source": [o.source for o in obs], "kind": [o.kind for o in obs]},
                     schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    data = sink.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    rel = f"{FOLDER}/{digest}.parquet"
    with suppress(FileExistsError):  # the same observations, from an earlier attempt
        store.backend.write_new(f"{dataset}/{rel}", data)
    return {"path": rel, "sha256": digest, "count": len(obs),
            "rows": len({o.key for o in obs})}


def read_observations(store: Any, dataset: str, ref: Mapping[str, Any]) -> list[Observation]:
    """The observations a lineage's reference names, checked against its hash."""
    return _read(store, dataset, ref)[0]


def _read(store: Any, dataset: str, ref: Mapping[str, Any]
          ) -> tuple[list[Observation], dict[str, Any]]:
    """A reference's observations and the marks its file keeps (a snapshot's)."""
    rel = f"{dataset}/{ref['path']}"
    data = store.backend.read_bytes(rel)
    if hashlib.sha256(data).hexdigest() != ref.get("sha256"):
        raise CorruptionError(f"{store.backend.describe(rel)}: its content does not match the "
                              "sha256 its version's lineage records; restore it from a backup "
                              "of the store (the rows themselves are unaffected).")
    read = pq.read_table(io.BytesIO(data))
    marks = json.loads((read.schema.metadata or {}).get(MARKS.encode(), b"{}"))
    table = read.to_pydict()
    return [Observation(int(k), int(s), int(p), int(n), str(src or ""), str(kind))
            for k, s, p, n, src, kind in zip(table["key"], table["step"], table["passed"],
                                             table["samples"], table["source"], table["kind"],
                                             strict=True)], marks


@dataclass
class DifficultyBook:
    """Every row's observations and retirement, as of one version (folded, not rewritten)."""

    version: int = -1  # the newest version folded in; -1: none
    evidence: dict[int, list[Evidence]] = field(default_factory=dict)
    sources: dict[int, str] = field(default_factory=dict)
    band: dict[int, Evidence] = field(default_factory=dict)  # the newest band measurement
    retired: dict[int, dict[str, Any]] = field(default_factory=dict)  # key -> its entry
    warned: set[str] = field(default_factory=set)  # data sources a broken reward was seen in
    now: int = 0  # the newest step observed

    snapshot: int = -1  # the version whose snapshot the book started from; -1: none

    @classmethod
    def at(cls, store: Any, dataset: str, version: int) -> DifficultyBook:
        """The book as of `version`: from the newest snapshot within SNAPSHOT_REACH
        versions of it, if any, then folded forward."""
        book, seen = cls(), {}  # the entries read looking back, not read again going on
        for v in range(version, max(-1, version - SNAPSHOT_REACH), -1):
            seen[v] = _entry(store, dataset, v)
            ref = (seen[v] or {}).get("snapshot")
            # Made on top of the version before: a round whose commit was rebased over a
            # rival's made it without the rival's entry, and it is passed over.
            if ref and ref.get("parent") == v - 1:
                observations, marks = _read(store, dataset, ref)
                book.add(observations)
                book.retired = {int(k, 16): dict(e) for k, e in marks["retired"].items()}
                book.warned = set(marks["warned"])
                book.version = book.snapshot = v
                break
        book.advance(store, dataset, version, seen)
        return book

    def write_snapshot(self, store: Any, dataset: str) -> dict[str, Any] | None:
        """Everything the book holds as one file in the store; its lineage reference. A
        version whose difficulty entry names it (`snapshot`) is where `at` starts."""
        observations = [Observation(key, e.step, e.passed, e.samples, self.sources.get(key, ""),
                                    "band" if e is self.band.get(key) else "trainer")
                        for key, evidence in self.evidence.items() for e in evidence]
        marks = {"retired": {key_text(k): e for k, e in self.retired.items()},
                 "warned": sorted(self.warned)}
        return write_observations(store, dataset, observations, marks)

    def advance(self, store: Any, dataset: str, version: int,
                read: Mapping[int, Mapping[str, Any] | None] | None = None) -> bool:
        """Fold in the versions after the last one folded, up to `version` (their entries
        from `read` where it has them); whether any difficulty entry changed the book."""
        changed = False
        for v in range(self.version + 1, version + 1):
            entry = read[v] if read and v in read else _entry(store, dataset, v)
            if entry is not None:
                self.apply(entry, store, dataset)
                changed = True
        self.version = max(self.version, version)
        return changed

    def apply(self, entry: Mapping[str, Any], store: Any = None, dataset: str = "") -> None:
        """One version's difficulty entry: its observations, retirements and revivals."""
        ref = entry.get("observations")
        if ref:
            self.add(read_observations(store, dataset, ref))
        self.mark(entry)

    def mark(self, entry: Mapping[str, Any]) -> None:
        """A difficulty entry's retirements, revivals and warnings."""
        for item in entry.get("retired") or ():
            self.retired[int(item["key"], 16)] = dict(item)
        for item in entry.get("revived") or ():
            self.retired.pop(int(item["key"], 16), None)
        for warning in entry.get("warnings") or ():
            self.warned.add(str(warning.get("source")))

    def add(self, observations: Iterable[Observation]) -> None:
        """Observations made meanwhile (a round's own, before it commits them)."""
        for o in observations:
            e = Evidence(o.step, o.passed, o.samples)
            self.evidence.setdefault(o.key, []).append(e)
            if o.source:
                self.sources[o.key] = o.source
            if o.kind == "band":
                self.band[o.key] = e
            self.now = max(self.now, o.step)

    def overlaid(self, observations: Iterable[Observation]) -> DifficultyBook:
        """A book with `observations` added to this one's, which is left as it was."""
        obs = list(observations)
        out = replace(self, evidence=dict(self.evidence), sources=dict(self.sources),
                      band=dict(self.band), retired=dict(self.retired), warned=set(self.warned))
        for key in {o.key for o in obs}:  # the lists `add` extends: copies, not this book's
            out.evidence[key] = list(self.evidence.get(key, ()))
        out.add(obs)
        return out

    def estimate(self, key: int, half_life: float, now: int | None = None) -> Posterior:
        """The row's posterior at `now` (the newest step observed by default)."""
        return posterior(self.evidence.get(key, ()), self.now if now is None else now,
                         half_life)

    def shown(self, prompt: Any, half_life: float = 4.0) -> dict[str, Any] | None:
        """What the record says of the row with this prompt (None: nothing observed)."""
        key = prompt_key(prompt)
        if key not in self.evidence and key not in self.retired:
            return None
        post = self.estimate(key, half_life)
        retired = self.retired.get(key)
        return {"pass_rate": round(post.mean, 4), "samples": post.samples,
                "last_step": post.last_step, "retired": retired.get("why") if retired else None}

    def recent(self, key: int, window: int) -> tuple[int, int]:
        """(passed, samples) of the row's observations within `window` steps of `now`."""
        rows = [e for e in self.evidence.get(key, ()) if e.step >= self.now - window]
        return sum(e.passed for e in rows), sum(e.samples for e in rows)


def _entry(store: Any, dataset: str, version: int) -> Mapping[str, Any] | None:
    """Version `version`'s difficulty entry, if it has one."""
    entry = (store.record(dataset, version).lineage or {}).get(LINEAGE_KEY)
    return entry if isinstance(entry, Mapping) else None
