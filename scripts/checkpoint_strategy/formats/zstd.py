"""Decoding one zstd frame of Orbax array values (its zarr3 zstd codec) with the optional `zstandard` package.

`formats.orbax.zstd_frame_end` walks a frame's headers and block sizes without decoding; this module decodes
the frame as tensorstore does when Orbax restores, so full refuses what the restore refuses: a corrupt compressed
block, a content checksum mismatch (when the frame carries one), content of another size than the header declares.
`zstandard` is imported lazily: without it `available()` is False and nothing is decoded (validate/coverage.py then
names the blind spot). Output is streamed and counted, never held whole: memory stays at one read buffer whatever a
hostile frame declares, and reading stops one buffer past the declared content size.
"""

from __future__ import annotations

_READ = 1 << 20  # bytes of output per read: the only memory a frame costs


def available() -> bool:
    """Whether the optional `zstandard` package is installed (pip install zstandard, or the frameworks extra)."""
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


def frame_problem(data: bytes, start: int, end: int, declared: int, limit: int) -> str | None:
    """Decode the zstd frame data[start:end] (whole: its end found by the walk, which refuses a truncated frame;
    a stream that stops early is seen here only against a declared size), counting its output: what zstandard
    refuses, or output that differs from `declared` (-1: none declared) or exceeds `limit`, as one line; None when
    it decodes (or zstandard is not installed). Nothing is kept: the values are not returned."""
    try:
        import zstandard
    except ImportError:
        return None
    cap = min(declared, limit) if declared >= 0 else limit
    produced = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(
            memoryview(data)[start:end], read_across_frames=False
        ) as r:
            while produced <= cap:
                chunk = r.read(_READ)
                if not chunk:
                    break
                produced += len(chunk)
    except zstandard.ZstdError as exc:
        return f"does not decode ({str(exc).splitlines()[0][:160]})"
    if produced > cap:
        return f"decodes to more than {cap} bytes" + (
            " (its declared content size)" if cap == declared else ""
        )
    if declared >= 0 and produced != declared:
        return f"decodes to {produced} bytes, its header declares {declared}"
    return None
