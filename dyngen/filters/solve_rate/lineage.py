"""What a round records of its solve-rate stage: the policy (host:port, never a key) and
the training step of its weights, the samples (and, sampled sequentially, the samples each
stage spent), the band, tokens, seconds and the histogram of pass rates."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from dyngen.filters.solve_rate.grading import Grade, band_verdict
from dyngen.filters.solve_rate.sequential import SamplingPlan

USAGE_SUMS = ("requests", "http_requests", "retries", "failures", "prompt_tokens",
              "completion_tokens")


def host_port(endpoint: Any) -> str | None:
    """`host:port` of an endpoint URL (no scheme, path, query or credentials)."""
    if not endpoint:
        return None
    parts = urlsplit(str(endpoint).strip())
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{host}:{port}"


def histogram(grades: Sequence[Grade], samples: int) -> list[int]:
    """Rows by pass rate: entry k counts the rows whose rate is nearest k / `samples` (errors
    left out). A row graded on `samples` completions is counted at its pass count; one
    graded on fewer (sampled sequentially, it stopped early) at its rate's nearest k."""
    out = [0] * (samples + 1)
    for g in grades:
        if g.error is None and g.samples > 0 and 0 <= g.passed <= g.samples:
            out[math.floor(g.passed * samples / g.samples + 0.5)] += 1
    return out


def stage_lineage(settings: Mapping[str, Any], grades: Sequence[Grade],
                  shares: Sequence[Mapping[str, Any]], seconds: float,
                  rewards: Mapping[str, str]) -> dict[str, Any]:
    """The `solve_rate` entry of a round's lineage, from every share's grades and usage."""
    plan, keep = SamplingPlan.of(settings), [float(x) for x in settings["keep"]]
    samples = plan.cap  # `samples`, or sampled sequentially the cap
    verdicts = [band_verdict(g, keep) for g in grades]
    reasons = [v[0] if v else "kept" for v in verdicts]
    usage = {k: sum(int((s.get("usage") or {}).get(k, 0)) for s in shares) for k in USAGE_SUMS}
    models = {s.get("model") for s in shares if s.get("model")}
    modes = {s.get("n_in_one_request") for s in shares} - {None}
    steps = [s["policy_step"] for s in shares if isinstance(s.get("policy_step"), int)]
    return {
        "endpoint": host_port(settings.get("endpoint")),
        "model_path": None if settings.get("endpoint") else settings.get("model_path"),
        "model": sorted(models)[0] if models else settings.get("model_name"),
        # True: n samples in one request; False: n one-sample requests (llama.cpp).
        "n_in_one_request": modes.pop() if len(modes) == 1 else None,
        # The training step of the weights that measured these rates (the oldest, if a
        # newer checkpoint landed between the round's shares); None where none is known.
        "policy_step": min(steps) if steps else None,
        "samples": samples, "keep": keep, "band": keep,  # band: the same [low, high]
        # The completions asked (every row's, failed requests' included) and, per stage, the
        # rows asked and the samples each got; `sequential`: the plan, or None (all at once).
        "samples_spent": sum(g.samples for g in grades),
        "stages": plan.stage_counts([g.samples for g in grades]),
        "sequential": _sequential(settings) if plan.confidence is not None else None,
        "pass_threshold": float(settings["pass_threshold"]),
        "temperature": float(settings["temperature"]), "max_tokens": int(settings["max_tokens"]),
        "rewards": dict(rewards),
        "graded": len(grades), **{r: reasons.count(r) for r in
                                  ("kept", "too_easy", "too_hard", "model_error")},
        "histogram": histogram(grades, samples), **usage,
        "tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        "seconds": round(seconds, 3),
        "partitions": len(shares),
    }


def _sequential(settings: Mapping[str, Any]) -> dict[str, Any]:
    seq = settings["sequential"]
    return {"first": int(seq["first"]), "step": int(seq["step"]), "cap": int(seq["cap"]),
            "confidence": float(seq["confidence"])}
