"""The simulator for the benchmarks: faithful enrollment of many users, then served on loopback.

Enrollment goes through the same `Simulator.handle_*` methods the HTTP routes call (queued
consent, `/oidc/auth` with PKCE S256, code exchange with client_secret_basic, token
creation), without the HTTP round trips, so thousands of users enroll in seconds and every
token is a real one the service knows.

Run as a child process (`python -m bench.simproc ...`) so that the simulator and the worker
under test do not share a GIL: it enrolls the users, writes `user<TAB>token` lines to
`--tokens` (mode 0600), prints one JSON line with its URLs once it listens, and serves until
its stdin closes (the parent stops it by closing the pipe, or by dying).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import socket
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from urllib.parse import parse_qs, quote_plus, urlsplit

from lta_worker.simulator import (
    DEMO_CLIENT_ID,
    DEMO_CLIENT_SECRET,
    LONG_TERM_SCOPES,
    RunningSimulator,
    Simulator,
    start_in_thread,
)
from lta_worker.simulator.oauth import s256

REDIRECT_URI = "http://127.0.0.1/lta/callback"
MAX_LIFETIME_S = 3600.0


def enroll(
    sim: Simulator, users: Iterable[str], scopes: Sequence[str] = LONG_TERM_SCOPES
) -> Iterator[tuple[str, str]]:
    """Enroll each user (consenting to `scopes`); yield (user, long term token).

    Raises:
        RuntimeError: a step of the flow was refused (the simulator's answer is named).
    """
    pair = f"{quote_plus(DEMO_CLIENT_ID)}:{quote_plus(DEMO_CLIENT_SECRET)}"
    basic = "Basic " + base64.b64encode(pair.encode()).decode()
    scope = " ".join(("openid", *LONG_TERM_SCOPES))
    for user in users:
        sim.queue_consent(user, list(scopes))
        verifier = secrets.token_urlsafe(48)
        params = {
            "client_id": DEMO_CLIENT_ID,
            "redirect_uri": REDIRECT_URI,
            "response_type": "code",
            "scope": scope,
            "state": secrets.token_urlsafe(16),
            "code_challenge": s256(verifier),
            "code_challenge_method": "S256",
        }
        consent = sim.handle_authorize("/auth/oidc/auth", params)
        if consent.location is None:
            raise RuntimeError(f"consent refused: {consent.error}")
        code = parse_qs(urlsplit(consent.location).query)["code"][0]
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": REDIRECT_URI,
            "code_verifier": verifier,
        }
        exchanged = sim.handle_token("/auth/oidc/token", form, basic)
        if exchanged.status != 200:
            raise RuntimeError(f"code exchange refused: {exchanged.error}")
        access = exchanged.body["access_token"]
        created = sim.handle_enroll("/auth/api/long-term-access/tokens", f"Bearer {access}")
        if created.body is None:
            raise RuntimeError("token creation refused")
        yield user, created.body["token"]
    sim.clear_requests()


def no_delay(running: RunningSimulator) -> None:
    """Turn Nagle's algorithm off on the simulator's listening socket (Linux: inherited).

    `start_in_thread` binds a socket made with proto 0, so asyncio's own TCP_NODELAY (set
    only when `sock.proto == IPPROTO_TCP`) is skipped on the accepted connections: uvicorn
    writes the head and the body of an answer separately, and the body then waits for the
    client's delayed ACK, about 40 ms per request on loopback. Real services do not do this.
    """
    running._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def user_ids(prefix: str, count: int) -> list[str]:
    """`count` user ids `prefix-000000`, ... (sortable, distinct)."""
    return [f"{prefix}-{i:07d}" for i in range(count)]


def write_tokens(path: Path, tokens: Iterable[tuple[str, str]]) -> int:
    """Write `user<TAB>token` lines to a new 0600 file; return how many."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    count = 0
    with os.fdopen(fd, "w") as fh:
        for user, token in tokens:
            fh.write(f"{user}\t{token}\n")
            count += 1
    return count


def read_tokens(path: Path) -> list[tuple[str, str]]:
    """The (user, token) pairs of a file written by `write_tokens`."""
    pairs = []
    for line in path.read_text().splitlines():
        user, token = line.split("\t")
        pairs.append((user, token))
    return pairs


def main(argv: list[str] | None = None) -> None:
    """Enroll, write the tokens, serve until stdin closes."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=0)
    parser.add_argument("--prefix", default="u")
    parser.add_argument("--tokens", type=Path)
    parser.add_argument("--budget", type=int, default=10**9)
    parser.add_argument("--window", type=int, default=3600)
    parser.add_argument("--scopes", default=",".join(LONG_TERM_SCOPES))
    parser.add_argument("--nagle", action="store_true", help="keep the 40 ms loopback stall")
    args = parser.parse_args(argv)
    sim = Simulator()
    sim.configure(budget=args.budget, window=args.window)
    if args.users:
        if args.tokens is None:
            parser.error("--users needs --tokens")
        scopes = [s for s in args.scopes.split(",") if s]
        write_tokens(args.tokens, enroll(sim, user_ids(args.prefix, args.users), scopes))
    with start_in_thread(sim) as running:
        if not args.nagle:
            no_delay(running)
        print(json.dumps({"base_url": running.base_url, "auth_url": running.auth_url}))
        sys.stdout.flush()
        # Serve until the parent closes our stdin (or dies); never longer than an hour.
        os.set_blocking(sys.stdin.fileno(), True)
        _wait_for_eof(MAX_LIFETIME_S)


def _wait_for_eof(limit_s: float) -> None:
    import select
    import time

    deadline = time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], min(left, 5.0))
        if ready and not os.read(sys.stdin.fileno(), 4096):
            return


if __name__ == "__main__":
    main()
