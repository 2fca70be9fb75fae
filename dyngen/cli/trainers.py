"""The `dyngen` commands a training job uses: `emit` (and `--flush`) and `follow`.

Registered on the app in `dyngen.cli`; kept apart so that module stays about datasets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
    run: Annotated[str | None, typer.Option(
        help="The training run the step belongs to (default: $DYNGEN_RUN, else 'default'); "
             "a resumed run keeps its name, a new run needs a new one.")] = None,
    flush: Annotated[bool, typer.Option(
        "--flush", help="Write the batch ends waiting in the local retry queue into their "
                        "store, then deliver the events waiting in the outbox for this "
                        "server, in order (alone, or before emitting NAME --step N).")] = False,
) -> None:
    """Record a training batch end in the store's inbox and emit its event, as a trainer
    would; --flush writes and sends queued ones."""
    from dyngen.errors import ConfigError
    from dyngen.store.names import validate_name
    from dyngen.trainers.events import COVERED_LATER, flush_outbox, send_batch_end
    from dyngen.trainers.outbox import Outbox

    out = ctx.obj.out
    if name is None or step is None:
        if not flush or name is not None or step is not None:
            raise ConfigError("emit: expected NAME and --step N (or --flush alone), found "
                              f"{'NAME ' if name else ''}{'--step ' if step is not None else ''}"
                              "only. Example: dyngen emit gsm8k-dyn --step 12.")
        stored = _flush_store_queues(ctx)
        result = flush_outbox()
        out.print(f"delivered {result.delivered} queued event(s); {result.pending} still "
                        f"in the outbox{f' ({result.reason})' if result.reason else ''}",
                        markup=False)
        if result.pending or stored:
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
    store = _store_of(ctx, validate_name(name))
    sent = send_batch_end(name, step, metrics, rollouts, event_id=event_id, store=store,
                          run=run)
    if sent.inbox:
        out.print(_INBOX[sent.inbox].format(run=sent.run, root=store.root), markup=False)
    if sent.status == "dropped" and sent.inbox not in ("written", "kept", "queued"):
        raise typer.Exit(1)
    if sent.status == "queued":
        # Exit 0: a shell training loop under `set -e` must go on through an outage.
        out.print(f"queued dyngen.batch.ended for {name!r} step {step} (event "
                        f"{sent.event_id}) in the outbox {Outbox().root}: "
                        f"{sent.reason or 'the server is unreachable'}; the next emit or "
                        "`dyngen emit --flush` delivers it", markup=False)
        return
    if sent.status == "dropped":  # a wake-up the server did not take; the store keeps it
        out.print(f"dyngen.batch.ended for {name!r} step {step} (event {sent.event_id}) was "
                  f"not sent: {sent.reason}; {COVERED_LATER[sent.inbox]}", markup=False)
        return
    out.print(f"emitted dyngen.batch.ended for {name!r} step {step} (event "
                    f"{sent.event_id})", markup=False)


_INBOX = {
    "written": "recorded in the inbox of {root} as run {run!r}",
    "kept": "run {run!r} has this step in the inbox of {root} already: the first is kept",
    "queued": "the store {root} is unreachable: the batch end waits in the local retry "
              "queue (the next emit or `dyngen emit --flush` writes it)",
    "unrecorded": "not recorded in the inbox of {root} (see the warning above)",
}


def _store_of(ctx: typer.Context, name: str) -> Any:
    """The store to record the batch end in: the command's, when the dataset is there. A
    store on object storage is not asked (it may be down: the batch end then waits in the
    retry queue, and a look would cost the training loop its timeouts)."""
    import logging
    from pathlib import Path

    try:
        store = ctx.obj.store()
    except Exception as exc:  # a shell training loop goes on: the event alone
        logging.getLogger("dyngen").warning("dyngen emit: no store (%s); the event alone is "
                                            "sent", exc)
        return None
    if isinstance(store.root, Path) and not store.dataset_exists(name):
        ctx.obj.out.print(f"dataset {name!r} is not in the store {store.root}: the event "
                          "alone is sent (set --root to the dataset's store to record the "
                          "batch end)", markup=False)
        return None
    return store


def _flush_store_queues(ctx: typer.Context) -> int:
    """Write the batch ends of the local retry queue to their stores; how many remain."""
    from dyngen.trainers.inbox_write import flush_queues

    try:
        store = ctx.obj.store()
    except Exception:
        store = None
    done = flush_queues(store)
    if done.written or done.pending:
        ctx.obj.out.print(f"wrote {done.written} queued batch end(s) into the store; "
                          f"{done.pending} still in the retry queue"
                          f"{f' ({done.reason})' if done.reason else ''}", markup=False)
    return done.pending


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
        "--run", "--run-id", help="Names the training run whose batch ends are recorded "
                                  "(default: verl's experiment name, from its metrics file, "
                                  "or prime-rl's output_dir, with its path); a new experiment "
                                  "writing the same file needs a new one.")] = None,
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
    store = ctx.obj.store()
    follower = kind(store.root, validate_name(name), metrics, rollout_dir=rollout_dir,
                    every_n_steps=every_n_steps, run_id=run_id,
                    rollout_wait_seconds=rollout_wait, store=store,
                    on_emit=lambda step, sent, rollouts: ctx.obj.out.print(
                        step_line(step, sent, rollouts), markup=False))
    last = follower.last_step if follower.last_step >= 0 else "none"
    ctx.obj.out.print(f"following {metrics} for dataset {name!r} (run {follower.run_id}, "
                      f"last step emitted: {last}; rollouts to {follower.folder}); Ctrl-C "
                      "stops", markup=False)
    try:
        follower.run(poll_seconds=poll_seconds)
    except KeyboardInterrupt:
        ctx.obj.out.print(f"stopped after step {follower.last_step}", markup=False)


def step_line(step: int, sent: Any, rollouts: int) -> str:
    """`dyngen follow`'s line for one step: where its batch end went, and its event."""
    stored = {"written": "recorded in the store", "kept": "already in the store",
              "queued": "queued for the store (unreachable)",
              "unrecorded": "not recorded in the store"}.get(sent.inbox, "")
    event = {"sent": "round woken", "queued": "event queued",
             "dropped": "event not sent"}.get(sent.status, sent.status)
    with_rollouts = f", {rollouts} rollouts" if rollouts else ", no rollouts"
    return f"step {step}: batch end {stored or 'sent'}{with_rollouts}; {event}"
