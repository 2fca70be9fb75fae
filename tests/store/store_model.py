"""A reference model of one dataset in the store, for the property-based suites.

It knows only what the public API promises: each version's rows (with the version that
added them), each version's extra_info fields, which versions retention expired, which
version each idempotency key committed and each generator's newest version. It never
reads the store; `check` compares a Store with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import datasets
import pyarrow as pa
import pytest

from dyngen.errors import VersionVacuumedError
from dyngen.store import Store, gc, verify

BASE_FIELDS = ("index", "split")
EXTRA_FIELDS = ("seed", "model", "note")
OPTIONAL = ("ability", "reward_model", "extra_info")
FORMS = ("dicts", "dataset", "dataset_selected", "arrow", "columns")


def make_row(i: int, omit: frozenset[str] = frozenset(),
             extra: dict[str, str] | None = None) -> dict[str, Any]:
    """A verl row with index `i`, without the optional keys in `omit`, with `extra`
    fields inside extra_info."""
    row: dict[str, Any] = {
        "data_source": "model",
        "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        "extra_info": {"index": i, "split": "train", **(extra or {})},
    }
    return {k: v for k, v in row.items() if k not in omit}


def as_form(rows: list[dict[str, Any]], form: str) -> Any:
    """The rows in one of the input forms `Store.append` takes (built without dyngen)."""
    names = list(dict.fromkeys(k for r in rows for k in r))
    columns = {n: [r.get(n) for r in rows] for n in names}
    if form == "dicts":
        return rows
    if form == "columns":
        return columns
    if form == "arrow":
        return pa.table(columns) if rows else pa.table({})
    if form == "dataset":
        return datasets.Dataset.from_dict(columns)
    assert form == "dataset_selected"  # an indices mapping over the rows in reverse
    backwards = datasets.Dataset.from_dict({n: c[::-1] for n, c in columns.items()})
    return backwards.select(range(len(rows) - 1, -1, -1))


@dataclass(frozen=True)
class Version:
    """What one version is: its rows (added version, row as given) and extra_info fields."""

    rows: tuple[tuple[int, dict[str, Any], str | None], ...]
    fields: tuple[str, ...]
    operation: str
    rejected: tuple[dict[str, str], ...] = ()  # the quarantine: every round's, so far


@dataclass
class Model:
    """The dataset as the public API describes it."""

    versions: list[Version] = field(default_factory=list)
    keys: dict[str, int] = field(default_factory=dict)
    generators: dict[str, int] = field(default_factory=dict)
    expired_before: int = 0
    # Each version's running state: (retention's expired_before, generators' versions).
    running: list[tuple[int, dict[str, int]]] = field(default_factory=list)

    @property
    def head(self) -> int:
        return len(self.versions) - 1

    def create(self, rows: list[dict[str, Any]]) -> None:
        self.versions.append(Version(tuple((0, r, "import") for r in rows),
                                     self._widen(BASE_FIELDS, rows), "create"))
        self._stamp()

    def append(self, rows: list[dict[str, Any]], key: str | None, generator: str | None,
               rejected: list[dict[str, str]] | None = None) -> int:
        """The version the append lands as (an existing one for a committed key)."""
        if key is not None and key in self.keys:
            return self.keys[key]
        parent = self.versions[-1]
        version = self.head + 1
        added = tuple((version, r, None) for r in rows)
        self.versions.append(Version(parent.rows + added, self._widen(parent.fields, rows),
                                     "append", parent.rejected + tuple(rejected or ())))
        self._keyed(key, version)
        if generator is not None:
            self.generators[generator] = version
        self._stamp()
        return version

    def restore(self, old: int, key: str | None) -> int:
        if key is not None and key in self.keys:
            return self.keys[key]
        if old < self.expired_before:
            raise VersionVacuumedError(f"model: version {old} is expired")
        source = self.versions[old]  # its rows; the quarantine stays the parent's
        self.versions.append(Version(source.rows, source.fields, "restore",
                                     self.versions[-1].rejected))
        self._keyed(key, self.head)
        self._stamp()
        return self.head

    def same_rows(self, operation: str) -> None:
        """A compact or vacuum version: the head's rows and fields, unchanged."""
        head = self.versions[-1]
        self.versions.append(Version(head.rows, head.fields, operation, head.rejected))
        self._stamp()

    def _stamp(self) -> None:
        self.running.append((self.expired_before, dict(self.generators)))

    def boundary(self, keep_versions: int | None, keep_days: float | None) -> int:
        """The oldest version a vacuum with these rules keeps loadable."""
        keep = []
        if keep_versions is not None:
            version, count = self.head, keep_versions
            while version > 0:
                if self.versions[version].operation != "vacuum":
                    count -= 1
                    if count == 0:
                        break
                version -= 1
            keep.append(version)
        if keep_days is not None:  # the suite uses 0 days (only the head) or a year (all)
            version = self.head if keep_days == 0 else 0
            while version > 0 and self.versions[version].operation == "vacuum":
                version -= 1  # a vacuum changes no row: the data version under it is kept
            keep.append(version)
        return max(0, min(keep))

    def _keyed(self, key: str | None, version: int) -> None:
        if key is not None:
            self.keys[key] = version

    @staticmethod
    def _widen(fields: tuple[str, ...], rows: list[dict[str, Any]]) -> tuple[str, ...]:
        seen = dict.fromkeys(fields)
        for r in rows:
            seen.update(dict.fromkeys(r.get("extra_info") or {}))
        return tuple(seen)

    # ---- what a store must show ---------------------------------------------------
    def expected_rows(self, version: int) -> list[dict[str, Any]]:
        v = self.versions[version]
        out = []
        for added, row, generator in v.rows:
            extra = row.get("extra_info")
            out.append({
                "data_source": row["data_source"], "prompt": row["prompt"],
                "ability": row.get("ability"), "reward_model": row.get("reward_model"),
                "extra_info": None if extra is None else {f: extra.get(f) for f in v.fields},
                "_dyngen_version": added, "_dyngen_round": None,
                "_dyngen_generator": generator,
            })
        return out


