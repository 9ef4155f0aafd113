"""`HostileServer`: a scripted HTTP server on loopback (optionally TLS) that answers each request
with the next `Step` of its path byte for byte (any header, a dripping body) and records every
request; `ProxyProbe`: a listener that records whether anything connected to it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import ssl
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from hypothesis import strategies as st

IO_TIMEOUT_S = 30.0


class _Served:
    """A loopback asyncio server on its own thread's loop for the span of a `with`."""

    tls: ssl.SSLContext | None = None

    def _prepare(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{self._thread.name} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()


@dataclass(frozen=True)
class Step:
    """One scripted answer: header lines are sent as given (Content-Length added unless
    present); `drip` sends the body a byte at a time with this pause; `delay` waits first."""

    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""
    drip: float | None = None
    delay: float = 0.0


@dataclass(frozen=True)
class Seen:
    """One request the server received."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


@dataclass
class HostileServer(_Served):
    """The scripted server; `with HostileServer(...) as server: server.url`."""

    default: Step = field(default_factory=Step)
    tls: ssl.SSLContext | None = None
    # Consulted first for every request: a Step, or None for the scripted/default one.
    respond: Callable[[Seen], Step | None] | None = None
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._scripts: dict[str, deque[Step]] = {}
        self._lock = threading.Lock()
        self._prepare("the hostile server")

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def script(self, path: str, *steps: Step) -> None:
        """Queue `steps` for requests to `path` (then the default step answers)."""
        with self._lock:
            self._scripts.setdefault(path, deque()).extend(steps)

    def requests(self, path: str | None = None) -> list[Seen]:
        """The requests received so far (to `path` only, when given)."""
        with self._lock:
            return [s for s in self.seen if path is None or s.path == path]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                seen = await asyncio.wait_for(_read_request(reader), IO_TIMEOUT_S)
                if seen is None:
                    return
                with self._lock:
                    self.seen.append(seen)
                    queue = self._scripts.get(seen.path)
                    chosen = self.respond(seen) if self.respond is not None else None
                    step = chosen or (queue.popleft() if queue else self.default)
                await self._answer(writer, step)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, step: Step) -> None:
        if step.delay:
            await asyncio.sleep(step.delay)
        names = {name.lower() for name, _ in step.headers}
        lines = [f"HTTP/1.1 {step.status} X"]
        lines += [f"{name}: {value}" for name, value in step.headers]
        if "content-length" not in names:
            lines.append(f"Content-Length: {len(step.body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.write(head)
        if step.drip is None:
            writer.write(step.body)
            await writer.drain()
            return
        await writer.drain()
        for byte in step.body:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(step.drip)


async def _read_request(reader: asyncio.StreamReader) -> Seen | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return Seen(method, target.split("?", 1)[0], headers, body)


class ProxyProbe(_Served):
    """A loopback listener standing in for a proxy: records every connection's request head
    and its first line."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.first_lines: list[str] = []
        self._prepare("the proxy probe")

    @property
    def url(self) -> str:
        """The proxy URL to configure."""
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IO_TIMEOUT_S)
            self.heads.append(head)
            self.first_lines.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
            # Refuse whatever it was: the test only needs to know it came here.
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        writer.close()


def self_signed_tls(tmp: Path) -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


def json_body(value: Any) -> bytes:
    """`value` as a JSON body (strict, UTF-8)."""
    return json.dumps(value).encode("utf-8")


def _number_text() -> st.SearchStrategy[str]:
    """Number-like header text: huge, negative, NaN, infinite or not a number at all."""
    return st.one_of(
        st.integers(min_value=-(10**20), max_value=10**20).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(["NaN", "-0", "1e999", "999999999999999", "", "?", "1.5.3", "0x10"]),
    )


@st.composite
def hostile_ratelimit_headers(draw: st.DrawFn) -> dict[str, str]:
    """RateLimit fields of every format, with huge, negative, NaN and malformed values."""
    r, t, q, w = (draw(_number_text()) for _ in range(4))
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return {"ratelimit": f'"p";r={r};t={t}', "ratelimit-policy": f'"p";q={q};w={w}'}
    if choice == 1:
        return {"ratelimit": f"limit={q}, remaining={r}, reset={t}"}
    if choice == 2:
        return {"x-ratelimit-limit": q, "x-ratelimit-remaining": r, "x-ratelimit-reset": t}
    if choice == 3:
        return {
            "ratelimit-limit": f"{q}, {q};w={w}",
            "ratelimit-remaining": r,
            "ratelimit-reset": t,
        }
    return {"retry-after": t, "date": draw(st.sampled_from(["", "Fri, 31 Dec 9999 23:59:59 GMT"]))}
