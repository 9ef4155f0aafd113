"""`serve`'s listening sockets (bound before READY; `check` tries them) and which
connections a listener keeps (`Admission`), so a slow client never locks the others out.
"""

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
    """A listening TCP socket on `HOST:PORT` (`SO_REUSEADDR`), or ConfigError naming `key`."""
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


class Admission:
    """Which connections a listener keeps: pure bookkeeping, `now` passed in.

    A connection is *waiting* until its request head is complete, then *answering*. Past
    `cap`, a new one takes the place of the oldest waiting one (the slow ones are always
    older), refused only when all are answering; a waiting one past `deadline` seconds for
    its whole head (not per read: a client trickling bytes never hits that) is expired.
    """

    def __init__(self, cap: int, deadline: float) -> None:
        self.cap = cap
        self.deadline = deadline
        self.waiting: dict[object, float] = {}  # connection -> its deadline; oldest first
        self.answering: set[object] = set()

    @property
    def kept(self) -> int:
        """How many connections are kept now."""
        return len(self.waiting) + len(self.answering)

    def admit(self, conn: object, now: float) -> tuple[bool, list[object]]:
        """Take `conn` in; returns whether it was, and the connections to close for it."""
        evicted: list[object] = []
        while self.waiting and self.kept >= self.cap:
            oldest = next(iter(self.waiting))
            del self.waiting[oldest]
            evicted.append(oldest)
        if self.kept >= self.cap:
            return False, evicted
        self.waiting[conn] = now + self.deadline
        return True, evicted

    def head_done(self, conn: object) -> bool:
        """`conn` sent its whole head: answer it (False when it was closed meanwhile)."""
        if self.waiting.pop(conn, None) is None:
            return False
        self.answering.add(conn)
        return True

    def expired(self, now: float) -> list[object]:
        """The waiting connections past their deadline, which are no longer kept."""
        late = [conn for conn, deadline in self.waiting.items() if deadline <= now]
        for conn in late:
            del self.waiting[conn]
        return late

    def wait_again(self, conn: object, now: float) -> None:
        """`conn` was answered and stays open: waiting again, as the newest, with a new deadline."""
        if conn in self.answering:
            self.answering.discard(conn)
            self.waiting[conn] = now + self.deadline

    def release(self, conn: object) -> None:
        """`conn` is closed: forget it."""
        self.waiting.pop(conn, None)
        self.answering.discard(conn)
