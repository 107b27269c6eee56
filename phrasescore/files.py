"""Reading and writing files the way Moses pipelines use them.

* Inputs are plain text or gzip, told apart by the file's magic bytes (``1f 8b``), not by its name;
  ``-`` is standard input. Lines are decoded as strict UTF-8 and every decoding or decompression
  problem becomes an :class:`~phrasescore.errors.InputError` naming the file and 1-based line.
* Outputs are written to a temporary file next to the target and renamed into place only when the
  whole output was written (:class:`AtomicOutput`); a name ending in ``.gz`` is written as gzip with
  a fixed header (no name, mtime 0), so the same content always gives the same bytes. ``-`` is
  standard output (gzip itself, ISA-L or zlib and its levels, is
  :mod:`phrasescore.compression`'s); a named pipe or a device (``/dev/null``, ``/dev/stdout``, ``mkfifo``) is written
  in place as a stream (:func:`is_stream_target`), and refused where the output must be a file
  (:func:`atomic_path`: models, checkpoints).
* An output never overwrites an input: :func:`refuse_outputs_onto_inputs` compares them by
  identity (device and inode, links resolved) before any work.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import hashlib
import io
import logging
import os
import re
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

import numpy as np

from phrasescore.compression import READ_ERRORS, ZLIB_LEVEL, gzip_reader
from phrasescore.compression import gzip_writer as _gzip_stream
from phrasescore.errors import InputError, RunStopped

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"
GZIP_LEVEL = ZLIB_LEVEL
_READ_BUFFER = 1 << 20
_LF = 10  # "\n"


def display_name(path: str) -> str:
    """The name used in messages: ``<stdin>``/``<stdout>`` for ``-``."""
    return "<stdin>" if path == "-" else path


DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})
"""Write errors that are the machine's, not a bug: a full disk or quota, a file too large, an
I/O error, a file system remounted read-only."""


def write_error(exc: BaseException, path: str) -> RunStopped | None:
    """The one-line :class:`RunStopped` for a disk's write error (:data:`DISK_ERRORS`) while
    writing ``path`` (``-``: standard output); None for any other exception."""
    if not (isinstance(exc, OSError) and exc.errno in DISK_ERRORS):
        return None
    reason = exc.strerror or os.strerror(exc.errno)
    stopped = RunStopped(f"cannot write: {reason}", "<stdout>" if path == "-" else path)
    stopped.reason = reason
    return stopped


@contextmanager
def disk_errors(path: str) -> Iterator[None]:
    """Turn a disk's write error in the block into :func:`write_error`'s one line."""
    try:
        yield
    except OSError as exc:
        stopped = write_error(exc, path)
        if stopped is None:
            raise
        raise stopped from None


class WholeWrites(io.BufferedIOBase):
    """A binary stream (standard output, a named pipe) whose ``write`` writes all it is given or
    raises: :class:`io.BufferedWriter` returns a short count, *without an error*, when a pipe's
    reader goes away in the middle of a write larger than its buffer (the kernel's partial
    write), so ``rescore -o - | head -1`` would exit 0 saying it had written the table. Writing the rest meets the closed pipe: :class:`BrokenPipeError`, exit 141 as
    copy-table and nbest. ``close`` closes the stream under it only when ``owned``."""

    def __init__(self, stream: BinaryIO, owned: bool = True):
        super().__init__()
        self._stream = stream
        self._owned = owned
        self._closing = False

    def write(self, data) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            written = self._stream.write(view)
            if not written:  # nothing taken, no error: the reader is gone
                raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
            view = view[written:]
        return total

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        if not (self._closing or self._stream.closed):
            self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self) -> None:
        """Close this wrapper (also when it is collected): the stream under it is closed, which
        flushes it, only when owned; standard output is left as it is."""
        if self.closed:
            return
        self._closing = True
        super().close()
        if self._owned:
            self._stream.close()


def check_files_exist(paths: Iterable[str | None]) -> None:
    """Refuse an input that cannot be read, with one :class:`InputError` line: missing, a
    directory, not permitted.

    ``-`` (standard input), None, regular files, named pipes and ``/dev/fd/N`` (bash's
    ``<(zcat f.gz)``) pass; whether a pipe can serve the command is for the caller
    (:func:`is_pipe`).
    """
    for path in paths:
        if not path or path == "-":
            continue
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise InputError("no such file", path) from None
        except PermissionError:
            raise InputError("permission denied", path) from None
        if stat.S_ISDIR(mode):
            raise InputError("is a directory, not a file", path)


def check_input_file(path: Path, what: str) -> Path:
    """``path`` resolved, or an :class:`InputError` naming ``what`` (``ab``'s inputs: moses.ini
    files, dev and test sets, re-ranking models) when it is missing or a directory."""
    if not path.exists():
        raise InputError(f"{what}: no such file", path=str(path))
    if path.is_dir():
        raise InputError(f"{what}: is a directory", path=str(path))
    return path.resolve()


def is_pipe(path: str) -> bool:
    """True for an input that can be read only once: ``-``, a named pipe, ``/dev/fd/N``."""
    return path == "-" or not stat.S_ISREG(os.stat(path).st_mode)


DIGEST_WHOLE = 64 << 20
"""Files up to this size are digested whole; larger ones by their first and last half of it."""


def content_digest(path: str) -> dict[str, object]:
    """What identifies a file's content, whatever its name: ``{"bytes": size, "sha256": hex}``
    of the whole file up to :data:`DIGEST_WHOLE` bytes, else of its first and last
    ``DIGEST_WHOLE / 2`` bytes (with the size, a copy is the same data and an edit or another
    file is not); ``{"pipe": True}`` for an input that can be read only once (:func:`is_pipe`)."""
    if is_pipe(path):
        return {"pipe": True}
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= DIGEST_WHOLE:
            spans = [(0, size)]
        else:
            half = DIGEST_WHOLE // 2
            spans = [(0, half), (size - half, half)]
        for start, length in spans:
            fh.seek(start)
            while length > 0:
                block = fh.read(min(length, _READ_BUFFER))
                if not block:
                    break
                digest.update(block)
                length -= len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


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
        handle = open(path, "rb", buffering=_READ_BUFFER)
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
                line = handle.readline()
            except READ_ERRORS as exc:
                raise InputError(
                    f"corrupt or truncated gzip stream ({exc})", name, lineno + 1
                ) from None
            if not line:
                return
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
        self._end = False

    def _fill(self) -> bytes:
        """The next block of the file (b"" at its end)."""
        if self._end:
            return b""
        try:  # read1: what is there (a pipe's writer may be slow), up to a block
            block = self._read(_READ_BUFFER)
        except READ_ERRORS as exc:
            raise InputError(
                f"corrupt or truncated gzip stream ({exc})", self.name, self._newlines + 1
            ) from None
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


def default_file_mode() -> int:
    """0666 less the umask: the mode open() would give a new file."""
    return 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def gzip_writer(raw: BinaryIO, level: int = GZIP_LEVEL):
    """A gzip stream with a fixed header, so that equal content gives equal bytes
    (:func:`phrasescore.compression.gzip_writer`)."""
    return _gzip_stream(raw, level)


def check_output_path(
    path: str | None, what: str = "output", create_dirs: bool = False, stream: bool = True
) -> None:
    """Refuse an output location that cannot be written, with one :class:`InputError` line.

    Every job calls this for each file it will write before it does any work, so that a typo in
    ``-o`` costs nothing: a name that is an existing directory, a directory that does not exist
    (unless the job creates it: ``create_dirs``, then its nearest existing ancestor counts), or
    one this user cannot write in. None and ``-`` (standard output) pass. A named pipe or device
    (:func:`is_stream_target`) passes when it can be written and the output may be a stream;
    an output that must be a file (``stream=False``: a model) refuses it.
    """
    if not path or path == "-":
        return
    if is_stream_target(path):
        if not stream:
            raise InputError(
                f"is a named pipe or a device, not a file: the {what} must be a regular file",
                path,
            )
        if not os.access(path, os.W_OK):
            raise InputError(f"{what} is not writable (permission denied)", path)
        return
    if os.path.isdir(path):
        raise InputError(f"is a directory: give a file name for the {what}", path)
    directory = os.path.dirname(os.path.abspath(path))
    if create_dirs:
        while not os.path.exists(directory):
            directory = os.path.dirname(directory)
    if not os.path.isdir(directory):
        raise InputError(f"{what} directory does not exist", path)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"{what} directory is not writable (permission denied)", path)


def check_output_dir(path: str | None, what: str = "output") -> None:
    """Refuse a directory to write files in (created if missing) that cannot be: an existing
    file, or under a directory this user cannot write in."""
    if not path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"is not a directory: give a directory for the {what}", path)
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise InputError(f"{what} directory is not writable (permission denied)", path)
        return
    check_output_path(path, what, create_dirs=True)


def check_output_paths(paths: dict[str, str | None]) -> None:
    """:func:`check_output_path` for each ``{what: path}``, and no two outputs on one name."""
    seen: dict[str, str] = {}
    for what, path in paths.items():
        check_output_path(path, what)
        if path and path != "-":
            key = os.path.abspath(path)
            if key in seen:
                raise InputError(f"the {what} and the {seen[key]} would be the same file", path)
            seen[key] = what


_KERNEL_FD_DIRECTORY = re.compile(r"/proc/\d+(/task/\d+)?/fd")


def is_stream_target(path: str) -> bool:
    """True for an output written in place as a stream, not through a temporary file renamed
    onto it (which would replace the node with a regular file and leave a pipe's reader
    waiting forever): an existing named pipe, device or socket (``mkfifo``, ``/dev/null``), or
    a name of the kernel's for an open file (``/dev/stdout``, ``/dev/fd/N``,
    ``/proc/self/fd/N``) whatever it points at. ``-`` is the callers' (standard output)."""
    if not path or path == "-":
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        return False
    if not stat.S_ISREG(mode):
        return True
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    return parent == "/dev" or _KERNEL_FD_DIRECTORY.fullmatch(parent) is not None


