"""verl's RL parquet format: import files as version 0, export any version back."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from dyngen.errors import ImportFormatError
from dyngen.progress import QUIET, Bar
from dyngen.store import PROVENANCE_COLUMNS, Store, VersionRecord

# What a reward needs; verl's RLHFDataset itself reads a file with only its prompt column
# (`ability` is never read, a missing `extra_info` is `{}`, so `index` is 0).
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
EXPORT_ROW_GROUP = 128 * 1024  # rows per row group: parquet readers' usual size


def read_verl_files(paths: Sequence[str | os.PathLike[str]], prompt_key: str = "prompt",
                    progress: Bar = QUIET, as_verl: bool = False) -> pa.Table:
    """Read verl-format .parquet / .jsonl / .json files into one table, checking the row
    schema. `as_verl`: accept what verl's RLHFDataset reads (only the prompt column is
    required, and a prompt may be a plain string), for the verl drop-in."""
    if not paths:
        raise ImportFormatError("no input files given; pass one or more .parquet or .jsonl files.")
    sizes = [_size(Path(p)) for p in paths]
    progress.stage(f"reading {len(paths)} file(s)", sum(sizes) or None, "bytes")
    tables = [_read_one(Path(p), prompt_key, size, progress, as_verl)
              for p, size in zip(paths, sizes, strict=True)]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ImportFormatError(
            f"the input files have incompatible schemas ({exc}); import them into separate "
            "datasets or make their columns agree."
        ) from exc


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # _read_one says what is wrong with it


def _read_one(path: Path, prompt_key: str, size: int, progress: Bar, as_verl: bool) -> pa.Table:
    if not path.is_file():
        raise ImportFormatError(f"input file {path} does not exist.")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            table = _read_parquet(path, size, progress)
        elif suffix in (".jsonl", ".json"):
            table = _read_json(path)
            progress.advance(size)
        else:
            raise ImportFormatError(
                f"input file {path}: expected a .parquet, .jsonl or .json file, found "
                f"{suffix or 'no'} suffix."
            )
    except (OSError, pa.ArrowException) as exc:
        bad_line = _first_bad_json_line(path) if suffix in (".jsonl", ".json") else None
        if bad_line is not None:
            raise ImportFormatError(f"input file {path}: {bad_line}") from exc
        raise ImportFormatError(f"input file {path} could not be read as {suffix}: {exc}") from exc
    required = [prompt_key] if as_verl else \
        [prompt_key if c == "prompt" else c for c in REQUIRED_COLUMNS]
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise ImportFormatError(
            f"input file {path} lacks verl columns {missing}; expected {required}, found "
            f"{table.column_names}. Convert it with verl's data preprocessing scripts first."
        )
    kind = table.schema.field(prompt_key).type
    if not (as_verl and (pa.types.is_string(kind) or pa.types.is_large_string(kind))):
        _check_prompt_type(path, prompt_key, kind)
    reserved = [c for c in PROVENANCE_COLUMNS if c in table.column_names]
    if reserved:
        raise ImportFormatError(
            f"input file {path} has dyngen's provenance columns {reserved}: it looks like an "
            "export made with --with-provenance. Export without them to import again."
        )
    return table


def _read_json(path: Path) -> pa.Table:
    """JSON Lines, or (as `datasets.load_dataset("json")` reads a `.json` file) one JSON
    array of objects, pretty-printed or not."""
    try:
        return pj.read_json(path)
    except pa.ArrowInvalid:
        with path.open(encoding="utf-8") as fh:
            first = fh.read(4096).lstrip()[:1]
        if first != "[":
            raise
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImportFormatError(f"input file {path} is not valid JSON ({exc}).") from exc
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise ImportFormatError(f"input file {path}: expected a JSON array of objects (rows), "
                                "or one JSON object per line.")
    return pa.Table.from_pylist(rows)


def _first_bad_json_line(path: Path) -> str | None:
    """Where a JSONL file stops being one JSON object per line, by its 1-based line number
    (Arrow counts rows from 0 within each block it parses)."""
    try:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as exc:
                    return (f"line {number} is not valid JSON ({exc.msg} at column {exc.colno}); "
                            "expected one JSON object per line. Fix that line.")
                if not isinstance(value, dict):
                    return (f"line {number} is {type(value).__name__} JSON; expected one JSON "
                            "object per line. Fix that line.")
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _read_parquet(path: Path, size: int, progress: Bar) -> pa.Table:
    """The file's table, read one row group at a time so a large file shows progress."""
    parquet = pq.ParquetFile(path)
    groups = parquet.metadata.num_row_groups
    if groups <= 1:
        table = parquet.read()
        progress.advance(size)
        return table
    parts = []
    for i in range(groups):
        parts.append(parquet.read_row_group(i))
        progress.advance(size / groups)
    return pa.concat_tables(parts)


def _check_prompt_type(path: Path, key: str, kind: pa.DataType) -> None:
    ok = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_struct(
        kind.value_type
    )
    if ok:
        names = {kind.value_type.field(i).name for i in range(kind.value_type.num_fields)}
        ok = {"role", "content"} <= names
    if not ok:
        raise ImportFormatError(
            f"input file {path}: column {key!r} must be a list of {{role, content}} messages, "
            f"found type {kind}. Wrap plain prompts as [{{'role': 'user', 'content': text}}]."
        )


def import_files(store: Store, name: str, paths: Sequence[str | os.PathLike[str]],
                 prompt_key: str = "prompt", progress: Bar = QUIET,
                 as_verl: bool = False) -> VersionRecord:
    """Create dataset `name` at version 0 from verl-format files (see read_verl_files)."""
    table = read_verl_files(paths, prompt_key, progress, as_verl)
    sources = [os.path.basename(str(p)) for p in paths]
    return store.create(name, table, lineage={"imported_from": sources}, prompt_key=prompt_key,
                        progress=progress)


def export_version(store: Store, name: str, out: str | os.PathLike[str],
                   version: int | None = None, with_provenance: bool = False,
                   progress: Bar = QUIET) -> Path:
    """Write one version as a single parquet file that verl's `data.train_files` reads."""
    progress.stage(f"loading {name} " + ("head" if version is None else f"v{version}") +
                   " (checksums)")
    table = store.load(name, version).with_format("arrow")[:]
    if not with_provenance:
        table = table.drop_columns([c for c in PROVENANCE_COLUMNS if c in table.column_names])
    table = table.replace_schema_metadata(None)
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    progress.stage(f"writing {out_path.name}", len(table), "rows")
    try:
        with pq.ParquetWriter(tmp, table.schema) as writer:
            # Slices of EXPORT_ROW_GROUP rows: each is one row group and one progress step.
            for start in range(0, max(len(table), 1), EXPORT_ROW_GROUP):
                part = table.slice(start, EXPORT_ROW_GROUP)
                writer.write_table(part)
                progress.advance(len(part))
        os.replace(tmp, out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out_path
