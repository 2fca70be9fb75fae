"""verl's RL parquet format: import files as version 0, export any version back."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from dyngen.errors import ImportFormatError
from dyngen.store import PROVENANCE_COLUMNS, Store, VersionRecord

REQUIRED_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def read_verl_files(paths: Sequence[str | os.PathLike[str]],
                    prompt_key: str = "prompt") -> pa.Table:
    """Read verl-format .parquet / .jsonl files into one table, checking the row schema."""
    if not paths:
        raise ImportFormatError("no input files given; pass one or more .parquet or .jsonl files.")
    tables = [_read_one(Path(p), prompt_key) for p in paths]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ImportFormatError(
            f"the input files have incompatible schemas ({exc}); import them into separate "
            "datasets or make their columns agree."
        ) from exc


def _read_one(path: Path, prompt_key: str) -> pa.Table:
    if not path.is_file():
        raise ImportFormatError(f"input file {path} does not exist.")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            table = pq.read_table(path)
        elif suffix in (".jsonl", ".json"):
            table = pj.read_json(path)
        else:
            raise ImportFormatError(
                f"input file {path}: expected a .parquet or .jsonl file, found {suffix or 'no'} "
                "suffix."
            )
    except (OSError, pa.ArrowException) as exc:
        raise ImportFormatError(f"input file {path} could not be read as {suffix}: {exc}") from exc
    required = [prompt_key if c == "prompt" else c for c in REQUIRED_COLUMNS]
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise ImportFormatError(
            f"input file {path} lacks verl columns {missing}; expected {required}, found "
            f"{table.column_names}. Convert it with verl's data preprocessing scripts first."
        )
    _check_prompt_type(path, prompt_key, table.schema.field(prompt_key).type)
    reserved = [c for c in PROVENANCE_COLUMNS if c in table.column_names]
    if reserved:
        raise ImportFormatError(
            f"input file {path} has dyngen's provenance columns {reserved}: it looks like an "
            "export made with --with-provenance. Export without them to import again."
        )
    return table


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
                 prompt_key: str = "prompt") -> VersionRecord:
    """Create dataset `name` at version 0 from verl-format files."""
    table = read_verl_files(paths, prompt_key)
    sources = [os.path.basename(str(p)) for p in paths]
    return store.create(name, table, lineage={"imported_from": sources}, prompt_key=prompt_key)


def export_version(store: Store, name: str, out: str | os.PathLike[str],
                   version: int | None = None, with_provenance: bool = False) -> Path:
    """Write one version as a single parquet file that verl's `data.train_files` reads."""
    table = store.load(name, version).with_format("arrow")[:]
    if not with_provenance:
        table = table.drop_columns([c for c in PROVENANCE_COLUMNS if c in table.column_names])
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    pq.write_table(table.replace_schema_metadata(None), tmp)
    os.replace(tmp, out_path)
    return out_path
