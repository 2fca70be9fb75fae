"""What benchmarks/closed_loop.py prints: a table per arm, the dyngen arm's versions, the
ratios (see closed_loop.py's docstring for what each measures)."""

from __future__ import annotations

import statistics
from typing import Any

TARGET_SHARE, TARGET_TIMES, TARGET_SECONDS = 0.6, 2.0, 1.1


def effective(step: dict[str, Any]) -> float:
    """The step's effective-prompt share: 1 − its zero-reward-spread share."""
    return 1.0 - step["zero_spread"]


def staleness(arm: Any) -> tuple[list[int], int]:
    """Steps between the checkpoint that measured each trained prompt and the step that
    trained on it; and how many prompts came from version 0 (measured by nothing)."""
    policy = {v["version"]: v["policy_step"] for v in arm.versions}
    gaps, unmeasured = [], 0
    for step in arm.steps:
        for version in step["versions"] or []:
            if policy.get(version) is None:
                unmeasured += 1
            else:
                gaps.append(step["step"] - policy[version])
    return gaps, unmeasured


def arm_table(arm: Any, gaps_by_step: dict[int, list[int]] | None) -> list[str]:
    head = ("| step | zero-spread share (all right / all wrong) | effective share | mean reward "
            "| TRL step_time s | step wall s | step CPU s | loop s | completion tokens |")
    extra = " prompts' versions | staleness | measured pass rate → reward |"
    lines = [f"{arm.name} arm", "", head + (extra if gaps_by_step is not None else ""),
             "|" + "---|" * (9 + 3 * (gaps_by_step is not None))]
    for s in arm.steps:
        row = (f"| {s['step']} | {s['zero_spread']:.2f} ({s['all_right']} / {s['all_wrong']}) "
               f"| {effective(s):.2f} | {s['reward']:.3f} | {s['step_time']:.1f} | "
               f"{s['wall']:.1f} | {s['cpu']:.1f} | {s['loop']:.1f} | {s['completion_tokens']} |")
        if gaps_by_step is not None:
            gaps = gaps_by_step.get(s["step"], [])
            drift = ", ".join(f"{'-' if m is None else f'{m:.2f}'} → {r:.2f}"
                              for m, r in zip(s["measured"], s["rewards"], strict=True))
            row += (f" {', '.join(f'v{v}' for v in s['versions'] or [])} | "
                    f"{', '.join(map(str, gaps)) or '-'} | {drift} |")
        lines.append(row)
    return [*lines, ""]


def per_step_gaps(arm: Any) -> dict[int, list[int]]:
    policy = {v["version"]: v["policy_step"] for v in arm.versions}
    return {s["step"]: [s["step"] - policy[v] for v in s["versions"] or []
                        if policy.get(v) is not None] for s in arm.steps}


