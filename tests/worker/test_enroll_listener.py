"""The enrollment listener's connection handling without a service: its cap follows the
descriptor limit, and accept() failing for want of descriptors is one JSON event a minute,
never a flood of plain tracebacks (a real listener in a child with a low RLIMIT_NOFILE)."""

from __future__ import annotations

import json
import selectors
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from lta_worker.worker._enroll import MAX_CONNECTIONS, AcceptFailures, connection_cap


@pytest.mark.parametrize(
    ("limit", "cap"),
    [(256, 64), (1024, MAX_CONNECTIONS), (524288, MAX_CONNECTIONS), (2, 1)],
)
def test_the_cap_is_a_quarter_of_the_descriptor_limit_at_most(limit: int, cap: int) -> None:
    """The listener keeps at most a quarter of the descriptors, and never more than its cap."""
    assert connection_cap(limit) == cap


def test_accept_failures_are_reported_once_per_period_with_their_count() -> None:
    """The first refusal is reported at once; later ones in the period are counted into the next."""
    failures = AcceptFailures(every=60.0)
    assert failures.note(now=0.0) == 1
    assert [failures.note(now=t) for t in (1.0, 2.0, 59.0)] == [None, None, None]
    assert failures.note(now=61.0) == 4
    assert failures.note(now=62.0) is None


# A listener as `serve` runs it (backlog, exception handler), in a child that has only a few
# descriptors left: it accepts and holds connections until accept() fails with EMFILE.
_CHILD = textwrap.dedent(
    """
    import asyncio, resource, socket, sys
    from lta_worker.logs import configure_logging
    from lta_worker.worker._listen import Admission
    from lta_worker.worker._enroll import BACKLOG, report_accept_failures

    configure_logging(fmt="json")
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(report_accept_failures(Admission(1000, 10.0), None))
        sock = socket.create_server(("127.0.0.1", 0), backlog=BACKLOG)
        await loop.create_server(asyncio.Protocol, sock=sock, backlog=BACKLOG)
        print(sock.getsockname()[1], flush=True)
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin

    asyncio.run(main())
    """
)


def test_running_out_of_descriptors_is_one_json_event() -> None:
    """Out of descriptors (EMFILE): one `enroll.accept_failed` event with its count, no more."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    socks: list[socket.socket] = []
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        with selectors.DefaultSelector() as selector:
            for _ in range(200):
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", port))
                socks.append(sock)
                selector.register(sock, selectors.EVENT_WRITE)
            deadline = time.monotonic() + 10
            while selector.get_map() and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=1):
                    selector.unregister(key.fileobj)
        assert child.stderr is not None
        first = child.stderr.readline()  # the first report: descriptors ran out
        time.sleep(2.5)  # two of asyncio's accept retries, each of which reported every attempt
        _, rest = child.communicate(b"", timeout=30)  # stdin closed: the child ends
    finally:
        for sock in socks:
            sock.close()
        child.kill()
        child.wait()
    err = first + rest
    lines = err.decode().splitlines()
    assert len(err) < 4_000, err[:2_000]
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["enroll.accept_failed"]
    assert events[0]["error"] == "EMFILE"
    assert events[0]["count"] == 1
    assert events[0]["level"] == "error"
