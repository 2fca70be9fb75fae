"""An in-process policy: from a trainer's output_dir, the newest complete checkpoint and its
training step, loaded again (the old copy dropped) when a newer one lands; and sampled as
an OpenAI-compatible server and TRL sample, with no top-k cut the model does not ask for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dyngen.errors import ConfigError
from dyngen.llm.checkpoints import newest_checkpoint, policy_step, step_in_name


def checkpoint(out: Path, step: int, state: str | None = "whole") -> Path:
    """`out/checkpoint-<step>` with a model config and, unless None, a trainer_state.json
    ("whole", or "partial": cut mid-write)."""
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    text = json.dumps({"global_step": step, "log_history": []})
    if state is not None:
        (folder / "trainer_state.json").write_text(text if state == "whole" else text[:9])
    return folder


def test_the_newest_complete_checkpoint_and_its_step(tmp_path: Path) -> None:
    assert newest_checkpoint(tmp_path) is None and newest_checkpoint(tmp_path / "no") is None
    checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 10)
    checkpoint(tmp_path, 12, state="partial")  # the Trainer is still writing it
    checkpoint(tmp_path, 14, state=None)  # its weights are written, its state not yet
    (tmp_path / "checkpoint-99").write_text("a file, not a checkpoint")
    newest = newest_checkpoint(tmp_path)
    assert newest == tmp_path / "checkpoint-10"  # numerically newest, not "checkpoint-2"
    assert newest is not None and policy_step(newest) == 10
    assert policy_step(tmp_path / "checkpoint-14") == 14  # from its name
    assert policy_step(tmp_path) is None


@pytest.mark.parametrize(("name", "step"), [
    ("/runs/a/checkpoint-40", 40), ("checkpoint-7", 7), ("ckpt/global_step_120/actor", 120),
    ("/runs/checkpoint-3/checkpoint-5", 5), ("policy", None), ("my-checkpoint-x", None),
    ("SmolLM2-135M", None), (None, None), ("model-checkpoint-12", 12)])
def test_the_step_a_served_models_name_holds(name: str | None, step: int | None) -> None:
    assert step_in_name(name) == step


def tiny_model(folder: Path, seed: int) -> None:
    """A real (tiny, random) Llama model with SmolLM2's tokenizer, saved to `folder`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from dyngen.llm.weights import converted_folder, model_location

    base, gguf = model_location({})
    tokenizer = AutoTokenizer.from_pretrained(
        converted_folder(base / str(gguf), Path.home() / ".cache" / "dyngen" / "models"))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=8, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def test_a_newer_checkpoint_is_loaded_and_replaces_the_old_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dyngen.llm import weights

    monkeypatch.setattr(weights, "_MODELS", {})  # as in a fresh process
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConfigError, match="no complete checkpoint-N"):
        weights.load_weights({"model_path": str(out)})
    tiny_model(out / "checkpoint-2", seed=0)
    (out / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    first = weights.load_weights({"model_path": str(out)})
    assert (first.name, first.policy_step) == ("checkpoint-2", 2)
    assert weights.load_weights({"model_path": str(out)}).model is first.model  # loaded once

    tiny_model(out / "checkpoint-4", seed=1)  # no trainer_state.json yet: not complete
    assert weights.load_weights({"model_path": str(out)}).model is first.model
    (out / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    second = weights.load_weights({"model_path": str(out)})
    assert (second.name, second.policy_step) == ("checkpoint-4", 4)
    assert not _same_weights(first.model, second.model)
    assert list(weights._MODELS.values()) == [second]  # the old copy is gone

    # A model folder rewritten in place (same path, new files) is read again too.
    shutil.rmtree(out / "checkpoint-2")
    folder = tmp_path / "policy"
    tiny_model(folder, seed=0)
    before = weights.load_weights({"model_path": str(folder)})
    tiny_model(folder, seed=1)
    after = weights.load_weights({"model_path": str(folder)})
    assert after.policy_step is None and not _same_weights(before.model, after.model)


def _same_weights(a: Any, b: Any) -> bool:
    import torch

    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_sampling_cuts_no_top_k_unless_the_model_asks_for_one(tmp_path: Path) -> None:
    """A random tiny model spreads its first token over the whole vocabulary: 64 samples
    fall outside its 50 most likely tokens, unless its generation config sets top_k."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from dyngen.llm import ChatRequest, chat_model

    messages = [{"role": "user", "content": "Say something."}]
    firsts = {}
    for top_k in (None, 5):
        folder = tmp_path / f"top-k-{top_k}"
        tiny_model(folder, seed=0)
        if top_k is not None:
            GenerationConfig(do_sample=True, top_k=top_k).save_pretrained(folder)
        model = chat_model({"model_path": str(folder)})
        [result] = model.complete([ChatRequest(messages, n=64, max_tokens=1, temperature=1.0,
                                               seed=1)])
        firsts[top_k] = set(result.texts)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "top-k-None")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    with torch.inference_mode():
        logits = AutoModelForCausalLM.from_pretrained(tmp_path / "top-k-None")(
            input_ids=torch.tensor([ids["input_ids"]])).logits[0, -1]
    likeliest = {k: {tokenizer.decode([int(i)], skip_special_tokens=True)
                     for i in torch.topk(logits, k).indices} for k in (5, 50)}
    assert firsts[None] - likeliest[50], "every sample was among the 50 likeliest tokens"
    assert firsts[5] <= likeliest[5]
