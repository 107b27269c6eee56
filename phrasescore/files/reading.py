"""Reading inputs the way Moses pipelines give them.

Inputs are plain text or gzip, told apart by the file's magic bytes (``1f 8b``), not by its name;
``-`` is standard input; bzip2, xz and zstd data are refused in one line. Lines are decoded as
strict UTF-8 and every decoding or decompression problem becomes an
:class:`~phrasescore.errors.InputError` naming the file and 1-based line."""

from __future__ import annotations

import io
import os
import re
import sys
import zlib
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from phrasescore.compression import READ_ERRORS, gzip_reader
from phrasescore.errors import InputError
from phrasescore.files.kinds import IO_BUFFER, display_name, is_pipe

GZIP_MAGIC = b"\x1f\x8b"
MAX_LINE_BYTES = 64 << 20
"""The longest line read (64 MiB): a phrase-table, n-best or corpus line is far shorter, and a
file without newlines (``/dev/zero``, a binary file) would otherwise be read into memory whole
as one line until the memory runs out."""
_LF = 10  # "\n"


OTHER_COMPRESSIONS = (
    (re.compile(rb"BZh[1-9]1AY&SY"), "bzip2", "bunzip2"),
    (re.compile(re.escape(b"\xfd7zXZ\x00")), "xz", "unxz"),
    (re.compile(re.escape(b"\x28\xb5\x2f\xfd")), "zstd", "unzstd"),
)
"""Magic bytes of compressions phrasescore does not read, the name and the tool to undo it."""


def _refuse_other_compressions(head: bytes, path: str) -> None:
    """One line for bzip2, xz or zstd data (whatever the file's name says), which would
    otherwise be read as text and reported as invalid UTF-8."""
    for magic, name, tool in OTHER_COMPRESSIONS:
        if magic.match(head):
            raise InputError(
                f"is {name} data, not gzip or plain text: decompress it first ({tool}), or "
                "recompress it with gzip",
                display_name(path),
            )


def open_binary_input(path: str) -> BinaryIO:
    """Open ``path`` (or ``-``) for reading bytes, decompressing gzip when the magic says so;
    bzip2, xz and zstd data are refused (:func:`_refuse_other_compressions`)."""
    if path == "-":
        raw: BinaryIO = sys.stdin.buffer
        peekable = raw if hasattr(raw, "peek") else io.BufferedReader(raw)  # type: ignore[arg-type]
        _refuse_other_compressions(peekable.peek(10)[:10], path)  # type: ignore[attr-defined]
        magic = peekable.peek(2)[:2]  # type: ignore[attr-defined]
        if magic == GZIP_MAGIC:
            return gzip_reader(peekable)  # type: ignore[return-value]
        return peekable  # type: ignore[return-value]
    try:
        handle = open(path, "rb", buffering=IO_BUFFER)
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a file", path) from None
    except PermissionError:
        raise InputError("permission denied", path) from None
    try:
        _refuse_other_compressions(handle.peek(10)[:10], path)
    except InputError:
        handle.close()
        raise
    if handle.peek(2)[:2] == GZIP_MAGIC:
        return gzip_reader(handle)  # type: ignore[return-value]
    return handle


class ReadPosition:
    """How far reading a file has got, in bytes *of the file* (compressed bytes for gzip), for
    progress bars with an ETA. ``size`` is None for standard input."""

    def __init__(self) -> None:
        self.size: int | None = None
        self._raw: BinaryIO | None = None
        self._last = 0

    def _attach(self, handle: BinaryIO, size: int | None) -> None:
        # the file under a gzip stream: GzipFile.close() forgets its ``fileobj``, so keep it here
        self._raw = getattr(handle, "fileobj", None) or handle
        self.size = size

    def bytes_read(self) -> int:
        """Bytes of the file consumed so far (the last value seen once the file is closed)."""
        raw = self._raw
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
        position._attach(handle, None if is_pipe(path) else os.path.getsize(path))
    lineno = 0
    try:
        while True:
            try:
                line = handle.readline(MAX_LINE_BYTES + 1)
            except READ_ERRORS as exc:
                raise gzip_damage(exc, path, lineno + 1) from None
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                raise _line_too_long(name, lineno + 1)
            lineno += 1
            yield line
    finally:
        if position is not None:
            position.bytes_read()  # the final position, kept after the file is closed
        if path != "-":
            handle.close()