PathsByRole = Mapping[str, "str | Iterable[str | None] | None"]
"""``{role: path}`` or ``{role: [paths]}`` (``-m`` given twice); None, ``""`` and ``-`` are
skipped."""


def _paths_by_role(named: PathsByRole) -> Iterator[tuple[str, str]]:
    for role, paths in named.items():
        for path in [paths] if isinstance(paths, str) or paths is None else paths:
            if path and path != "-":
                yield role, path


def refuse_outputs_onto_inputs(inputs: PathsByRole, outputs: PathsByRole) -> None:
    """Refuse, in one :class:`InputError` line naming both, an output that is one of the
    inputs: ``-o en-fr.txt is the input corpus (train.en): refusing to overwrite an input``.

    Every command calls this once with all the files it reads and all it writes (the files it
    writes, renames or deletes beside an output too: a training's best model, checkpoint and
    log, rescore's partial output; the lock of ``-o``, :func:`with_locks`) before any work. Files are compared by identity, not by name: device and inode after
    following links (a symlink to the input, a hard link of it, the input reached through a
    symlinked directory), and resolved paths too. Only regular inputs count: a pipe or a
    terminal (``/dev/stdin``) is read as a stream and cannot be written over; ``-`` is standard
    input or output; an input that does not exist is :func:`check_files_exist`'s to report.
    ``inputs`` and ``outputs`` map what a file is (``input corpus``, ``-o``) to its path or paths.
    (Without this check ``train -o`` onto its corpus, ``copy-table t -o t``, ``rescore --ini-out``
    onto ``--moses-ini`` and the like would destroy their input and exit 0.)
    """
    known = []
    outputs = with_locks(outputs)
    for role, path in _paths_by_role(inputs):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            known.append((role, path, (st.st_dev, st.st_ino), os.path.realpath(path)))
    for option, output in _paths_by_role(outputs):
        resolved = os.path.realpath(output)
        try:
            st = os.stat(output)
            identity = (st.st_dev, st.st_ino)
        except OSError:
            identity = None
        for role, path, input_identity, input_resolved in known:
            if identity == input_identity or resolved == input_resolved:
                raise InputError(
                    f"{option} {output} is the {role} ({path}): refusing to overwrite an input"
                )
            if _is_temporary_of(input_resolved, resolved):
                raise InputError(
                    f"the {role} {path} is named as a temporary file of {option} {output}, "
                    "which a run removes as left by a killed run: rename it"
                )


