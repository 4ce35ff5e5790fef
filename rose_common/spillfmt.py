"""The on-disk format of spilled suspended state, shared by the driver's disk tier
(``dra_driver.suspend.spill``) and the SDK, which writes its own host copy in it when the driver
asks it to spill (``rose_sdk.offload``). Pure format code, no policy, standard library only.

A file is a header ``<8s magic "ROSESPL1"><u64 payload bytes><u32 chunk size>`` followed by
chunks ``<u32 length><32 B blake2b-256 of the chunk><the chunk>``. The header's payload size is
written last (0 until every chunk is written), so a torn file never reads as complete.
:func:`read_chunks` verifies every chunk before yielding it and raises :class:`FormatCorrupt` on a
bad magic, a bad digest, a short file or trailing bytes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO, Final

MAGIC: Final = b"ROSESPL1"
HEADER: Final = struct.Struct("<8sQI")  # magic, payload bytes, chunk size
CHUNK: Final = struct.Struct("<I32s")  # chunk length, blake2b-256 digest of the chunk
DEFAULT_CHUNK_BYTES: Final = 8 << 20
MAX_CHUNK_BYTES: Final = 1 << 30


class FormatCorrupt(ValueError):
    """A spill file fails its checksum, is truncated, or is not a spill file."""


def digest(b: bytes | memoryview) -> bytes:
    return hashlib.blake2b(b, digest_size=32).digest()


def check_chunk_bytes(chunk_bytes: int) -> int:
    if chunk_bytes <= 0 or chunk_bytes > MAX_CHUNK_BYTES:
        raise ValueError(f"spill chunk size must be between 1 B and 1 GiB, got {chunk_bytes}")
    return chunk_bytes


def write_chunks(
    f: BinaryIO,
    chunks: Iterable[bytes | memoryview],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    after_first: Callable[[], None] | None = None,
) -> int:
    """Write the spill format to ``f`` (seekable, positioned at 0): header, then ``chunks`` cut
    at ``chunk_bytes``, each with its digest, then the header again with the payload size. The
    caller flushes and fsyncs. ``after_first`` runs once the first input chunk is flushed (the
    driver's crash point). Returns the payload bytes."""
    check_chunk_bytes(chunk_bytes)
    total = 0
    first = True
    f.write(HEADER.pack(MAGIC, 0, chunk_bytes))
    for c in chunks:
        view = memoryview(c).cast("B")
        for off in range(0, len(view), chunk_bytes):
            part = view[off : off + chunk_bytes]
            f.write(CHUNK.pack(len(part), digest(part)))
            f.write(part)
            total += len(part)
        if first and after_first is not None:
            f.flush()
            after_first()
        first = False
    f.seek(0)
    f.write(HEADER.pack(MAGIC, total, chunk_bytes))
    f.flush()
    return total


def payload_bytes(f: BinaryIO, name: str = "spill file") -> int:
    """The payload size a file's header records (not verified); FormatCorrupt on a bad header."""
    head = f.read(HEADER.size)
    if len(head) != HEADER.size:
        raise FormatCorrupt(f"{name}: truncated header")
    magic, total, _ = HEADER.unpack(head)
    if magic != MAGIC:
        raise FormatCorrupt(f"{name}: not a spill file (magic {magic!r})")
    return int(total)


def read_chunks(f: BinaryIO, name: str = "spill file") -> Iterator[bytes]:
    """The payload of ``f`` (positioned at 0), chunk by chunk, each verified before it is yielded."""
    total = payload_bytes(f, name)
    seen = 0
    i = 0
    while seen < total:
        ch = f.read(CHUNK.size)
        if len(ch) != CHUNK.size:
            raise FormatCorrupt(f"{name}: truncated at chunk {i} ({seen} of {total} B)")
        n, want = CHUNK.unpack(ch)
        if n == 0 or seen + n > total:
            raise FormatCorrupt(f"{name}: chunk {i} length {n} does not fit the {total} B recorded")
        data = f.read(n)
        if len(data) != n or digest(data) != want:
            raise FormatCorrupt(f"{name}: chunk {i} (bytes {seen}..{seen + n}) fails its blake2b checksum")
        seen += n
        i += 1
        yield data
    if f.read(1):
        raise FormatCorrupt(f"{name}: trailing bytes after the {total} B recorded")