class LineBlocks:
    """The lines of ``path`` (plain or gzip, ``-`` is stdin) taken ``count`` at a time as one
    bytes object, line endings included: what :func:`iter_raw_lines` yields, joined, without a
    Python step per line. The file is read in blocks of up to 1 MiB (decompressed; what a pipe
    has, without waiting for more) and cut at the
    ``count``-th newline (numpy finds it), so the reading process spends its time in
    decompression, not in ``readline`` (what reads ``rescore``'s chunks).

    A truncated or corrupt gzip stream raises :class:`InputError` naming the line at which
    reading failed (the first line not read whole), as :func:`iter_raw_lines` does.
    """

    def __init__(self, path: str, position: ReadPosition | None = None):
        self.path = path
        self.name = display_name(path)
        self._handle = open_binary_input(path)
        if position is not None:
            position._attach(self._handle, None if is_pipe(path) else os.path.getsize(path))
        self.position = position
        self._read = getattr(self._handle, "read1", None) or self._handle.read
        self._buffer = b""
        self._buffer_newlines = np.zeros(0, dtype=np.int64)  # positions of "\n" in it
        self._newlines = 0  # newlines read from the file so far (buffer included)
        self._open_line = 0  # bytes read after the last newline
        self._end = False

    def _fill(self) -> bytes:
        """The next block of the file (b"" at its end)."""
        if self._end:
            return b""
        try:  # read1: what is there (a pipe's writer may be slow), up to a block
            block = self._read(IO_BUFFER)
        except READ_ERRORS as exc:
            raise gzip_damage(exc, self.path, self._newlines + 1) from None
        if not block:
            self.close()
            return b""
        return block

    def take(self, count: int) -> bytes:
        """The next ``count`` lines (fewer at the end of the file, b"" after it)."""
        parts = []
        need = count
        while need > 0:
            if self._buffer:  # the rest of a block, its newlines found already
                block, newlines = self._buffer, self._buffer_newlines
            else:
                block = self._fill()
                newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == _LF)
                self._newlines += len(newlines)
                if len(newlines):
                    self._open_line = len(block) - int(newlines[-1]) - 1
                else:
                    self._open_line += len(block)
                if self._open_line > MAX_LINE_BYTES:
                    raise _line_too_long(self.name, self._newlines + 1)
            self._buffer = b""
            if not block:
                break
            if len(newlines) < need:
                parts.append(block)
                need -= len(newlines)
                continue
            end = int(newlines[need - 1]) + 1
            parts.append(block[:end])
            self._buffer, self._buffer_newlines = block[end:], newlines[need:] - end
            need = 0
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        if not self._end:
            self._end = True
            if self.position is not None:
                self.position.bytes_read()  # the final position, kept after the file is closed
            if self.path != "-":
                self._handle.close()


def gzip_damage(exc: BaseException, path: str, lineno: int) -> InputError:
    """The one-line error of a gzip file that cannot be read to its end, the same from every
    reader: the line named is found by decompressing the file again up to the damage
    (:func:`_lines_before_damage`), since where a reader meets it depends on how far it reads
    ahead; a pipe cannot be read again, so there the reader's ``lineno`` is named. Bytes that
    are not gzip after complete gzip data (``gzip -t``'s "trailing garbage") are said so."""
    name = display_name(path)
    if is_pipe(path):
        return InputError(f"corrupt or truncated gzip stream ({exc})", name, lineno)
    whole, trailing = _lines_before_damage(path)
    if trailing:
        return InputError(
            f"bytes that are not gzip after the end of the gzip data, which holds {whole} "
            "lines (gzip -t: trailing garbage); cut them off or recompress the data",
            name,
            whole + 1,
        )
    return InputError(f"corrupt or truncated gzip stream ({exc})", name, whole + 1)


def _lines_before_damage(path: str) -> tuple[int, bool]:
    """(newlines decompressed before the damage, whether the damage is bytes that follow a
    complete gzip member and do not start another), by zlib over the file's members."""
    newlines = 0
    with open(path, "rb") as fh:
        member = zlib.decompressobj(31)
        data = fh.read(IO_BUFFER)
        while data:
            try:
                newlines += member.decompress(data).count(b"\n")
            except zlib.error:
                return newlines, False
            if not member.eof:
                data = fh.read(IO_BUFFER)
                continue
            data = member.unused_data or fh.read(IO_BUFFER)
            if len(data) == 1:
                data += fh.read(1)
            if data and not data.startswith(GZIP_MAGIC):
                return newlines, True
            member = zlib.decompressobj(31)
    return newlines, False


def _line_too_long(name: str, lineno: int) -> InputError:
    return InputError(
        f"a line longer than {MAX_LINE_BYTES >> 20} MiB: not a file of text lines (a binary "
        "file, /dev/zero?)",
        name,
        lineno,
    )


def count_lines(data: bytes) -> int:
    """Lines in ``data`` (a last line without a newline counts)."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


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


def decode_lines(data: bytes, name: str, first_lineno: int = 1) -> list[str]:
    """The lines of ``data`` (lines read by :func:`iter_raw_lines` and joined, endings kept)
    decoded as strict UTF-8; invalid UTF-8 is an :class:`InputError` naming its line (the first
    line is ``first_lineno``), as :func:`iter_lines` reports it."""
    lines = decode_text(data, name, first_lineno).split("\n")
    last = lines.pop()  # "" when the data ends with a newline
    lines = [line + "\n" for line in lines]
    if last:
        lines.append(last)
    return lines


def decode_text(data: bytes, name: str, first_lineno: int = 1) -> str:
    """``data`` (whole lines, the first of which is line ``first_lineno``) decoded as strict
    UTF-8; invalid UTF-8 is an :class:`InputError` naming its line, as :func:`iter_lines`
    reports it."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        lineno = first_lineno + data.count(b"\n", 0, exc.start)
        raise InputError(f"invalid UTF-8 at byte {exc.start - line_start}", name, lineno) from None
