"""A Delta mirror's data files: each dyngen shard's rows as one Parquet file of its own.

dyngen's shards are Arrow IPC streams, which Delta readers do not read, so the mirror
holds a Parquet copy of each shard, named after the shard and the version that added it
(`dyngen-<shard>-v<version>.parquet`): from the names alone the mirror knows which of its
files hold which shard, so no other index is kept beside the Delta log.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dyngen.store.location import split_url
from dyngen.store.records import ShardInfo

FILE_NAME = re.compile(r"dyngen-(?P<stem>[A-Za-z0-9_-]+)-v(?P<version>\d+)\.parquet")
ROW_GROUP_ROWS = 128 * 1024  # Parquet readers' usual row-group size
# Unsigned integers have no Delta type: each becomes the next wider signed one.
_UNSIGNED = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64(),
             pa.uint64(): pa.decimal128(20, 0)}


def shard_stem(info: ShardInfo) -> str:
    """The shard's name without folder and suffix (a uuid): what names its mirror files."""
    return info.path.rsplit("/", 1)[-1].rsplit(".", 1)[0]


def file_name(info: ShardInfo, version: int) -> str:
    """The mirror file that holds `info`'s rows from Delta version `version` on."""
    return f"dyngen-{shard_stem(info)}-v{version}.parquet"


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` in types a Delta table has (no metadata): the schema the mirror writes.

    Delta has no null, unsigned, half-float, dictionary or nanosecond types: a column of
    only nulls becomes a string column (its values stay null), unsigned integers the next
    wider signed type, timestamps microseconds. Everything else is kept as it is.
    """
    return pa.schema([_field(f) for f in schema])


def _field(fld: pa.Field) -> pa.Field:
    return pa.field(fld.name, _delta_type(fld.type), nullable=fld.nullable)


def _delta_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(_field(t.value_field))
    if pa.types.is_map(t):
        return pa.map_(_delta_type(t.key_type), _delta_type(t.item_type))
    if pa.types.is_dictionary(t):
        return _delta_type(t.value_type)
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    return _UNSIGNED.get(t, t)


def parquet_bytes(table: pa.Table) -> bytes:
    """`table` as the bytes of one Parquet file (no schema metadata)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(None), sink, row_group_size=ROW_GROUP_ROWS)
    return sink.getvalue().to_pybytes()


def file_stats(table: pa.Table) -> str:
    """Delta's per-file statistics: the row count, null counts of the flat columns, and
    the minimum and maximum of integer columns (so `_dyngen_version >= N` skips files)."""
    rows = table.num_rows
    nulls: dict[str, int] = {}
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_nested(column.type):
            continue
        nulls[name] = column.null_count
        if pa.types.is_integer(column.type) and column.null_count < rows:
            found = pc.min_max(column)
            low[name], high[name] = found["min"].as_py(), found["max"].as_py()
    return json.dumps({"numRecords": rows, "minValues": low, "maxValues": high,
                       "nullCount": nulls}, separators=(",", ":"))


def now_ms() -> int:
    """The time Delta actions carry, in milliseconds since the epoch."""
    return int(time.time() * 1000)


def delta_options(dest: str, fs_options: Mapping[str, Any] | None,
                  extra: Mapping[str, Any] | None) -> dict[str, str]:
    """delta-rs's storage options for `dest`: an S3 destination's endpoint, keys and region
    taken from the fsspec options that reach it (s3fs's names), plain http allowed when the
    endpoint (or $AWS_ENDPOINT_URL) is http, then `extra` as it is."""
    out: dict[str, str] = {}
    parts = split_url(dest)
    if parts is None or parts[0] not in ("s3", "s3a"):
        out.update({str(k): str(v) for k, v in (extra or {}).items()})
        return out
    fs_options = fs_options or {}
    client = dict(fs_options.get("client_kwargs") or {})
    endpoint = fs_options.get("endpoint_url") or client.get("endpoint_url")
    if endpoint:
        out["AWS_ENDPOINT_URL"] = str(endpoint)
    # delta-rs refuses plain http unless told; fsspec (botocore) does not ask.
    seen = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if str(seen or "").startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"
    for ours, theirs in (("key", "AWS_ACCESS_KEY_ID"), ("secret", "AWS_SECRET_ACCESS_KEY"),
                         ("token", "AWS_SESSION_TOKEN"), ("profile", "AWS_PROFILE")):
        if fs_options.get(ours):
            out[theirs] = str(fs_options[ours])
    region = client.get("region_name") or fs_options.get("region_name")
    if region:
        out["AWS_REGION"] = str(region)
    out.update({str(k): str(v) for k, v in (extra or {}).items()})
    return out
