"""Shard files: Arrow IPC streams that `datasets` memory-maps.

`datasets` (and pandas behind it) is imported only where rows are read or written:
commands that only read the log (`dyngen log`) start in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow as pa

from dyngen.errors import SchemaMismatchError
from dyngen.store.backend import Backend
from dyngen.store.records import ShardInfo

if TYPE_CHECKING:
    import datasets
    from datasets.table import MemoryMappedTable, Table

    Rows = datasets.Dataset | pa.Table | list[Mapping[str, Any]] | Mapping[str, list[Any]]

# Provenance columns the store adds to every row, so a row can be traced to its version.
VERSION_COLUMN = "_dyngen_version"
ROUND_COLUMN = "_dyngen_round"
GENERATOR_COLUMN = "_dyngen_generator"
PROVENANCE_FIELDS = (
    pa.field(VERSION_COLUMN, pa.int64()),
    pa.field(ROUND_COLUMN, pa.string()),
    pa.field(GENERATOR_COLUMN, pa.string()),
)
PROVENANCE_COLUMNS = tuple(f.name for f in PROVENANCE_FIELDS)
# verl's free-form per-row dict: a round may add fields to it (older rows read them as null).
EVOLVING_COLUMN = "extra_info"

_BATCH_ROWS = 65_536
_HASH_CHUNK = 8 << 20
# Shards are immutable, so a checksum verified once stays valid while the file's identity
# (inode, size, mtime) is unchanged; this keeps `refresh()` cost proportional to new shards.
_verified: set[tuple[str, int, int, int]] = set()
# Shards opened in this process, by file identity: a reader that maps a newer version opens
# only the shards it has not opened yet (bounded: each holds a memory map).
_OPENED_CACHE = 1024
_opened: OrderedDict[tuple[str, int, int, int], MemoryMappedTable] = OrderedDict()


def to_table(rows: Rows) -> pa.Table:
    """Convert any accepted row container to an Arrow table without copying Arrow data."""
    import datasets

    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, datasets.Dataset):
        # An indices mapping (after select/shuffle) must be applied; plain datasets are free.
        return rows.with_format("arrow")[:] if len(rows) else rows.data.table.slice(0, 0)
    if isinstance(rows, Mapping):
        return pa.table(dict(rows))
    if isinstance(rows, list):
        return table_from_dicts(rows)
    raise TypeError(
        "rows must be a datasets.Dataset, pyarrow.Table, list of dicts or dict of lists; "
        f"found {type(rows).__name__}"
    )


def table_from_dicts(rows: list[Mapping[str, Any]]) -> pa.Table:
    """Rows given as dicts as a table whose columns are every key of every row, in the
    order first seen; a row without a key holds null there.

    `pa.Table.from_pylist` (and `datasets.Dataset.from_list`) take the columns from the
    first row alone and silently drop every other row's extra keys.
    """
    names: dict[str, None] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"rows given as a list must be dicts; row {i} is a "
                            f"{type(row).__name__}")
        names.update(dict.fromkeys(row))
    columns = {}
    for name in names:
        try:
            columns[name] = pa.array([row.get(name) for row in rows])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SchemaMismatchError(
                f"column {name!r} holds values of different kinds in different rows ({exc}); "
                "give the field one type in every row."
            ) from exc
    return pa.table(columns)


def with_provenance(table: pa.Table, version: int, round_id: str | None,
                    generator: str | None) -> pa.Table:
    """Set the provenance columns of every row (replacing any already present)."""
    n = len(table)
    values = (
        pa.array([version] * n, pa.int64()),
        pa.array([round_id] * n, pa.string()),
        pa.array([generator] * n, pa.string()),
    )
    for fld, arr in zip(PROVENANCE_FIELDS, values, strict=True):
        if fld.name in table.column_names:
            table = table.set_column(table.column_names.index(fld.name), fld, arr)
        else:
            table = table.append_column(fld, arr)
    return table


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Cast `table` to `schema`: reorder fields, fill absent ones with null, refuse extras.

    Arrow's struct cast silently drops fields the target lacks; dropping a user's data
    without a word is never acceptable, so extras are found first and reported.
    """
    extra = [c for c in table.column_names if c not in schema.names]
    extra += [p for f in schema if f.name in table.column_names
              for p in _dropped_fields(table.schema.field(f.name).type, f.type, f.name)]
    if extra:
        raise SchemaMismatchError(
            f"rows have fields the dataset schema lacks: {', '.join(extra)}. Expected only "
            f"the dataset's columns ({', '.join(schema.names)}; new fields may be added inside "
            f"{EVOLVING_COLUMN}); drop or rename those fields, or move them into "
            f"{EVOLVING_COLUMN}."
        )
    for fld in schema:
        src = table.schema.field(fld.name).type if fld.name in table.column_names else None
        changed = [] if src is None else _changed_kinds(src, fld.type, fld.name)
        if changed:
            raise SchemaMismatchError(
                f"column {fld.name!r}: expected {fld.type}, found {src} ({'; '.join(changed)})."
                " The store converts no value between text, numbers and booleans (\"7\" is "
                "not stored as 7, nor 3 as \"3\"): give each field the dataset's type."
            )
    columns = []
    for fld in schema:
        if fld.name not in table.column_names:
            columns.append(pa.nulls(len(table), fld.type))
            continue
        col = table.column(fld.name)
        try:
            columns.append(col.cast(fld.type) if col.type != fld.type else col)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaMismatchError(
                f"column {fld.name!r}: expected {fld.type}, found {col.type} that cannot be "
                f"converted ({exc}). Fix the rows so the column has the dataset's type."
            ) from exc
    return pa.Table.from_arrays(columns, schema=schema)


