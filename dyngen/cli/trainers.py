"""The `dyngen` commands a training job uses: `emit` (and `--flush`) and `follow`.

Registered on the app in `dyngen.cli`; kept apart so that module stays about datasets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def emit_command(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Dataset name.")] = None,
    step: Annotated[int | None, typer.Option(
        min=0, help="The training step that just ended.")] = None,
    metric: Annotated[list[str] | None, typer.Option(
        help="A batch metric as key=value (repeatable), e.g. --metric score=0.61.")] = None,
    rollouts: Annotated[str | None, typer.Option(help="Path of the batch's rollouts file.")]
    = None,
    event_id: Annotated[str | None, typer.Option(help="Event id (default: a new UUID).")]
    = None,
    flush: Annotated[bool, typer.Option(
        "--flush", help="Deliver the events waiting in the outbox for this server, in order "
                        "(alone, or before emitting NAME --step N).")] = False,
) -> None:
    """Emit a training batch-end event, as a trainer would; --flush sends queued ones."""
    from dyngen.errors import ConfigError
    from dyngen.store.names import validate_name
    from dyngen.trainers.events import flush_outbox, send_batch_end
    from dyngen.trainers.outbox import Outbox

    out = ctx.obj.out
    if name is None or step is None:
        if not flush or name is not None or step is not None:
            raise ConfigError("emit: expected NAME and --step N (or --flush alone), found "
                              f"{'NAME ' if name else ''}{'--step ' if step is not None else ''}"
                              "only. Example: dyngen emit gsm8k-dyn --step 12.")
        result = flush_outbox()
        out.print(f"delivered {result.delivered} queued event(s); {result.pending} still "
                        f"in the outbox{f' ({result.reason})' if result.reason else ''}",
                        markup=False)
        if result.pending:
            raise typer.Exit(1)
        return
    metrics: dict[str, float] = {}
    for item in metric or []:
        key, sep, value = item.partition("=")
        try:
            metrics[key] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key:
            raise ConfigError(f"--metric: expected key=number, found {item!r}.")
    sent = send_batch_end(validate_name(name), step, metrics, rollouts, event_id=event_id)
    if sent.status == "dropped":
        raise typer.Exit(1)
    if sent.status == "queued":
        # Exit 0: a shell training loop under `set -e` must go on through an outage.
        out.print(f"queued dyngen.batch.ended for {name!r} step {step} (event "
                        f"{sent.event_id}) in the outbox {Outbox().root}: "
                        f"{sent.reason or 'the server is unreachable'}; the next emit or "
                        "`dyngen emit --flush` delivers it", markup=False)
        return
    out.print(f"emitted dyngen.batch.ended for {name!r} step {step} (event "
                    f"{sent.event_id})", markup=False)


def follow_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Dataset name.")],
    verl_metrics: Annotated[Path | None, typer.Option(
        "--verl-metrics", help="verl's metrics file (trainer.logger=[console,file], "
                               "VERL_FILE_LOGGER_PATH).")] = None,
    prime_rl_metrics: Annotated[Path | None, typer.Option(
        "--prime-rl-metrics", help="prime-rl's orchestrator metrics file (its file monitor: "
                                   "<output_dir>/metrics.jsonl).")] = None,
    rollout_dir: Annotated[Path | None, typer.Option(
        "--rollout-dir", help="verl's trainer.rollout_data_dir (one <step>.jsonl per step); "
                              "prime-rl's output_dir (default: the metrics file's folder).")]
    = None,
    every_n_steps: Annotated[int, typer.Option(
        "--every-n-steps", min=1, help="Emit a batch end for every N-th step.")] = 1,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Names the training run (default: from the metrics file's path); "
                         "a new experiment writing the same file needs a new one.")] = None,
    rollout_wait: Annotated[float, typer.Option(
        "--rollout-wait", min=0, help="Seconds to wait for a step's rollouts file before "
                                      "emitting without it.")] = 60.0,
    poll_seconds: Annotated[float, typer.Option(
        "--poll-seconds", min=0.01, help="How often to look at the files.")] = 1.0,
) -> None:
    """Follow a running verl or prime-rl job's files; emit one batch end per training step."""
    from dyngen.errors import ConfigError
    from dyngen.runtime.quick_exit import exit_quickly
    from dyngen.store.names import validate_name
    from dyngen.trainers.prime_rl_follow import PrimeRLFollower
    from dyngen.trainers.verl_follow import VerlFollower

    exit_quickly()  # after Ctrl-C, gone at once (in the `dyngen` process; see main)

    if (verl_metrics is None) == (prime_rl_metrics is None):
        raise ConfigError("follow: expected one of --verl-metrics FILE or --prime-rl-metrics "
                          "FILE, found " + ("both" if verl_metrics else "neither") + ".")
    kind = VerlFollower if verl_metrics is not None else PrimeRLFollower
    metrics = verl_metrics or prime_rl_metrics
    assert metrics is not None
    follower = kind(ctx.obj.store().root, validate_name(name), metrics,
                    rollout_dir=rollout_dir, every_n_steps=every_n_steps, run_id=run_id,
                    rollout_wait_seconds=rollout_wait)
    last = follower.last_step if follower.last_step >= 0 else "none"
    ctx.obj.out.print(f"following {metrics} for dataset {name!r} (run {follower.run_id}, "
                      f"last step emitted: {last}; rollouts to {follower.folder}); Ctrl-C "
                      "stops", markup=False)
    try:
        follower.run(poll_seconds=poll_seconds)
    except KeyboardInterrupt:
        ctx.obj.out.print(f"stopped after step {follower.last_step}", markup=False)
