"""`dyngen` commands that keep a long-lived store in shape: compact, vacuum, rebuild-index."""

from __future__ import annotations

from typing import Annotated

import typer

from dyngen.cli.support import Name, get_state

# CompactionPolicy's and retention's defaults, written out so `dyngen --help` imports no
# store code (tests/test_cli_maintenance.py keeps them equal).
MAX_SMALL_SHARDS = 50
FAN_IN = 8
TARGET_MB = 128.0
DEFAULT_GRACE_SECONDS = 3600.0


def compact(
    ctx: typer.Context, name: Name,
    full: Annotated[bool, typer.Option(
        "--full", help="Merge every run of adjacent small shards, whatever the policy says.")]
    = False,
    max_small_shards: Annotated[int, typer.Option(
        min=0, help="Compact when the head has more small shards than this.")]
    = MAX_SMALL_SHARDS,
    fan_in: Annotated[int, typer.Option(
        min=2, help="Adjacent shards of one size tier merged into one.")] = FAN_IN,
    target_mb: Annotated[float, typer.Option(
        min=0.001, help="Shards this large (MiB) are never rewritten.")]
    = TARGET_MB,
) -> None:
    """Rewrite small shards into large ones as new versions: same rows, same order."""
    from dyngen.store.compaction import CompactionPolicy

    state = get_state(ctx)
    store = state.store()
    policy = CompactionPolicy(max_small_shards=max_small_shards, fan_in=fan_in,
                              target_bytes=int(target_mb * 2**20))
    made = store.compact(name, policy, full=full)
    if not made:
        head = store.state(name)
        small = sum(s.bytes < policy.target_bytes for s in head.shards)
        state.out.print(f"nothing to compact: the head (v{head.version}) has {small} small "
                        f"shard(s); the policy allows {policy.max_small_shards} "
                        "(--full merges them anyway)", markup=False)
        return
    for rec in made:
        info = rec.lineage["compaction"]
        state.out.print(f"compacted {name!r} as version {rec.version}: {info['shards_in']} "
                        f"shards ({info['rows']} rows) into {info['shards_out']}; the head "
                        f"has {len(rec.shards)} data shard(s)", markup=False)


def vacuum(
    ctx: typer.Context, name: Name,
    keep_versions: Annotated[int | None, typer.Option(
        min=1, help="Keep the newest N versions loadable.")] = None,
    keep_days: Annotated[float | None, typer.Option(
        min=0, help="Keep the versions of the last D days loadable.")] = None,
    grace_seconds: Annotated[float, typer.Option(
        min=0, help="Keep what a round in flight may use: versions that were the head, and "
                    "files written, this recently.")] = DEFAULT_GRACE_SECONDS,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List, do not delete.")] = False,
) -> None:
    """Retention: expire old versions, delete data files no kept version names.

    Records and lineage stay; loading an expired version names this vacuum.
    """
    state = get_state(ctx)
    result = state.store().vacuum(name, keep_versions=keep_versions, keep_days=keep_days,
                                  grace_seconds=grace_seconds, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for rel in result.removed:
        state.out.print(f"{verb} {rel}", markup=False)
    if result.record is not None:
        state.out.print(f"vacuum committed as version {result.record.version}: versions "
                        f"below {result.expired_before} no longer load", markup=False)
    elif result.expired_before:
        state.out.print(f"versions below {result.expired_before} "
                        f"{'would be' if dry_run else 'are'} expired", markup=False)
    state.out.print(f"{verb} {len(result.removed)} file(s)", markup=False)


def rebuild_index(ctx: typer.Context, name: Name) -> None:
    """Rebuild the near-duplicate index as round.near_duplicate (--config) hashes it, and
    the semantic index as round.semantic_duplicate embeds it (when that is enabled).

    Shards of every loadable version whose sidecar is missing or was made with other
    settings (or another rensa, another model) get one; nothing else changes.
    """
    from dyngen.filters.chain import vector_params
    from dyngen.filters.near_duplicate import params_of
    from dyngen.progress import progress_bar
    from dyngen.store.index import rebuild_index as rebuild
    from dyngen.store.semantic import VecKind

    state = get_state(ctx)
    cfg = state.config()
    params = params_of(cfg.round.near_duplicate)
    vectors = vector_params(cfg)
    with progress_bar() as bar:
        built = rebuild(state.store(), name, params, bar)
        embedded = None if vectors is None else rebuild(state.store(), name, VecKind(vectors),
                                                        bar)
    state.out.print(f"near-duplicate index of {name!r}: {built} shard(s) indexed "
                    f"({params.ngram}-word shingles, num_perm {params.num_perm}, bands "
                    f"{params.bands}); every loadable version is indexed", markup=False)
    if vectors is not None:
        state.out.print(f"semantic index of {name!r}: {embedded} shard(s) embedded (model "
                        f"{vectors.model}); every loadable version is indexed", markup=False)


def register(app: typer.Typer) -> None:
    """Add the maintenance commands to `app`."""
    app.command("compact")(compact)
    app.command("vacuum")(vacuum)
    app.command("rebuild-index")(rebuild_index)