def widen(schema: pa.Schema, rows: pa.Schema) -> pa.Schema:
    """`schema` with the fields `rows` adds inside extra_info appended, as Hugging Face types.

    Generators record per-row facts there (which seed task, which model); a dataset's
    version 0 cannot foresee them. Every other difference is refused by `conform`. A field
    that holds only nulls adds nothing.
    """
    name = EVOLVING_COLUMN
    if name not in schema.names or name not in rows.names:
        return schema
    old, new = schema.field(name).type, rows.field(name).type
    if not (pa.types.is_struct(old) and pa.types.is_struct(new)):
        return schema
    have = {old.field(i).name for i in range(old.num_fields)}
    added = [new.field(i) for i in range(new.num_fields)
             if new.field(i).name not in have and not pa.types.is_null(new.field(i).type)]
    if not added:
        return schema
    wide = pa.struct([old.field(i) for i in range(old.num_fields)] + added)
    widened = schema.set(schema.get_field_index(name), schema.field(name).with_type(wide))
    try:
        return schema_from_json(schema_to_json(widened))
    except (TypeError, ValueError, NotImplementedError):
        return schema  # a type datasets cannot describe: `conform` names the fields


def evolves_to(old: pa.Schema, new: pa.Schema) -> bool:
    """Whether rows of schema `old` read as `new` once fields added by `widen` are null."""
    return widen(old, new).equals(new, check_metadata=False)


def _dropped_fields(src: pa.DataType, dst: pa.DataType, path: str) -> list[str]:
    """Nested field paths present in `src` that a cast to `dst` would silently drop."""
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        dst_names = {dst.field(i).name: dst.field(i).type for i in range(dst.num_fields)}
        out: list[str] = []
        for i in range(src.num_fields):
            f = src.field(i)
            if f.name not in dst_names:
                if not pa.types.is_null(f.type):  # only nulls: nothing is lost
                    out.append(f"{path}.{f.name}")
            else:
                out += _dropped_fields(f.type, dst_names[f.name], f"{path}.{f.name}")
        return out
    if is_list(src) and is_list(dst):
        return _dropped_fields(src.value_type, dst.value_type, f"{path}[]")
    return []


def _changed_kinds(src: pa.DataType, dst: pa.DataType, path: str) -> list[str]:
    """Where a cast from `src` to `dst` would change what a value is, not only its width.

    Kept: nulls into any type, integers into wider integers or floats, floats into floats,
    text and binary between their offset widths, struct fields reordered or missing, and
    lists between their offset widths; each nested field by the same rules.
    """
    if src == dst or pa.types.is_null(src):
        return []
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        inner = {dst.field(i).name: dst.field(i).type for i in range(dst.num_fields)}
        return [m for i in range(src.num_fields) if src.field(i).name in inner
                for m in _changed_kinds(src.field(i).type, inner[src.field(i).name],
                                        f"{path}.{src.field(i).name}")]
    if is_list(src) and is_list(dst):
        return _changed_kinds(src.value_type, dst.value_type, f"{path}[]")
    if pa.types.is_dictionary(src):
        return _changed_kinds(src.value_type, dst, path)
    same = [(pa.types.is_integer, (pa.types.is_integer, pa.types.is_floating)),
            (pa.types.is_floating, (pa.types.is_floating,)),
            (_is_text, (_is_text,)), (_is_binary, (_is_binary,)),
            (pa.types.is_boolean, (pa.types.is_boolean,)),
            (pa.types.is_timestamp, (pa.types.is_timestamp,)),
            (pa.types.is_date, (pa.types.is_date,)),
            (pa.types.is_decimal, (pa.types.is_decimal,))]
    if any(is_src(src) and any(ok(dst) for ok in into) for is_src, into in same):
        return []
    return [f"{path} is {src}, the dataset's is {dst}"]


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)


