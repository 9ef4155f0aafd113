"""The capped Content-Encoding decoder on its own: exact within the cap, bounded past it."""

from __future__ import annotations

import tracemalloc
import zlib

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.upstream._decode import CHUNK, CappedDecoder

# Each name: how a server applies it (None: the bytes are left as they are).
CODINGS = {
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,
    "raw deflate": -zlib.MAX_WBITS,  # sent as `deflate`
    "identity": None,
    "br": None,  # not decoded: left as it came
}


def encode(data: bytes, names: list[str]) -> tuple[bytes, list[str]]:
    """`data` with each coding applied in order, and the Content-Encoding header's values."""
    for name in names:
        wbits = CODINGS[name]
        if wbits is not None:
            squeezer = zlib.compressobj(6, zlib.DEFLATED, wbits)
            data = squeezer.compress(data) + squeezer.flush()
    return data, ["deflate" if name == "raw deflate" else name for name in names]


def decode(raw: bytes, header: list[str], cap: int, piece: int) -> tuple[bytes, bool]:
    decoder = CappedDecoder(header, cap)
    for start in range(0, len(raw), piece):
        if decoder.feed(raw[start : start + piece]):
            return decoder.result()
    decoder.finish()
    return decoder.result()


@given(
    unit=st.binary(min_size=1, max_size=300),
    repeat=st.integers(1, 1000),
    names=st.lists(st.sampled_from(sorted(CODINGS)), max_size=3),
    cap=st.integers(1, 400_000),
    piece=st.integers(1, 70_000),
)
def test_the_decoded_body_is_the_original_cut_at_the_cap(
    unit: bytes, repeat: int, names: list[str], cap: int, piece: int
) -> None:
    """Any stack of codings, any cap, any split of the raw body: the first `cap` bytes, exact."""
    data = unit * repeat
    raw, header = encode(data, names)
    assert decode(raw, header, cap, piece) == (data[:cap], len(data) > cap)


def test_a_body_larger_than_a_chunk_passes_every_layer_whole() -> None:
    """Several chunks' worth of output through two layers comes out whole and in order."""
    data = b"".join(b"%08d," % n for n in range(CHUNK))  # 9 chunks of output
    raw, header = encode(data, ["deflate", "gzip"])
    assert decode(raw, header, len(data), 4096) == (data, False)
    assert decode(raw, header, len(data) - 1, 4096) == (data[:-1], True)


def test_input_past_the_end_of_an_inner_stream_is_not_kept() -> None:
    """What an outer layer inflates after the inner stream ended is dropped, not accumulated."""
    inner, _ = encode(b"tiny", ["gzip"])
    zeros = bytes(1024 * 1024)
    squeezer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    outer = squeezer.compress(inner)
    outer += b"".join(squeezer.compress(zeros) for _ in range(64)) + squeezer.flush()
    tracemalloc.start()
    try:
        result = decode(outer, ["gzip", "gzip"], 1024 * 1024, 16 * 1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result == (b"tiny", False)  # as httpx answers: trailing data ignored
    assert peak < 2 * 1024 * 1024, f"peak {peak:,} bytes"


@pytest.mark.parametrize(
    ("header", "raw"),
    [
        (["gzip"], b"not gzip"),
        (["deflate"], b"\xff\xff not deflate either way"),
    ],
)
def test_data_that_does_not_decode_raises_httpx_decoding_error(
    header: list[str], raw: bytes
) -> None:
    """Corrupt data raises httpx.DecodingError, the error httpx's own decoders raise."""
    with pytest.raises(httpx.DecodingError):
        decode(raw, header, 1024, 3)


def test_an_empty_body_with_an_encoding_is_empty() -> None:
    """A gzip-labelled empty body (a HEAD or 204 answer) decodes to nothing, as httpx's does."""
    assert decode(b"", ["gzip"], 1024, 1) == (b"", False)