def _is_temporary_of(path: str, output: str) -> bool:
    """Whether ``path`` (resolved) has the name of a temporary file beside ``output``
    (``.NAME.XXXXXXXX.tmp``, :func:`remove_stale_temporaries` removes them)."""
    directory, name = os.path.split(output)
    head, base = os.path.split(path)
    return head == directory and _temporary_pattern(name).fullmatch(base) is not None


def _temporary_pattern(name: str) -> re.Pattern:
    """The names of :func:`_temporary_beside`'s files for an output named ``name``."""
    return re.compile(rf"\.{re.escape(name)}\.[a-z0-9_]{{8}}\.tmp")


def check_work_folder(folder: str | None, inputs: PathsByRole, option: str = "--workdir") -> None:
    """Refuse, in one :class:`InputError` line before any work, a work folder that cannot hold
    the files a command and the programs it runs make there under their own names
    (``features.dat``, ``scores.dat``, ``weights.txt``, logs, outputs): an existing file that is
    not a folder (:func:`check_output_dir`), and a folder that holds one of the ``inputs`` (as
    :func:`refuse_outputs_onto_inputs`: by path, through links, or a hard link of it among the
    folder's files). A work folder holds only files the command made: otherwise
    ``rerank-tune --workdir wd --reference wd/scores.dat`` would have the reference replaced by
    the extractor's statistics. A new folder, or one of an earlier run, passes."""
    if not folder:
        return
    check_output_dir(folder, option)
    if not os.path.isdir(folder):
        return
    root = os.path.realpath(folder)
    identities: dict[tuple[int, int], tuple[str, str]] = {}
    for role, path in _paths_by_role(inputs):
        try:
            st = os.stat(path)
        except OSError:
            continue
        resolved = os.path.realpath(path)
        if resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep):
            _refuse_work_folder(option, folder, role, path)
        if stat.S_ISREG(st.st_mode):
            identities[(st.st_dev, st.st_ino)] = (role, path)
    for directory, _, names in os.walk(root):  # a hard link of an input among its files
        for name in names:
            with suppress(OSError):
                st = os.lstat(os.path.join(directory, name))
                if (st.st_dev, st.st_ino) in identities:
                    _refuse_work_folder(option, folder, *identities[(st.st_dev, st.st_ino)])


