"""Reading and writing files the way Moses pipelines use them.

* Inputs are plain text or gzip, told apart by the file's magic bytes (``1f 8b``), not by its name;
  ``-`` is standard input. Lines are decoded as strict UTF-8 and every decoding or decompression
  problem becomes an :class:`~phrasescore.errors.InputError` naming the file and 1-based line.
* Outputs are written to a temporary file next to the target and renamed into place only when the
  whole output was written (:class:`AtomicOutput`); a name ending in ``.gz`` is written as gzip with
  a fixed header (no name, mtime 0), so the same content always gives the same bytes. ``-`` is
  standard output.
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from phrasescore.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
GZIP_LEVEL = 6
_READ_BUFFER = 1 << 20


def display_name(path: str) -> str:
    """The name used in messages: ``<stdin>``/``<stdout>`` for ``-``."""
    return "<stdin>" if path == "-" else path


def open_binary_input(path: str) -> BinaryIO:
    """Open ``path`` (or ``-``) for reading bytes, decompressing gzip when the magic says so."""
    if path == "-":
        raw: BinaryIO = sys.stdin.buffer
        peekable = raw if hasattr(raw, "peek") else io.BufferedReader(raw)  # type: ignore[arg-type]
        magic = peekable.peek(2)[:2]  # type: ignore[attr-defined]
        if magic == GZIP_MAGIC:
            return gzip.GzipFile(fileobj=peekable, mode="rb")  # type: ignore[return-value]
        return peekable  # type: ignore[return-value]
    try:
        handle = open(path, "rb", buffering=_READ_BUFFER)
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a file", path) from None
    except PermissionError:
        raise InputError("permission denied", path) from None
    if handle.peek(2)[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    return handle


class ReadPosition:
    """How far reading a file has got, in bytes *of the file* (compressed bytes for gzip), for
    progress bars with an ETA. ``size`` is None for standard input."""

    def __init__(self) -> None:
        self.size: int | None = None
        self._handle = None
        self._last = 0

    def bytes_read(self) -> int:
        raw = getattr(self._handle, "fileobj", None) or self._handle
        try:
            if raw is not None and not raw.closed:
                self._last = raw.tell()
        except (OSError, ValueError):
            pass
        return self._last


def iter_raw_lines(path: str, position: ReadPosition | None = None) -> Iterator[bytes]:
    """Yield the lines of ``path`` as bytes, line endings included.

    A truncated or corrupt gzip stream raises :class:`InputError` with the number of the line at
    which reading failed. ``position``, if given, is kept pointing at the open file.
    """
    name = display_name(path)
    handle = open_binary_input(path)
    if position is not None:
        position._handle = handle
        position.size = os.path.getsize(path) if path != "-" else None
    lineno = 0
    try:
        while True:
            try:
                line = handle.readline()
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
                raise InputError(
                    f"corrupt or truncated gzip stream ({exc})", name, lineno + 1
                ) from None
            if not line:
                return
            lineno += 1
            yield line
    finally:
        if path != "-":
            handle.close()


def iter_lines(
    path: str, keep_ends: bool = False, position: ReadPosition | None = None
) -> Iterator[str]:
    """Yield the lines of ``path`` decoded as strict UTF-8 (invalid UTF-8 is an
    :class:`InputError` with the line number).

    Without ``keep_ends`` the line ending (``\\n`` or ``\\r\\n``) is removed.
    """
    name = display_name(path)
    for lineno, raw in enumerate(iter_raw_lines(path, position), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"invalid UTF-8 at byte {exc.start}", name, lineno) from None
        if not keep_ends:
            if line.endswith("\n"):
                line = line[:-1]
                if line.endswith("\r"):
                    line = line[:-1]
        yield line


def default_file_mode() -> int:
    """0666 less the umask: the mode open() would give a new file."""
    return 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def gzip_writer(raw: BinaryIO) -> gzip.GzipFile:
    """A gzip stream with a fixed header, so that equal content gives equal bytes."""
    return gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0)


def _temporary_beside(path: str) -> tuple[int, str]:
    """(fd, name) of a new hidden temporary file in ``path``'s directory, with the mode open()
    would give a new file (mkstemp makes 0600)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    os.chmod(tmp, default_file_mode())
    return fd, tmp


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary file name beside ``path`` for a writer that wants a name (safetensors,
    ``torch.save``); it is renamed to ``path`` when the block completes and removed otherwise.

    The one atomic-write rule of the package, as :class:`AtomicOutput` for streams.
    """
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise InputError("output directory does not exist", path)
    fd, tmp = _temporary_beside(path)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class AtomicOutput:
    """Write a file so that it appears under its final name complete or not at all.

    ``with AtomicOutput(path) as out: out.write(...)`` writes text (or bytes with
    ``binary=True``) to a hidden temporary file in the target's directory; on success the file is
    flushed, synced and renamed to ``path``; on any exception the temporary file is removed and an
    existing ``path`` is left untouched. ``-`` writes to standard output (no atomicity possible).
    A ``.gz`` name is written gzip-compressed.
    """

    def __init__(self, path: str, binary: bool = False, compress: bool | None = None):
        self.path = path
        self.binary = binary
        self.compress = path.endswith(".gz") if compress is None else compress
        self._tmp: str | None = None
        self._raw: BinaryIO | None = None
        self._gz: gzip.GzipFile | None = None
        self._text: io.TextIOWrapper | None = None

    def __enter__(self):
        if self.path == "-":
            raw: BinaryIO = sys.stdout.buffer
        else:
            if not os.path.isdir(os.path.dirname(os.path.abspath(self.path))):
                raise InputError("output directory does not exist", self.path)
            fd, self._tmp = _temporary_beside(self.path)
            raw = os.fdopen(fd, "wb", buffering=_READ_BUFFER)
        self._raw = raw
        stream: BinaryIO = raw
        if self.compress:
            self._gz = gzip_writer(raw)
            stream = self._gz  # type: ignore[assignment]
        if self.binary:
            return stream
        self._text = io.TextIOWrapper(stream, encoding="utf-8", newline="", write_through=False)
        return self._text

    def __exit__(self, exc_type, exc, tb):
        try:
            if self._text is not None:
                self._text.flush()
                self._text.detach()
            if self._gz is not None:
                self._gz.close()
            if self._raw is not None:
                self._raw.flush()
                if self._tmp is not None:
                    if exc_type is None:
                        os.fsync(self._raw.fileno())
                    self._raw.close()
        except BaseException:
            self._discard()
            raise
        if exc_type is not None:
            self._discard()
            return False
        if self._tmp is not None:
            os.replace(self._tmp, self.path)
            self._tmp = None
        return False

    def _discard(self) -> None:
        if self._tmp is not None:
            try:
                if self._raw is not None and not self._raw.closed:
                    self._raw.close()
            finally:
                if os.path.exists(self._tmp):
                    os.unlink(self._tmp)
                self._tmp = None
