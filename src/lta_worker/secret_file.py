"""The one rule for every secret file (docs/config.md, "Credential files"): a regular file,
closed to group and others, at most 64 KiB, without a byte order mark. Messages name the file
and the setting, never any of its content.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from lta_worker.errors import ConfigError

MAX_BYTES: Final = 65_536
BOM: Final = b"\xef\xbb\xbf"
_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_mode(path: Path, mode: int, *, key: str, error: type[ConfigError] = ConfigError) -> None:
    """Refuse a secret file that is not a regular file or that group or others can access."""
    source = f"{str(path)!r}"
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise error(f"{source} is {kind}, not a regular file", key=key)
    if mode & 0o077:
        raise error(
            f"{source} is readable by group or others (mode {stat.S_IMODE(mode):04o})",
            key=key,
            hint=f"chmod 600 {path}",
        )


def read_secret_file(path: Path, *, key: str, error: type[ConfigError] = ConfigError) -> bytes:
    """Read the secret file that setting `key` names, under the rule; return its bytes.

    Raises:
        ConfigError: (or `error`) naming `key`, when the file breaks the rule or cannot be read;
            reason `missing` when it does not exist, `unreadable` when this user may not
            read it.
    """
    source = f"{str(path)!r}"
    try:
        check_mode(path, os.stat(path).st_mode, key=key, error=error)
        # O_NONBLOCK: should the path become a FIFO after the check, opening it still
        # returns at once (and fstat below refuses it).
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{source} does not exist", key=key, reason="missing") from None
    except PermissionError as exc:  # root's file under a unit's DynamicUser (cli/_failure.py)
        raise error(
            f"{source} cannot be read ({exc.strerror})", key=key, reason="unreadable"
        ) from None
    except OSError as exc:
        raise error(f"{source} cannot be read ({exc.strerror})", key=key) from None
    try:
        check_mode(path, os.fstat(fd).st_mode, key=key, error=error)
        data = b""
        while len(data) <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise error(f"{source} cannot be read ({exc.strerror})", key=key) from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise error(f"{source} is larger than {MAX_BYTES} bytes: is it the right file?", key=key)
    if data.startswith(BOM):
        raise error(
            f"{source} starts with a UTF-8 byte order mark (BOM)",
            key=key,
            hint=f"save it without a BOM, e.g. `sed -i '1s/^\\xEF\\xBB\\xBF//' {path}`",
        )
    return data
