"""Socket checks shared by the tests of the worker's listeners."""

from __future__ import annotations

import socket


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the peer closes `sock` within `seconds` (False when it is still open)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
