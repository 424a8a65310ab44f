"""A local OpenAI-compatible chat server for tests: replies follow a script of behaviours."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeLLM:
    """`script` is consumed one entry per request; when it runs out, `default` answers.

    An entry is a callable(request_json) -> behaviour, or a behaviour: ("json", obj), ("text", str),
    ("status", code) or ("hang", seconds)."""

    def __init__(self, default=None):
        self.script: list = []
        self.default = default
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def _next(self, request: dict):
        with self.lock:
            self.requests.append(request)
            entry = self.script.pop(0) if self.script else self.default
        return entry(request) if callable(entry) else entry

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                kind, value = fake._next(body)
                if kind == "hang":
                    time.sleep(value)
                    return
                if kind == "status":
                    self.send_response(value)
                    self.end_headers()
                    return
                content = json.dumps(value) if kind == "json" else value
                data = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": content}}]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
