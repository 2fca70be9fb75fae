"""The process-wide pool of warm sandboxes that run_python takes its runs from.

Started on first use; closed at exit; forgotten (not closed: they are the parent's) in a
child after a fork. Each concurrent caller gets a sandbox of its own, so `sandbox_workers`
threads calling run_python keep that many warm sandboxes busy; idle ones wait, per
(isolation, hash seed, memory), for the next run. A sandbox that failed a check is closed
and a fresh one takes its place on the next run.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import defaultdict

from dyngen.sandbox.process import SandboxBroken, SandboxResult, WarmSandbox

MAX_IDLE = 8  # idle sandboxes kept per key; more are closed when they come back


class SandboxPool:
    """Warm sandboxes by (isolation, hash seed, memory_mb), each serving one run at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: defaultdict[tuple[str, int, int], list[WarmSandbox]] = defaultdict(list)
        self._all: set[WarmSandbox] = set()
        self.started = 0

    def run(self, program: str, function: str, literal: str, *, isolation: str,
            hash_seed: int, memory_mb: int, timeout_seconds: float, max_output_bytes: int,
            max_value_chars: int) -> SandboxResult:
        """One run on a warm sandbox (started now if none is idle)."""
        key = (isolation, hash_seed, memory_mb)
        box = self._acquire(key)
        try:
            return box.run(program, function, literal, timeout_seconds=timeout_seconds,
                           max_output_bytes=max_output_bytes, max_value_chars=max_value_chars)
        finally:
            self._release(key, box)

    def _acquire(self, key: tuple[str, int, int]) -> WarmSandbox:
        while True:
            with self._lock:
                box = self._idle[key].pop() if self._idle[key] else None
                if box is not None and not box.alive():
                    self._all.discard(box)
                elif box is not None:
                    return box
                else:
                    break
            box.close()  # it died while idle: replaced below
        box = WarmSandbox(*key)
        with self._lock:
            self._all.add(box)
            self.started += 1
        return box

    def _release(self, key: tuple[str, int, int], box: WarmSandbox) -> None:
        with self._lock:
            keep = not box.broken and len(self._idle[key]) < MAX_IDLE
            if keep:
                self._idle[key].append(box)
            else:
                self._all.discard(box)
        if not keep:
            box.close()

    def close(self) -> None:
        """Close every sandbox (idle or not: a run in progress ends as crashed)."""
        with self._lock:
            boxes, self._all = list(self._all), set()
            self._idle.clear()
        for box in boxes:
            box.close()

    def forget(self) -> None:
        """In a forked child: drop the parent's sandboxes without ending them."""
        for box in list(self._all):
            box.forget()
        self._all = set()
        self._idle = defaultdict(list)
        self._lock = threading.Lock()


_pool: SandboxPool | None = None
_pool_lock = threading.Lock()


def pool() -> SandboxPool:
    """The process's pool, started on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SandboxPool()
        return _pool


def close_pool() -> None:
    """Close the process's pool (at exit; a later run starts a new one)."""
    global _pool
    with _pool_lock:
        current, _pool = _pool, None
    if current is not None:
        current.close()


def _after_fork_in_child() -> None:
    global _pool, _pool_lock
    _pool_lock = threading.Lock()
    if _pool is not None:
        _pool.forget()
        _pool = None


atexit.register(close_pool)
os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["SandboxBroken", "SandboxPool", "close_pool", "pool"]
