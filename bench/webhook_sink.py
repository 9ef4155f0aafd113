"""A webhook receiver for the soak: it logs every event it gets, and can be taken down and up.

It listens on a loopback port of its own (fixed at the first start, so `[webhook] url`
stays right across `down()` / `up()`), answers 204 to every POST, and appends what it got to
`received`: the `webhook-id` header, the event's `type`, `data.user`, the change's
`timestamp`, and when it arrived. While down, the port is closed: a delivery attempt is
refused, as with a receiver that is not running.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


class WebhookSink:
    """A loopback webhook receiver that logs what it gets (`received`)."""

    def __init__(self) -> None:
        self.port = 0
        self.received: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where to POST (`[webhook] url`)."""
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self) -> WebhookSink:
        """Listen (again, on the same port) and answer."""
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                data = body.get("data") or {}
                entry = {
                    "id": self.headers.get("webhook-id"),
                    "type": body.get("type"),
                    "user": data.get("user"),
                    "old_state": data.get("old_state"),
                    "new_state": data.get("new_state"),
                    "timestamp": body.get("timestamp"),
                    "received": time.time(),
                }
                with sink._lock:
                    sink.received.append(entry)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def down(self) -> None:
        """Stop answering and close the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)

    def events(self) -> list[dict[str, Any]]:
        """A copy of what arrived, in arrival order."""
        with self._lock:
            return list(self.received)

    def __enter__(self) -> WebhookSink:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()
