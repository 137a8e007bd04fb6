"""Storage.read_bytes's reader loop (``storage.base.read_pieces``): the bytes, pieces no larger than READ_PIECE."""
from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_acp.storage.base import READ_PIECE, read_pieces


class _Recording(io.BytesIO):
    """A real in-memory reader that records what it was asked for."""

    def __init__(self, data: bytes, short: int = 0) -> None:
        super().__init__(data)
        self.asked: list = []
        self.short = short  # >0: return at most this many bytes per call (a reader may return less)

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        self.asked.append(n)
        return super().read(min(n, self.short) if self.short and n is not None and n >= 0 else n)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 3 * READ_PIECE + 3), limit=st.one_of(st.none(), st.integers(0, 4 * READ_PIECE)),
       short=st.sampled_from([0, 1, 4096, READ_PIECE - 1]))
def test_the_bytes_or_the_first_limit_plus_one_in_pieces(size: int, limit, short: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    if short == 1 and size > 20000:
        data = data[:20000]  # one byte per call: keep the example quick
    f = _Recording(data, short)
    want = None if limit is None else limit + 1
    out = read_pieces(f, want)
    assert out == (data if want is None else data[:want])
    assert all(0 < n <= READ_PIECE for n in f.asked)  # never the limit at once, never "everything"
    if want is not None and len(data) >= want:
        assert len(out) == want  # stopped at the limit