def is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def write_shard(backend: Backend, rel: str, table: pa.Table) -> ShardInfo:
    """Write `table` as a new immutable shard `rel` (which must not exist); hash as it goes."""
    if table.num_rows and len(table.to_batches()) > -(-table.num_rows // _BATCH_ROWS):
        # Many small chunks (rows gathered from many shards) would make a reader walk
        # thousands of record batches: write them as few large ones.
        table = table.combine_chunks()
    out = _HashingWriter()

    def write(fh: BinaryIO) -> None:
        out.target = fh
        with pa.ipc.new_stream(out, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=_BATCH_ROWS):
                writer.write_batch(batch)

    backend.write_new(rel, write)
    return ShardInfo(path=rel.split("/", 1)[1], rows=len(table), bytes=out.size,
                     sha256=out.digest.hexdigest())


class _HashingWriter:
    """A file-like sink that hashes and counts what Arrow writes through it."""

    def __init__(self) -> None:
        self.target: BinaryIO | None = None
        self.digest = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        """Hash, count and pass on one chunk."""
        view = memoryview(data)
        self.digest.update(view)
        self.size += view.nbytes
        assert self.target is not None
        return self.target.write(view)

    def flush(self) -> None:
        """Flush the file underneath."""
        if self.target is not None:
            self.target.flush()

    def tell(self) -> int:
        """Bytes written so far."""
        return self.size


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def check_shard(path: Path, info: ShardInfo, *, checksum: bool = True) -> str | None:
    """Describe what is wrong with a shard file, or return None if it matches its record."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"shard {info.path} is missing"
    if st.st_size != info.bytes:
        return f"shard {info.path} has {st.st_size} bytes, its record says {info.bytes}"
    if not checksum:
        return None
    if is_verified(path, st):
        return None
    actual = file_sha256(path)
    if actual != info.sha256:
        return f"shard {info.path} checksum is {actual[:12]}…, its record says {info.sha256[:12]}…"
    mark_verified(path, st)
    return None


def is_verified(path: Path, st: os.stat_result | None = None) -> bool:
    """Whether this file, unchanged since, matched its record's checksum in this process."""
    st = st or path.stat()
    return (str(path), st.st_ino, st.st_size, st.st_mtime_ns) in _verified


def mark_verified(path: Path, st: os.stat_result | None = None) -> None:
    """Remember that this file (while unchanged) matches its record's checksum."""
    st = st or path.stat()
    _verified.add((str(path), st.st_ino, st.st_size, st.st_mtime_ns))


def open_table(path: Path) -> MemoryMappedTable:
    """Memory-map one shard as a table; a shard opened before (same file) is reused."""
    from datasets.table import MemoryMappedTable

    st = path.stat()
    identity = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    table = _opened.get(identity)
    if table is None:
        table = MemoryMappedTable.from_file(str(path))
        _opened[identity] = table
        if len(_opened) > _OPENED_CACHE:
            _opened.popitem(last=False)
    else:
        _opened.move_to_end(identity)
    return table


def as_dataset(tables: list[Table], schema: pa.Schema, fingerprint: str) -> datasets.Dataset:
    """Tables (memory-mapped) as one Dataset in `schema`, without copying a row.

    Shards written before a round added extra_info fields read them as null. The
    fingerprint is given, not computed: datasets would hash every block's history.
    """
    import datasets
    from datasets.table import InMemoryTable, concat_tables

    parts = [t if t.schema.equals(schema, check_metadata=False) else t.cast(schema)
             for t in tables]
    if not parts:
        return datasets.Dataset(InMemoryTable(schema.empty_table()), fingerprint=fingerprint)
    table = parts[0] if len(parts) == 1 else concat_tables(parts)
    return datasets.Dataset(table, fingerprint=fingerprint)


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """A readable, comparable JSON form of an Arrow schema (Hugging Face features)."""
    import datasets

    return datasets.Features.from_arrow_schema(schema).to_dict()


def schema_from_json(data: Mapping[str, Any]) -> pa.Schema:
    """Inverse of `schema_to_json`."""
    import datasets

    return datasets.Features.from_dict(dict(data)).arrow_schema