def _refuse_work_folder(option: str, folder: str, role: str, path: str) -> None:
    raise InputError(
        f"{option} {folder} holds the {role} ({path}): the tools write their files there under "
        "their own names and would overwrite it; give a folder of its own"
    )


def disk_full_error(folder: str | os.PathLike) -> RunStopped | None:
    """:func:`write_error`'s one line (``cannot write: No space left on device``) for
    ``folder`` when its file system has no block left for this user, else None: asked after a
    program that does not check its own writes (Moses' ``extractor`` exits 0 with its files cut
    short), whose files then cannot be trusted ."""
    try:
        blocks = os.statvfs(folder).f_bavail
    except OSError:
        return None
    if blocks > 0:
        return None
    return write_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), str(folder))


LOCKED_OUTPUT = "-o"
"""The role of the output a command locks (:func:`output_lock`): its ``.NAME.lock`` is made and
removed beside it, so :func:`refuse_outputs_onto_inputs` checks that file too."""


def with_locks(outputs: PathsByRole) -> dict[str, object]:
    """``outputs`` and the lock file (:func:`lock_path`) of the :data:`LOCKED_OUTPUT` among them
    (a file, not ``-`` or a stream), as ``-o's lock``: a command creates and deletes it, so an
    input of that name would be lost."""
    extended: dict[str, object] = dict(outputs)
    for role, path in _paths_by_role({LOCKED_OUTPUT: outputs.get(LOCKED_OUTPUT)}):
        if not is_stream_target(path):
            extended.setdefault(f"{role}'s lock", lock_path(path))
    return extended


def _temporary_beside(path: str) -> tuple[int, str]:
    """(fd, name) of a new hidden temporary file in ``path``'s directory, with the mode open()
    would give a new file (mkstemp makes 0600)."""
    check_output_path(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory
        )
    except OSError as exc:
        raise InputError(f"cannot write here ({exc.strerror})", path) from None
    os.chmod(tmp, default_file_mode())
    return fd, tmp


