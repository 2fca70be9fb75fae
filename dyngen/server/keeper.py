"""The keeper of a kept temporary Prefect server (`python -m dyngen.server.keeper`): it
starts the database and the server, records them in the state file, and stops them once
unused for the idle timeout. See dyngen/server/kept.py for the whole story."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from dyngen.server.kept import MODULE, folder, read_state, state_file, unused
from dyngen.server.processes import stop
from dyngen.server.temporary import start_temporary_server


def keep(key: str, token: str, idle: float, timeout: float) -> int:
    """The keeper: start the database and the server, record them, stop them when idle."""
    stopping = threading.Event()

    def on_signal(*_: object) -> None:
        if not up:  # while starting: end now (the start stops what it started)
            raise SystemExit(1)
        stopping.set()

    up = False
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    lock, state = folder() / f"{key}.lock", state_file(key)
    server, postgres, port = start_temporary_server(folder() / f"{key}.server.log", timeout)
    up = True
    try:
        tmp = state.with_suffix(f".{token}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "server_pid": server.pid, "port": port,
                                   "token": token, "idle": idle, "started": time.time()}))
        tmp.replace(state)
        print(f"kept Prefect server at http://127.0.0.1:{port}/api (PID {server.pid}); stops "
              f"after {idle:g} s unused", flush=True)
        last_used, step = time.monotonic(), min(5.0, max(0.05, idle / 10))
        while not stopping.wait(step) and server.poll() is None:
            if not unused(lock):
                last_used = time.monotonic()
            elif time.monotonic() - last_used >= idle and _retire(lock, state, token):
                print(f"idle for {idle:g} s: stopping", flush=True)
                break
    finally:
        if (kept := read_state(key)) is not None and kept.token == token:
            with contextlib.suppress(FileNotFoundError):
                state.unlink()
        stop(server)
        if postgres is not None:
            postgres.stop()
    return 0


def _retire(lock: Path, state: Path, token: str) -> bool:
    """Remove the state file while nobody holds the server up; False if someone does now."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        with contextlib.suppress(OSError, ValueError):
            if json.loads(state.read_text()).get("token") == token:
                state.unlink()
        return True
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--key", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--idle", type=float, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    return keep(args.key, args.token, args.idle, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
