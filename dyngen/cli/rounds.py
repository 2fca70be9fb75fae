"""`dyngen` commands that run generation rounds: round, serve, demo."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dyngen.cli.support import Name, get_state
from dyngen.errors import ConfigError

ISOLATIONS = ("fork", "process")


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
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Generate and filter on the head here, with no Prefect server, "
                          "commit nothing, and print the rows kept and rejected (with "
                          "their reasons).")] = False,
) -> None:
    """Run one generation round now, as a Prefect flow run, and print what it committed.

    Without PREFECT_API_URL, the temporary Prefect server dyngen starts stays up for the
    next command until idle for DYNGEN_SERVER_IDLE_TIMEOUT seconds (600; 0 stops it with
    the command)."""
    from dyngen.cli.runlog import log_path, prefect_log_to_file, round_failure
    from dyngen.config import round_params
    from dyngen.config.preflight import check_before_start

    state = get_state(ctx)
    # The user at this shell names the rollouts file, not an event: its folder is allowed
    # for this one run (the size bound still holds).
    rollouts = rollouts.resolve() if rollouts is not None else None
    params = round_params(path=config or state.config_path, overrides=overrides or [],
                          root=state.root, rollouts_dirs=[rollouts.parent] if rollouts else [])
    # Every mistake the config can hold, in this process, before a server or a flow run.
    check_before_start(params, dataset=name)
    given = {"step": step, "event_id": event_id,
             "rollouts": str(rollouts) if rollouts else None}
    trigger = {k: v for k, v in given.items() if v is not None}
    if dry_run:  # the round's own stages, here, without Prefect: nothing committed
        from dyngen.cli.dry_run import dry_run as try_round

        try_round(name, params, trigger or None, state.out)
        return
    from dyngen.runtime.in_process import run_round

    with prefect_log_to_file(log_path(name), state.debug) as log:
        try:
            result = run_round(name, config=params, trigger=trigger or None)
        except Exception as exc:
            raise round_failure(name, exc, log) from exc
    counts = result["counts"]
    from dyngen.cli.support import make_console
    from dyngen.round.lineage import covered
    from dyngen.store.location import store_settings
    from dyngen.store.store import Store

    store = Store.from_config(store_settings(params["store"]))
    record = store.record(name, result["version"])
    if not result["created"]:
        said = (already_committed(name, result["version"], step, event_id,
                                  result.get("idempotency_key")) if trigger else
                f"nothing new: the batch ends pending were covered meanwhile by version "
                f"{result['version']} ({covered(record)}).")
        state.out.print(said, markup=False, soft_wrap=True)
        return
    state.out.print(f"committed {name!r} version {result['version']} (parent "
                    f"{result['parent']}): {result['rows']} rows, kept {counts.get('kept')} "
                    f"of {counts.get('generated')}, rejected {counts.get('rejected') or {}}",
                    markup=False)
    if covered(record):
        state.out.print(f"version {result['version']} covers {covered(record)}", markup=False,
                        soft_wrap=True)
    stats = record.lineage.get("generator", {}).get("stats")
    skipped = stats.get("skipped") if isinstance(stats, dict) else None
    if isinstance(skipped, int) and skipped:  # an augmenter's rows it cannot apply to
        by_reason = {k: v for m in (stats.get("methods") or {}).values()
                     if isinstance(m, dict) for k, v in (m.get("skipped") or {}).items()}
        state.out.print(f"skipped {skipped} source rows the generator cannot apply to: "
                        f"{by_reason}", markup=False, soft_wrap=True)
    if not counts.get("kept"):
        warning = nothing_kept_warning(store, name, result["version"], counts)
        make_console(stderr=True).print(warning, style="yellow", markup=False, soft_wrap=True)


def already_committed(name: str, version: int, step: int | None, event_id: str | None,
                      committed_key: str | None = None) -> str:
    """Why a round committed nothing new: its trigger's key, and how to run another."""
    if event_id is not None:
        key, again = f"event:{event_id}", "another --event-id"
    else:
        key, again = f"{name}:step:{step}", f"another --step (e.g. --step {(step or 0) + 1})"
    next_step = f"another --step (e.g. --step {(step or 0) + 1})"
    if committed_key is not None and committed_key != key and step is not None:
        return (f"step {step} is already committed as version {version} (by trigger "
                f"{committed_key}); nothing new. A training step commits once (a resumed "
                f"trainer sends its steps again): run another round with {next_step}.")
    return (f"already committed as version {version} by trigger {key}; nothing new. Rounds "
            "are keyed by their trigger (--event-id, else the dataset and --step), so the "
            f"same one commits once: run another round with {again}.")


def nothing_kept_warning(store: object, name: str, version: int,
                         counts: dict[str, object]) -> str:
    """The round kept no row: its top rejection reasons, an example of each, what shows all."""
    generated = counts.get("generated") or 0
    if not generated:
        return (f"warning: the generator returned no rows, so version {version} of {name!r} "
                "adds none; check its generate() (nothing failed).")
    rejected = counts.get("rejected") or {}
    assert isinstance(rejected, dict)
    top = sorted(rejected.items(), key=lambda item: (-int(item[1]), item[0]))[:3]
    examples = _example_details(store, name, version)
    reasons = "; ".join(f"{reason} ({count}): {examples.get(reason) or 'no detail'}"
                        for reason, count in top)
    return (f"warning: version {version} of {name!r} kept none of the {generated} generated "
            f"rows. Top reasons: {reasons}. See them all: dyngen show {name} --rejected")


def _example_details(store: object, name: str, version: int) -> dict[str, str]:
    """One rejected row's detail per reason, from the version's quarantine shard."""
    from dyngen.text import clip

    try:
        rows = store.load_rejected(name, version, round_only=True)  # type: ignore[attr-defined]
    except Exception:  # the warning is a courtesy: the version is committed
        return {}
    out: dict[str, str] = {}
    for row in rows.select_columns(["reason", "detail"]).to_list():
        out.setdefault(str(row["reason"]), clip(str(row.get("detail") or ""), 120))
    return out


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
    catch_up_seconds: Annotated[float, typer.Option(
        min=0, help="With --dataset: a catch-up round this often, covering batch ends "
                    "pending in the store whose event never came (0: none).")] = 60.0,
) -> None:
    """Serve the generation round with its batch-end event trigger until interrupted.

    One serve per dataset: a second `dyngen serve` of a dataset (or of every dataset, while
    one of its datasets is served) is refused, naming the serve that holds it. Needs a
    Prefect server of your own (PREFECT_API_URL)."""
    from dyngen.config import round_params
    from dyngen.config.generator_choice import require_generator
    from dyngen.config.preflight import check_before_start

    state = get_state(ctx)
    if isolation not in ISOLATIONS:
        raise ConfigError(f"--isolation must be 'fork' or 'process', found {isolation!r}.")
    # Checked on what the user wrote: the built config holds the default (mock) generator.
    require_generator(None, overrides or [], state.config_path, what="dyngen serve's config")
    # Absolute: each run starts in another folder.
    params = round_params(path=state.config_path, overrides=overrides or [], root=state.root,
                          absolute=True)
    # A mistake in the config fails now, not in every round the events start.
    check_before_start(params)
    from dyngen.runtime.quick_exit import exit_quickly
    from dyngen.runtime.serve import serve_rounds

    exit_quickly()  # after Ctrl-C, gone at once (in the `dyngen` process; see main)

    serve_rounds(dataset, params, every_n_batches,
                 isolation=isolation, poll_seconds=poll_seconds,
                 max_round_seconds=max_round_seconds, catch_up_seconds=catch_up_seconds)


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
