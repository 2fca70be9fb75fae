"""verl parquet / jsonl import as version 0 and export back to one parquet file."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dyngen.errors import ImportFormatError
from dyngen.store import Store
from dyngen.trainers.verl_format import export_version, import_files
from tests.rows import verl_rows


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_parquet_import_export_round_trip_gives_identical_rows(tmp_path: Path) -> None:
    rows = verl_rows(30)
    rows[3]["prompt"][1]["content"] = "Ünïcödé ≤ 你好 🙂"
    src = write_parquet(tmp_path / "train.parquet", rows)
    store = Store(tmp_path / "root")
    rec = import_files(store, "gsm", [src])
    assert (rec.version, rec.rows, rec.lineage) == (0, 30, {"imported_from": ["train.parquet"]})
    out = export_version(store, "gsm", tmp_path / "out" / "v0.parquet")
    original, exported = pq.read_table(src), pq.read_table(out)
    assert exported.column_names == original.column_names
    assert exported.to_pylist() == original.to_pylist() == rows


def test_export_of_a_later_version_holds_appended_rows_and_optional_provenance(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "root")
    import_files(store, "gsm", [write_parquet(tmp_path / "a.parquet", verl_rows(3))])
    store.append("gsm", verl_rows(2, start=3), generator="Gen")
    plain = pq.read_table(export_version(store, "gsm", tmp_path / "v1.parquet"))
    assert plain.to_pylist() == verl_rows(5)
    v0 = pq.read_table(export_version(store, "gsm", tmp_path / "v0.parquet", version=0))
    assert v0.num_rows == 3
    traced = pq.read_table(
        export_version(store, "gsm", tmp_path / "p.parquet", with_provenance=True)
    )
    assert traced.column("_dyngen_version").to_pylist() == [0, 0, 0, 1, 1]
    assert traced.column("_dyngen_generator").to_pylist()[-1] == "Gen"


def test_jsonl_and_several_files_import_in_order(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in verl_rows(2)))
    b = write_parquet(tmp_path / "b.parquet", verl_rows(2, start=2))
    store = Store(tmp_path / "root")
    import_files(store, "mix", [a, b])
    assert [e["index"] for e in store.load("mix")["extra_info"]] == [0, 1, 2, 3]


def test_missing_columns_are_named(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "reward_model"} for r in verl_rows(2)]
    src = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(ImportFormatError, match=r"lacks verl columns \['reward_model'\]"):
        import_files(Store(tmp_path / "root"), "bad", [src])
    assert not (tmp_path / "root").exists()


def test_plain_string_prompt_is_refused_with_a_fix(tmp_path: Path) -> None:
    rows = verl_rows(2)
    for r in rows:
        r["prompt"] = "What is 1 + 1?"
    src = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(ImportFormatError, match="list of {role, content} messages.*Wrap"):
        import_files(Store(tmp_path / "root"), "bad", [src])


@pytest.mark.parametrize("name,content", [("x.csv", "a,b\n"), ("nope.parquet", None),
                                          ("broken.parquet", "not parquet")])
def test_unreadable_inputs_are_clear_errors(tmp_path: Path, name: str, content: str | None) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ImportFormatError, match=name):
        import_files(Store(tmp_path / "root"), "bad", [path])


def test_a_pretty_printed_json_array_imports_as_verl_reads_it(tmp_path: Path) -> None:
    """`datasets.load_dataset("json")`, verl's reader of `.json` files, also reads one JSON
    array of rows, as verl's own tests write it (`json.dump(rows, f, indent=2)`)."""
    src = tmp_path / "rows.json"
    src.write_text(json.dumps(verl_rows(3), indent=2))
    store = Store(tmp_path / "root")
    assert import_files(store, "arr", [src]).rows == 3
    assert [e["index"] for e in store.load("arr")["extra_info"]] == [0, 1, 2]
    src.write_text(json.dumps([1, 2]))
    with pytest.raises(ImportFormatError, match="JSON array of objects"):
        import_files(store, "bad", [src])


def test_ability_and_extra_info_are_optional_as_in_verl(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k not in ("ability", "extra_info")}
            for r in verl_rows(2)]
    store = Store(tmp_path / "root")
    import_files(store, "lean", [write_parquet(tmp_path / "lean.parquet", rows)])
    loaded = store.load("lean")
    assert "ability" not in loaded.column_names and loaded[0]["prompt"] == rows[0]["prompt"]


def test_as_verl_only_the_prompt_is_required_and_it_may_be_a_string(tmp_path: Path) -> None:
    rows = [{"prompt": f"What is {i} + {i}?"} for i in range(2)]
    src = write_parquet(tmp_path / "plain.parquet", rows)
    store = Store(tmp_path / "root")
    with pytest.raises(ImportFormatError, match="lacks verl columns"):
        import_files(store, "plain", [src])
    assert import_files(store, "plain", [src], as_verl=True).rows == 2
    assert store.load("plain")["prompt"] == ["What is 0 + 0?", "What is 1 + 1?"]
