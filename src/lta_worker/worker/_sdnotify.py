"""systemd's notify protocol: READY, STATUS, WATCHDOG, RELOADING, STOPPING, over $NOTIFY_SOCKET.

A few lines of socket code rather than a dependency: the protocol is one datagram of
newline-separated `KEY=VALUE` pairs to a unix socket (a leading `@` means the abstract
namespace). Without $NOTIFY_SOCKET every call does nothing. The watchdog is on when
$WATCHDOG_USEC is a positive number and $WATCHDOG_PID, if set, is this process; pings
then go at half that period, as sd_watchdog_enabled(3) advises.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping


class Notifier:
    """Sends notifications to systemd when run under a `Type=notify` unit."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        watchdog = usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid()))
        self.watchdog_interval: float | None = int(usec) / 1e6 / 2 if watchdog else None

    @property
    def enabled(self) -> bool:
        """True when a notify socket is configured."""
        return bool(self._address)

    def notify(self, **fields: str | int) -> bool:
        """Send `KEY=VALUE` lines (keys upper-cased); False when there is no socket or it fails."""
        if not self._address:
            return False
        payload = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(payload, self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        """Tell systemd the service is up."""
        return self.notify(ready=1, status=status, mainpid=os.getpid())

    def status(self, text: str) -> bool:
        """Update the status line `systemctl status` shows."""
        return self.notify(status=text)

    def watchdog(self) -> bool:
        """Ping the watchdog."""
        return self.notify(watchdog=1)

    def reloading(self, status: str) -> bool:
        """Tell systemd a reload began (`ready` ends it); MONOTONIC_USEC as notify-reload needs."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify(reloading=1, status=status, monotonic_usec=usec)

    def stopping(self, status: str) -> bool:
        """Tell systemd the service is shutting down."""
        return self.notify(stopping=1, status=status)
