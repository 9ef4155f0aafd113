"""Which connections a listener keeps, for both of `serve`'s listeners (metrics and enrollment).

A slow client (slowloris) must never lock out a well-behaved one: a Prometheus scrape, a
health probe, a browser. Both listeners keep at most a fixed number of connections; a
connection has a deadline for its whole request head (not a limit per read, which a client
sending a byte now and then never hits); and past the cap, a new connection takes the place
of the oldest one still sending its head, instead of being refused. A well-behaved client
sends its head at once, so it is closed only if the cap's worth of newer connections arrive
before its head is read; the slow ones are always older.
"""

from __future__ import annotations


class Admission:
    """Which connections the server keeps: pure bookkeeping, no I/O, `now` passed in.

    A connection is *waiting* from its connect until its request head is complete, then
    *answering* until it is released. At most `cap` are kept; a new one past the cap takes
    the place of the oldest waiting one, and is refused only when all are answering. A
    waiting one past `deadline` seconds is expired.
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
        """`conn` was answered and stays open for its next request: waiting again, as the
        newest, with a new deadline."""
        if conn in self.answering:
            self.answering.discard(conn)
            self.waiting[conn] = now + self.deadline

    def release(self, conn: object) -> None:
        """`conn` is closed: forget it."""
        self.waiting.pop(conn, None)
        self.answering.discard(conn)