def check(model: Model, store: Store, name: str, *, every_version: bool = True) -> None:
    """Everything the public API says about the dataset agrees with the model."""
    assert store.head_version(name) == model.head
    state = store.state(name)
    assert state.expired_before == model.expired_before
    assert dict(state.generators) == model.generators
    for generator, version in model.generators.items():
        found = store.newest_by_generator(name, generator)
        assert found is not None and found.version == version
    for key, version in model.keys.items():
        found = store.find_idempotency_key(name, key)
        assert found is not None and found.version == version, key
    versions = range(model.head + 1) if every_version else [model.head]
    for version in versions:
        if version < model.expired_before:
            with pytest.raises(VersionVacuumedError):
                store.load(name, version)
            with pytest.raises(VersionVacuumedError):
                store.to_arrow(name, version)
            with pytest.raises(VersionVacuumedError):
                store.load_rejected(name, version)
            continue
        expected = model.expected_rows(version)
        ds = store.load(name, version)
        # The fields' order is the rows' own (a Dataset's struct type): compared as a set.
        assert set(ds.features["extra_info"]) == set(model.versions[version].fields)
        assert ds.to_list() == expected, f"version {version}"
        assert store.to_arrow(name, version).to_pylist() == expected, f"version {version}"
        assert store.record(name, version).rows == len(expected)
        expired, generators = model.running[version]
        old = store.state(name, version)
        assert (old.expired_before, dict(old.generators)) == (expired, generators)
        restored = any(model.versions[v].operation == "restore"
                       for v in range(version + 1, model.head + 1))
        assert store.extends(name, version, model.head) is not restored
        assert store.load_rejected(name, version).to_list() == list(
            model.versions[version].rejected), f"quarantine of version {version}"


def check_maintenance(store: Store, name: str) -> None:
    """verify finds nothing, and gc finds no orphan (every operation cleans up after itself)."""
    assert verify(store, name) == []
    assert gc(store, name, grace_seconds=0, dry_run=True) == []
