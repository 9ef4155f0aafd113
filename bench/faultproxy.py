"""A TCP proxy the soak controls: it forwards to a server, and can cut or stall every connection.

It runs its own asyncio loop on a thread, listens on a loopback port of its own (port 0),
and forwards each accepted connection to `target`. The harness calls, from its own thread:

- `cut()`: close every open connection at once and refuse (accept, then close) new ones
  until `restore()`: the database "goes away" without the server itself being touched;
- `stall()`: stop moving bytes either way (connections stay open, data waits in the
  proxy) until `resume()`: the database "hangs".

Every call returns once the proxy's loop has done it (bounded by `CALL_TIMEOUT_S`).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from types import TracebackType
from typing import Any

CALL_TIMEOUT_S = 10.0
CHUNK = 65536


class FaultProxy:
    """A TCP proxy to `target` (host, port) that can cut and stall its connections."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.accepted = 0
        self._cut = False
        self._flowing: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    # -- control, from the harness's thread ----------------------------------------------

    def start(self) -> FaultProxy:
        """Start the loop and listen; `port` is set when this returns."""
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self) -> None:
        """Close every connection and refuse new ones until `restore`."""
        self._call(self._do_cut(True))

    def restore(self) -> None:
        """Accept and forward connections again."""
        self._call(self._do_cut(False))

    def stall(self) -> None:
        """Hold every byte, both ways, until `resume`."""
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        """Move the held bytes and forward again."""
        self._call(self._set_flowing(True))

    def stop(self) -> None:
        """Close everything and stop the loop's thread."""
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CALL_TIMEOUT_S)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=CALL_TIMEOUT_S)

    # -- on the proxy's loop --------------------------------------------------------------

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _do_cut(self, cut: bool) -> None:
        self._cut = cut
        if cut:
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _close(self) -> None:
        await self._do_cut(True)
        if self._server is not None:
            self._server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while data := await reader.read(CHUNK):
                await self._flowing.wait()
                if writer.transport.is_closing():
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()
