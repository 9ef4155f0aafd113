"""Content-Encoding undone within the response cap, however far the body inflates.

httpx's own decoders inflate each chunk whole: a few kilobytes of `gzip, gzip` inflate to
gigabytes before any cap can count them. `CappedDecoder` undoes the same codings
(`gzip`/`x-gzip`, `deflate` zlib-wrapped or raw, `identity`) with zlib's `max_length`, so
that no layer ever hands on more than `CHUNK` bytes at a time and the last one stops one
byte past the cap. Memory stays near the cap plus, per layer, a chunk and zlib's window.

Codings it does not decode (br, zstd, compress, anything else) are skipped, as httpx skips
a coding it has no decoder for; the client never asks for them (`http_client` sends
`Accept-Encoding: gzip, deflate`). Data that does not decode raises `httpx.DecodingError`,
as httpx's decoders do.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Final

import httpx

# The most output one layer hands on to the next at a time.
CHUNK: Final = 64 * 1024
# Each layer holds a zlib window and a chunk; urllib3 stops at the same number of links.
MAX_LAYERS: Final = 5

_WBITS: Final = {
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,  # zlib-wrapped, as RFC 9110 says; raw deflate on refusal
}


class _Layer:
    """One coding being undone: a zlib inflater fed in pieces it may only partly consume."""

    __slots__ = ("_head", "_inflater")

    def __init__(self, wbits: int) -> None:
        self._inflater = zlib.decompressobj(wbits)
        # `deflate` is zlib-wrapped (RFC 9110), but some servers send raw deflate: as httpx's
        # DeflateDecoder, retry as raw when the zlib header is refused. The bytes seen until
        # the header's two are in are kept for that retry; None once it can no longer come.
        self._head: bytes | None = b"" if wbits == zlib.MAX_WBITS else None

    def inflate(self, data: bytes, limit: int) -> tuple[bytes, bytes]:
        """At most `limit` bytes of output, and the part of `data` not consumed yet.

        Input past the end of the stream is dropped (httpx ignores it too) rather than
        kept in zlib's `unused_data`, which an inflating outer layer could grow without end.

        Raises:
            httpx.DecodingError: the data is not of this coding.
        """
        if self._inflater.eof:
            return b"", b""
        try:
            out = self._inflater.decompress(data, limit)
        except zlib.error as exc:
            if self._head is None:
                raise httpx.DecodingError(str(exc)) from exc
            data, self._head = self._head + data, None
            self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            return self.inflate(data, limit)
        tail = self._inflater.unconsumed_tail
        if self._head is not None:
            head = self._head + data[: len(data) - len(tail)]
            self._head = head if len(head) < 2 else None  # a zlib header has been accepted
        return out, tail


class CappedDecoder:
    """Undoes a body's Content-Encoding, keeping no more than `cap` bytes of it.

    Feed it the raw body piece by piece (`feed`) until it says it is over the cap or the body
    ends (`finish`); `result` gives the first `cap` decoded bytes and whether there were more.

    Args:
        codings: the Content-Encoding values in the header's order (applied first, first).
        cap: the most bytes of decoded body to keep.

    Raises:
        httpx.DecodingError: more than `MAX_LAYERS` codings to undo.
    """

    __slots__ = ("_cap", "_chunks", "_layers", "_size")

    def __init__(self, codings: Sequence[str], cap: int) -> None:
        names = [name.strip().lower() for name in reversed(codings)]
        wbits = [_WBITS[name] for name in names if name in _WBITS]
        if len(wbits) > MAX_LAYERS:
            raise httpx.DecodingError(
                f"{len(wbits)} stacked content codings; at most {MAX_LAYERS} are decoded"
            )
        self._layers = [_Layer(bits) for bits in wbits]
        self._cap = cap
        self._chunks: list[bytes] = []
        self._size = 0

    @property
    def decodes(self) -> bool:
        """False when no coding needs undoing (identity, or only codings left as they are)."""
        return bool(self._layers)

    @property
    def over(self) -> bool:
        """True once the decoded body is longer than the cap."""
        return self._size > self._cap

    def feed(self, data: bytes) -> bool:
        """Decode the next piece of the raw body; True once the decoded body is over the cap."""
        if self._layers:
            self._push(0, data)
        elif not self.over:
            self._keep(data)
        return self.over

    def finish(self) -> None:
        """The raw body has ended: hand on whatever the layers still hold (within the cap)."""
        for level in range(len(self._layers)):
            self._push(level, b"")

    def result(self) -> tuple[bytes, bool]:
        """The first `cap` bytes of the decoded body, and True when it was longer."""
        return b"".join(self._chunks), self.over

    def _keep(self, data: bytes) -> None:
        room = self._cap - self._size
        self._chunks.append(data if len(data) <= room else data[:room])
        self._size += len(data)

    def _push(self, level: int, data: bytes) -> None:
        """Inflate `data` at `level` and pass every piece on, until it is all consumed, the
        layer holds no more output, or the decoded body is over the cap."""
        layer = self._layers[level]
        last = level + 1 == len(self._layers)
        while not self.over:
            limit = min(CHUNK, self._cap + 1 - self._size) if last else CHUNK
            out, data = layer.inflate(data, limit)
            if out and last:
                self._keep(out)
            elif out:
                self._push(level + 1, out)
            if not data and len(out) < limit:
                return  # all input used, and room was left: nothing is pending inside zlib


__all__ = ["CHUNK", "MAX_LAYERS", "CappedDecoder"]
