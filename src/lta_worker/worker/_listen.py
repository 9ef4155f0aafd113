"""The listening sockets of `serve` (`metrics.listen`, `enroll.listen`): bound before READY,
and tried by `check`, which lets them go at once, so that a taken address fails `check` as
it stops `serve` (exit 78, naming the key)."""

from __future__ import annotations

import socket
from typing import Final

from lta_worker.config import parse_listen
from lta_worker.errors import ConfigError

LISTEN_HINT: Final = (
    "another process holds it (`ss -ltnp` names it), or the host is not an address of this "
    "machine: stop that process, or pick a free port or another address"
)


def listen_socket(listen: str, *, key: str, backlog: int = 64) -> socket.socket:
    """A listening TCP socket on `HOST:PORT` (`SO_REUSEADDR`, as `serve`'s servers bind).

    Raises:
        ConfigError: naming `key`, with `LISTEN_HINT`, when the address cannot be bound.
    """
    host, port = parse_listen(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        sock = socket.socket(infos[0][0], socket.SOCK_STREAM, socket.IPPROTO_TCP)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {listen} ({exc})", key=key, hint=LISTEN_HINT) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {listen} ({exc.strerror})", key=key, hint=LISTEN_HINT
        ) from None
    return sock