@contextmanager
def _stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back while the block runs, their handlers run after it.

    Around the creation of a temporary file and the recording of its name: Ctrl-C or SIGTERM
    (which every command takes as Ctrl-C) can then never come between the two and leave a file
    nobody knows to remove (a loaded machine made that window wide enough to hit). The Python
    handlers are swapped for ones that only note the signal (a signal mask would not do: the
    kernel gives a process's signal to any thread that does not block it, PyTorch's included,
    and Python runs the handler in the main thread all the same). Only the main thread can set
    handlers; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    held = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if callable(handler):  # a Python handler: what raises in the middle of the work
            held[signum] = signal.signal(signum, lambda number, frame: came.append(number))
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)  # now, to the handler put back


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary file name beside ``path`` for a writer that wants a name (safetensors,
    ``torch.save``); it is renamed to ``path`` when the block completes and removed otherwise.

    The one atomic-write rule of the package, as :class:`AtomicOutput` for streams. Such an
    output must be a file: a named pipe or a device (:func:`is_stream_target`) is refused.
    """
    if is_stream_target(path):
        raise InputError("is a named pipe or a device, not a file: give a file name", path)
    tmp = None
    try:
        with _stop_signals_held():
            fd, tmp = _temporary_beside(path)
            os.close(fd)
        yield tmp
        # the writer may have made its own file (safetensors writes 0600): follow the umask
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


class AtomicOutput:
    """Write a file so that it appears under its final name complete or not at all.

    ``with AtomicOutput(path) as out: out.write(...)`` writes text (or bytes with
    ``binary=True``) to a hidden temporary file in the target's directory; on success the file is
    flushed, synced and renamed to ``path``; on any exception the temporary file is removed and an
    existing ``path`` is left untouched; a disk's write error (full, quota, I/O) becomes
    :func:`write_error`'s one line. ``-`` writes to standard output (no atomicity possible).
    A ``.gz`` name is written gzip-compressed (``gzip_level``: :mod:`phrasescore.compression`'s
    levels, gzip's 6 by default). ``before_rename(tmp)``, if given, runs once the
    complete file ``tmp`` is synced, before it takes its name (what it raises discards it).

    A named pipe or a device (:func:`is_stream_target`: ``/dev/null``, ``/dev/stdout``, a
    ``mkfifo``) is written in place as a stream, as ``-`` is: renaming a file onto it would
    replace it with a regular file, and its reader would wait forever. Such a target cannot
    take ``before_rename`` (an output with a file beside it: a shard's manifest).
    """

    def __init__(
        self,
        path: str,
        binary: bool = False,
        compress: bool | None = None,
        before_rename: Callable[[str], None] | None = None,
        gzip_level: int = GZIP_LEVEL,
    ):
        self.path = path
        self.binary = binary
        self.gzip_level = gzip_level
        self.compress = path.endswith(".gz") if compress is None else compress
        self.before_rename = before_rename
        self._tmp: str | None = None
        self._raw: BinaryIO | None = None
        self._gz: gzip.GzipFile | None = None  # or ISA-L's IGzipFile
        self._text: io.TextIOWrapper | None = None
        self._stream = False
        """A named pipe or device written in place (closed at the end, never renamed)."""

    def __enter__(self):
        if self.path == "-":
            return self._wrap(WholeWrites(sys.stdout.buffer, owned=False))
        if is_stream_target(self.path):
            if self.before_rename is not None:
                raise InputError(
                    "is a named pipe or a device: this output needs a file (a file goes beside it)",
                    self.path,
                )
            try:  # appending: /dev/stdout of a shell's >> keeps what the file held
                raw = WholeWrites(open(self.path, "ab", buffering=_READ_BUFFER))
            except OSError as exc:
                raise InputError(f"cannot write ({exc.strerror})", self.path) from None
            self._stream = True
            return self._wrap(raw)
        fd = -1
        try:  # __exit__ does not run when __enter__ fails: the temporary file is removed here
            with _stop_signals_held():  # made and named together
                fd, self._tmp = _temporary_beside(self.path)
            self._raw = os.fdopen(fd, "wb", buffering=_READ_BUFFER)
            return self._wrap(self._raw)
        except BaseException:
            if self._raw is None and fd >= 0:
                os.close(fd)
            self._discard()
            raise

    def _wrap(self, raw: BinaryIO):
        self._raw = raw
        stream: BinaryIO = raw
        if self.compress:
            self._gz = gzip_writer(raw, self.gzip_level)
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
                elif self._stream:
                    self._raw.close()
        except BaseException as error:
            if self._stream and not self._raw.closed:
                with suppress(OSError):  # the reader has gone, or the device is full
                    self._raw.close()
            self._discard()
            stopped = write_error(error, self.path)
            if stopped is not None:
                raise stopped from None
            raise
        if exc_type is not None:
            self._discard()
            stopped = write_error(exc, self.path)
            if stopped is not None:
                raise stopped from None
            return False
        if self._tmp is not None:
            try:  # an interrupt up to the rename leaves nothing behind
                if self.before_rename is not None:
                    self.before_rename(self._tmp)
                os.replace(self._tmp, self.path)
            except BaseException:
                self._discard()
                raise
            self._tmp = None
        return False

    def _discard(self) -> None:
        if self._tmp is not None:
            try:
                if self._raw is not None and not self._raw.closed:
                    with suppress(OSError):  # the buffered rest cannot be written (disk full)
                        self._raw.close()
            finally:
                if os.path.exists(self._tmp):
                    os.unlink(self._tmp)
                self._tmp = None


class StagedFile:
    """A file written complete under a temporary name beside ``path`` now, and renamed to ``path``
    by :meth:`publish` later: for outputs that form one result with another (a rescored table
    and its moses.ini) and must appear together, each only once all are written.

    A named pipe or a device (:func:`is_stream_target`) is written in place by :meth:`publish`,
    as :class:`AtomicOutput` writes it: a file renamed onto it would replace it
    (``rescore --ini-out FIFO``)."""

    def __init__(self, path: str, text: str):
        self.path = path
        self._tmp = ""
        self._stream_text: str | None = None
        if is_stream_target(path):
            self._stream_text = text
            return
        try:
            with _stop_signals_held():  # made and named together
                fd, self._tmp = _temporary_beside(path)
            with disk_errors(path), os.fdopen(fd, "wb") as out:
                out.write(text.encode("utf-8"))
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            self.discard()
            raise

    def publish(self) -> None:
        if self._stream_text is not None:
            with AtomicOutput(self.path, compress=False) as out:
                out.write(self._stream_text)
            return
        os.replace(self._tmp, self.path)

    def discard(self) -> None:
        if self._tmp and os.path.exists(self._tmp):
            os.unlink(self._tmp)


# ---------------------------------------------------------------------------- one writer per output
def lock_path(output: str) -> str:
    """The lock file of ``output`` (``.NAME.lock`` beside it)."""
    directory, name = os.path.split(os.path.abspath(output))
    return os.path.join(directory, f".{name}.lock")


_NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL})
"""flock errors of a file system without locks (Lustre mounted without ``flock``, some NFS)."""


@contextmanager
def output_lock(output: str) -> Iterator[None]:
    """Be the only run writing ``output`` while the block runs, or refuse in one line.

    An exclusive ``flock`` on ``.NAME.lock`` beside the output: a second run of the same
    command (a Slurm array task launched twice) is refused with an :class:`InputError` instead of
    resuming from the first one's live partial output. The kernel releases the lock when the
    process ends, however it ends (``kill -9`` included): a lock file left by a dead run holds
    nothing. The file stays empty and is removed when the block ends, while still locked; a run
    that locked a file just removed so tries again on the new one. On a file system without
    locks the run goes on unlocked, with a warning. ``-`` (standard output) and a named pipe or
    device written as a stream (:func:`is_stream_target`: no file to replace) need no lock.
    """
    if output == "-" or is_stream_target(output):
        yield
        return
    path = lock_path(output)
    fd = _take_lock(path, output)
    try:
        yield
    finally:
        if fd is not None:
            with suppress(OSError):
                os.unlink(path)
            os.close(fd)


def _take_lock(path: str, output: str) -> int | None:
    """The locked descriptor of ``path`` (None on a file system without locks)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise InputError(
                f"cannot create the output's lock file ({exc.strerror})", path
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _lock_holder(os.fstat(fd))
            os.close(fd)
            if exc.errno in _NO_LOCKS:
                log.warning(
                    "%s: the file system takes no locks (%s): a second run on this output at "
                    "the same time would not be refused",
                    display_name(output),
                    exc.strerror,
                )
                return None
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise InputError(
                f"another run is writing this output ({holder}holds its lock "
                f"{os.path.basename(path)}): wait for it to end, or stop it",
                output,
            ) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the run that held it has removed it since: lock the new one


def _lock_holder(st: os.stat_result) -> str:
    """``process N `` that holds the flock of the file ``st`` (Linux's ``/proc/locks``; the
    lock file stays empty, not to take a block of a full disk), or nothing."""
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with suppress(OSError, ValueError, IndexError):
        with open("/proc/locks", encoding="ascii") as fh:
            for line in fh:
                fields = line.split()
                if fields[1] == "FLOCK" and fields[5] == device:
                    return f"process {int(fields[4])} "
    return ""


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the temporary files an earlier, killed run left beside ``path`` (the
    ``.NAME.XXXXXXXX.tmp`` of :func:`atomic_path`, :class:`AtomicOutput` and
    :class:`StagedFile`, and nothing else); the names removed. Call it only while holding
    :func:`output_lock`: then no live run is writing them."""
    directory, name = os.path.split(os.path.abspath(path))
    pattern = _temporary_pattern(name)
    removed = []
    with suppress(OSError):
        for entry in os.scandir(directory):
            if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(entry.name)
    if removed:
        log.info(
            "removed %d temporary file(s) of an earlier run that was killed: %s",
            len(removed),
            ", ".join(sorted(removed)),
        )
    return removed
