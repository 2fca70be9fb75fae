"""`dyngen` commands that run generation rounds: round, serve, demo."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dyngen.cli.support import Name, get_state


def round_(
    ctx: typer.Context, name: Name,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="Config overrides as verl users type them, e.g. data.max_prompt_length=512.")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="OmegaConf YAML config file (overrides the global --config).")] = None,
    step: Annotated[int | None, typer.Option(help="Training step that triggers the round.")] = None,
    event_id: Annotated[str | None, typer.Option(
        help="Trigger id; a round with an id already committed commits nothing.")] = None,
    rollouts: Annotated[Path | None, typer.Option(
        help="The batch's rollouts file (JSONL of prompt and score) for the generator; its "
             "folder is allowed for this run.")] = None,
) -> None:
    """Run one generation round now, as a Prefect flow run, and print what it committed."""
    from dyngen.config import round_params
    from dyngen.flows.in_process import run_round

    state = get_state(ctx)
    # The user at this shell names the rollouts file, not an event: its folder is allowed
    # for this one run (the size bound still holds).
    rollouts = rollouts.resolve() if rollouts is not None else None
    params = round_params(path=config or state.config_path, overrides=overrides or [],
                          root=state.root, rollouts_dirs=[rollouts.parent] if rollouts else [])
    given = {"step": step, "event_id": event_id,
             "rollouts": str(rollouts) if rollouts else None}
    trigger = {k: v for k, v in given.items() if v is not None}
    result = run_round(name, config=params, trigger=trigger or None)
    counts = result["counts"]
    if result["created"]:
        state.out.print(f"committed {name!r} version {result['version']} (parent "
                        f"{result['parent']}): {result['rows']} rows, kept {counts.get('kept')} "
                        f"of {counts.get('generated')}, rejected {counts.get('rejected') or {}}",
                        markup=False)
    else:
        state.out.print(f"already committed as version {result['version']}; nothing new",
                        markup=False)


def serve_(
    ctx: typer.Context,
    dataset: Annotated[str | None, typer.Option(
        help="Only rounds of this dataset (default: every dataset's batch-end events).")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="Config overrides passed to every round, e.g. data.max_prompt_length=512.")] = None,
    every_n_batches: Annotated[int, typer.Option(
        min=1, help="Run a round every N batch-end events.")] = 1,
    isolation: Annotated[str, typer.Option(
        help="fork: each round in a process forked from a warm one (imports nothing); "
             "process: Prefect's runner, a fresh interpreter per round (imports everything "
             "again, so it picks up changed code).")] = "fork",
    poll_seconds: Annotated[float, typer.Option(
        min=0.01, help="How often to look for rounds to start.")] = 0.2,
    max_round_seconds: Annotated[float | None, typer.Option(
        min=1, help="fork: kill a round running longer, its run TimedOut (default: "
                    "(round.retries + 1) x round.timeout_seconds + 300).")] = None,
) -> None:
    """Serve the generation round with its batch-end event trigger until interrupted."""
    from dyngen.config import round_params
    from dyngen.config.generator_choice import require_generator
    from dyngen.flows.serve import check_isolation, serve_rounds

    state = get_state(ctx)
    check_isolation(isolation)
    # Checked on what the user wrote: the built config holds the default (mock) generator.
    require_generator(None, overrides or [], state.config_path, what="dyngen serve's config")
    # Absolute: each run starts in another folder.
    params = round_params(path=state.config_path, overrides=overrides or [], root=state.root,
                          absolute=True)
    serve_rounds(dataset, params, every_n_batches,
                 isolation=isolation, poll_seconds=poll_seconds,
                 max_round_seconds=max_round_seconds)


def demo(
    ctx: typer.Context,
    workdir: Annotated[Path, typer.Option(help="Folder for the demo's server, store and logs.")]
    = Path(".dyngen/demo"),
    batches: Annotated[int, typer.Option(min=1, help="Simulated training batches.")] = 3,
    keep_server: Annotated[bool, typer.Option(
        "--keep-server", help="Leave the Prefect server and the serve process running.")] = False,
) -> None:
    """Start a local Prefect server, serve the round, train, and watch rounds commit."""
    from dyngen.cli.demo import run_demo

    run_demo(workdir, get_state(ctx).out, batches=batches, keep_server=keep_server)


def register(app: typer.Typer) -> None:
    """Add the round commands to `app`."""
    app.command("round")(round_)
    app.command("serve")(serve_)
    app.command("demo")(demo)