def versions_table(arm: Any) -> list[str]:
    lines = ["dyngen arm: its versions (the round each step's batch end asked for)", "",
             "| version | trigger step | policy step | candidates measured | rows by passes "
             "(0..samples) | kept | kept share | round's solve-rate s | its completion tokens "
             "| effective share the trainer reported | rows |", "|" + "---|" * 11]
    for v in arm.versions:
        kept_share = (f"{v['kept'] / v['graded']:.2f}" if v.get("graded") else "-")
        eff = "-" if v["effective"] is None else f"{v['effective']:.2f}"
        hist = " ".join(map(str, v.get("histogram") or []))
        lines.append(f"| {v['version']} | {v['step']} | {v['policy_step']} | {v['graded']} | "
                     f"{hist} | {v['kept']} | {kept_share} | {v.get('seconds')} | "
                     f"{v.get('completion_tokens')} | {eff} | {v['rows']} |")
    return [*lines, ""]


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def print_results(sizes: Any, start: float, eval_seconds: float, static: Any,
                  dyngen: Any) -> None:
    """Everything the benchmark reports, as markdown tables and lines."""
    out = arm_table(static, None) + arm_table(dyngen, per_step_gaps(dyngen))
    out += versions_table(dyngen)
    eff_s, eff_d = (mean([effective(s) for s in a.steps]) for a in (static, dyngen))
    low = [s["step"] for s in dyngen.steps if effective(s) < TARGET_SHARE]
    ratio = eff_d / eff_s if eff_s else float("inf")
    out.append(f"effective-prompt share (mean over steps; the first round ran before step 1): "
               f"dyngen {eff_d:.3f}, static {eff_s:.3f}, ratio {ratio:.2f} (target >= "
               f"{TARGET_TIMES}); dyngen steps below {TARGET_SHARE}: {low or 'none'}")
    for key, label in (("step_time", "TRL step_time"), ("wall", "step wall"),
                       ("cpu", "step CPU"), ("loop", "loop (saves, callbacks, rounds)")):
        s_mean, d_mean = (mean([s[key] for s in a.steps]) for a in (static, dyngen))
        s_med, d_med = (statistics.median([s[key] for s in a.steps]) for a in (static, dyngen))
        out.append(f"{label} seconds/step: dyngen {d_mean:.1f} (median {d_med:.1f}), static "
                   f"{s_mean:.1f} (median {s_med:.1f}); ratio {d_mean / s_mean:.2f} "
                   f"(medians {d_med / s_med:.2f}; target <= {TARGET_SECONDS})")
    per = {}
    for arm in (static, dyngen):
        tokens = sum(s["completion_tokens"] for s in arm.steps)
        prompts = sum(effective(s) * sizes.prompts for s in arm.steps)
        per[arm.name] = tokens / prompts if prompts else float("inf")
    out.append(f"completion tokens per effective prompt: dyngen {per['dyngen']:.0f}, static "
               f"{per['static']:.0f} (ratio {per['dyngen'] / per['static']:.2f})")
    graded = sum(v.get("completion_tokens") or 0 for v in dyngen.versions)
    prompts = sum(effective(s) * sizes.prompts for s in dyngen.steps)
    if prompts:
        out.append(f"  with the rounds' grading ({graded} completion tokens, off the training "
                   f"path): dyngen {(per['dyngen'] * prompts + graded) / prompts:.0f} per "
                   "effective prompt")
    for arm in (static, dyngen):
        right, wrong = (sum(s[k] for s in arm.steps) for k in ("all_right", "all_wrong"))
        out.append(f"{arm.name}: zero-spread prompts {right + wrong} of "
                   f"{len(arm.steps) * sizes.prompts}: {right} all right, {wrong} all wrong")
    pairs = [(m, r) for s in dyngen.steps for m, r in zip(s["measured"], s["rewards"],
                                                          strict=True) if m is not None]
    if pairs:
        out.append(f"dyngen: trained prompts' pass rate when their round measured it, mean "
                   f"{mean([m for m, _ in pairs]):.2f}; their mean reward when trained "
                   f"{mean([r for _, r in pairs]):.2f}")
    gaps, unmeasured = staleness(dyngen)
    if gaps:
        out.append(f"staleness (steps from the measuring checkpoint to the training step), over "
                   f"{len(gaps)} trained prompts: mean {mean(gaps):.1f}, median "
                   f"{statistics.median(gaps):.0f}, max {max(gaps)}; {unmeasured} prompt(s) "
                   "from version 0")
    diff = max(abs(s["zero_spread"] - s["zero_spread_from_rewards"])
               for a in (static, dyngen) for s in a.steps)
    out.append(f"TRL's frac_reward_zero_std vs the share computed from the rewards: largest "
               f"difference {diff:.3f}")
    out.append(f"held-out greedy accuracy ({sizes.eval_size} tasks): start {start:.3f} "
               f"(both arms start from the same weights; {eval_seconds:.0f} s), end static "
               f"{static.accuracy_end:.3f}, end dyngen {dyngen.accuracy_end:.3f}")
    for arm in (static, dyngen):
        out.append(f"{arm.name} arm: {arm.seconds:.0f} s ({arm.seconds / 60:.1f} min), load "
                   f"average {arm.load[0]:.1f} at its start, {arm.load[1]:.1f} at its end")
    if dyngen.report:
        out.append(f"report: {dyngen.report}")
    print("\n".join(out), flush=True)
