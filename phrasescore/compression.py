"""gzip for tables: Intel ISA-L (python-isal) where it is installed, zlib where it is not.

Compression is the slowest step of a table's path, and ISA-L's low levels compress many times
faster than zlib's level 6 (what ``gzip`` writes by default) for somewhat larger output, and
decompress faster too (the figures: docs/benchmarks.md, "Table I/O").

* **Levels** (:func:`check_level`): 0-3 are ISA-L's (``isal.igzip``; 0 is Huffman coding
  alone, not "stored"), 4-9 zlib's (6 is gzip's default, what every ``.gz`` output other than
  a table is written with). :data:`TABLE_LEVEL` (1) is what ``rescore`` writes by default.
  Without python-isal, levels 0-3 fall back to zlib at the same level (with a warning once):
  the content is the same, the bytes are not, so :func:`compressor` names the library in the
  resume key of a partial output.
* **Same bytes.** A member has a fixed header (no name, mtime 0): the same content and level
  give the same bytes with the same library. ISA-L picks its code paths by CPU features, which
  we have not seen change the bytes but cannot rule out across machines.
* **Members.** :func:`compress_member` makes one complete gzip member; members concatenate into
  one valid gzip file (RFC 1952, 2.2), which is how ``rescore`` writes a chunk at a time and
  ``merge-shards`` joins parts. Every gzip reader (Moses' ``util::FilePiece``, zcat, Python)
  reads them as one stream.
* **Reading** (:func:`gzip_reader`): ISA-L's reader where installed; its errors are the ones
  zlib's reader raises (EOFError, :class:`gzip.BadGzipFile`) or :data:`READ_ERRORS`.
"""

from __future__ import annotations

import functools
import gzip
import io
import logging
import zlib
from typing import BinaryIO

log = logging.getLogger(__name__)

try:  # python-isal: a declared dependency; zlib stands in where it cannot be imported
    from isal import igzip, isal_zlib
except ImportError:  # pragma: no cover - exercised only without python-isal
    igzip = None
    isal_zlib = None

ZLIB_LEVEL = 6
"""gzip's default level: every ``.gz`` output other than a table's (n-best lists, corpora)."""
TABLE_LEVEL = 1
"""``rescore --gzip-level``'s default: ISA-L's level 1, its fastest real compression, many
times zlib's 6 for somewhat more bytes (docs/benchmarks.md, "Table I/O")."""
ISAL_LEVELS = range(0, 4)
LEVELS = range(0, 10)

READ_ERRORS: tuple[type[BaseException], ...] = (EOFError, gzip.BadGzipFile, zlib.error, OSError)
"""What reading a damaged gzip stream raises, with either library."""
if isal_zlib is not None:
    READ_ERRORS = (*READ_ERRORS, isal_zlib.error)


def have_isal() -> bool:
    """Whether python-isal could be imported."""
    return igzip is not None


def check_level(level: int) -> int:
    """``level`` if it is a gzip level this module writes (0-9), else ValueError."""
    if level not in LEVELS:
        raise ValueError(f"a gzip level is 0-9 (0-3: ISA-L, 4-9: zlib), got {level!r}")
    return level


def uses_isal(level: int) -> bool:
    """Whether ``level`` is written by ISA-L here (an ISA-L level, and python-isal installed)."""
    return check_level(level) in ISAL_LEVELS and igzip is not None


def compressor(level: int) -> str:
    """The library and level that write ``level`` here: ``isal-1.9.1:1`` or ``zlib:6`` (part of
    a partial output's resume key: the bytes depend on it)."""
    if uses_isal(level):
        import isal

        return f"isal-{isal.__version__}:{level}"
    return f"zlib:{level}"


@functools.cache
def _warn_fallback(level: int) -> None:
    log.warning(
        "python-isal is not installed: gzip level %d is written by zlib (slower, other bytes; "
        "pip install isal)",
        level,
    )


def compress_member(data: bytes, level: int) -> bytes:
    """One complete gzip member holding ``data``, fixed header (no name, mtime 0)."""
    if uses_isal(level):
        return igzip.compress(data, compresslevel=level, mtime=0)
    if level in ISAL_LEVELS:
        _warn_fallback(level)
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=level, mtime=0) as gz:
        gz.write(data)
    return buffer.getvalue()


def gzip_writer(raw: BinaryIO, level: int = ZLIB_LEVEL):
    """A gzip stream into ``raw`` with a fixed header, so that equal content gives equal bytes
    (one member, written as it comes)."""
    if uses_isal(level):
        return igzip.IGzipFile(filename="", mode="wb", fileobj=raw, compresslevel=level, mtime=0)
    if level in ISAL_LEVELS:
        _warn_fallback(level)
    return gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=level, mtime=0)


def gzip_reader(raw: BinaryIO):
    """The decompressed bytes of the gzip stream (any number of members) read from ``raw``."""
    if igzip is not None:
        return igzip.IGzipFile(fileobj=raw, mode="rb")
    return gzip.GzipFile(fileobj=raw, mode="rb")
