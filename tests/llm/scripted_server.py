"""A small OpenAI-compatible HTTP server on a real socket whose answers a test scripts.

It stands in for what a real server does only when it is in trouble, which llama.cpp cannot
be made to do on demand: answer slowly, 429 with Retry-After, 503. Each chat request takes
the next scripted reply (`"ok"`, `"slow"`, or an HTTP status), then "ok" once the script is
used up; a request whose last message holds "slow" always sleeps. It records how many
requests were in flight at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Script:
    """The replies still to give, and what the server saw."""

    def __init__(self, replies: list[str | int], sleep_seconds: float) -> None:
        self.replies, self.sleep_seconds = list(replies), sleep_seconds
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = self.chats = 0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.model = "scripted"  # the model each reply says answered

    def next_reply(self, body: dict[str, Any]) -> str | int:
        with self.lock:
            self.chats += 1
            self.bodies.append(body)
            if "slow" in str(body["messages"][-1].get("content", "")):
                return "slow"
            return self.replies.pop(0) if self.replies else "ok"


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, payload: dict[str, Any], **headers: str) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            script.headers.append({k.lower(): v for k, v in self.headers.items()})
            reply = script.next_reply(body)
            with script.lock:
                script.in_flight += 1
                script.most_in_flight = max(script.most_in_flight, script.in_flight)
            try:
                time.sleep(script.sleep_seconds if reply == "slow" else 0.05)
                if isinstance(reply, int):
                    self._send(reply, {"error": {"message": f"scripted {reply}"}},
                               **({"retry-after": "0.1"} if reply == 429 else {}))
                    return
                n = int(body.get("n", 1))
                self._send(200, {
                    "id": "x", "object": "chat.completion", "created": 0, "model": script.model,
                    "choices": [{"index": i, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": f"answer {i}"}}
                                for i in range(n)],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2 * n,
                              "total_tokens": 5 + 2 * n}})
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout)
            finally:
                with script.lock:
                    script.in_flight -= 1

    return Handler


@contextmanager
def scripted_server(replies: Sequence[str | int] = (), sleep_seconds: float = 5.0
                    ) -> Iterator[tuple[str, Script]]:
    """(base URL, script) of a server on a free loopback port, for the block."""
    script = Script(list(replies), sleep_seconds)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", script
    finally:
        server.shutdown()
        server.server_close()
