"""The Prefect task runner a round's partitions run on, chosen by config at run time.

A flow's own task runner is fixed before its run starts, but a round reads its config
inside the run; so the round enters the configured runner itself, around the generate
stage, and submits one task per partition to it (what `Task.submit` does with the
flow's runner). Ray comes from the optional extra `dyngen[ray]` (ray, prefect-ray),
imported only when a config names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig, OmegaConf
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from dyngen.errors import ConfigError, MissingDependencyError

RAY_EXTRA = "pip install 'dyngen[ray]'"

# ray.remote options → the resource names Ray's nodes report.
_RESOURCE_OPTIONS = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


def build_task_runner(cfg: DictConfig, partitions: int) -> TaskRunner:
    """The runner `round.task_runner` names: a thread per partition, or Ray."""
    if cfg.kind == "threads":
        return ThreadPoolTaskRunner(max_workers=partitions)
    ray_task_runner = _import_ray_task_runner()
    return ray_task_runner(address=cfg.address, init_kwargs=_plain(cfg.init_kwargs))


@contextmanager
def partition_resources(cfg: DictConfig) -> Iterator[None]:
    """Ray remote options (num_gpus, resources, ...) for each partition submitted inside, and
    the round's own Prefect API for them to report to.

    Enter it after the runner, once Ray is up: a request no live node can meet would
    leave the partition pending forever, so it is refused here instead.
    """
    if cfg.kind != "ray":
        yield
        return
    import ray
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_ray.context import remote_options

    options = _plain(cfg.remote_options)
    if options:
        _check_feasible(options, [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")])
    url = _prefect_api_url()
    if url is None:
        with remote_options(**options):
            yield
        return
    # A round without PREFECT_API_URL (`dyngen round`, a trainer's inline round) uses the
    # temporary server it started; a Ray worker knows nothing of it and would start one of
    # its own (and record the partition's task run there). The task's Prefect context
    # carries the URL (and PREFECT_API_AUTH_STRING, kept out of Ray's runtime environment,
    # which Ray's dashboard shows), and the worker's environment too, for threads the
    # generator starts outside that context.
    runtime_env = dict(options.get("runtime_env") or {})
    runtime_env["env_vars"] = {"PREFECT_API_URL": url, **(runtime_env.get("env_vars") or {})}
    with temporary_settings(updates={PREFECT_API_URL: url}), \
            remote_options(**{**options, "runtime_env": runtime_env}):
        yield


def _prefect_api_url() -> str | None:
    """The Prefect API this process reports to: PREFECT_API_URL, else its temporary server."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return str(PREFECT_API_URL.value())
    server = SubprocessASGIServer()  # the process's one temporary server, if it started
    return server.api_url if server.running else None


def _check_feasible(options: dict[str, Any], nodes: list[dict[str, float]]) -> None:
    """Fail unless some node has every resource one partition asks for."""
    wanted = {"CPU": 1.0}  # Ray's default for a task
    for option, resource in _RESOURCE_OPTIONS.items():
        if options.get(option) is not None:
            wanted[resource] = float(options[option])
    wanted.update({str(k): float(v) for k, v in (options.get("resources") or {}).items()})
    wanted = {k: v for k, v in wanted.items() if v > 0}
    if any(all(node.get(k, 0.0) >= v for k, v in wanted.items()) for node in nodes):
        return
    have = [{k: v for k, v in node.items() if not k.startswith("node:")} for node in nodes]
    raise ConfigError(
        f"round.task_runner.remote_options: each partition asks for {wanted}, but no live "
        f"node of the Ray cluster has that (nodes: {have}); Ray would keep the partitions "
        "pending forever. Ask for less, or add a node that has it (on an autoscaling "
        "cluster, start one before the round).")


def _import_ray_task_runner() -> type[TaskRunner]:
    """prefect-ray's RayTaskRunner, or an install hint when the extra is missing."""
    try:
        import ray  # noqa: F401  # prefect-ray imports ray lazily: check it here
        from prefect_ray.task_runners import RayTaskRunner
    except ImportError as exc:
        raise MissingDependencyError(
            f"round.task_runner.kind is ray, but {exc.name or 'ray'} is not installed. "
            f"Install the Ray extra: {RAY_EXTRA} (ray and prefect-ray; prefect-ray needs "
            "Python 3.11 or newer), or set round.task_runner.kind=threads.") from exc
    return RayTaskRunner


def _plain(node: Any) -> dict[str, Any]:
    """A config mapping as a plain dict (Ray and prefect-ray take keyword arguments)."""
    return dict(OmegaConf.to_container(node, resolve=True)) if node else {}
