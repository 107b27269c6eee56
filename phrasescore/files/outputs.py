"""Writing outputs so that nothing is lost.

Outputs are written to a temporary file next to the target and renamed into place only when the
whole output was written (:class:`AtomicOutput`, :func:`atomic_path`, :class:`StagedFile`); a name
ending in ``.gz`` is written as gzip with a fixed header (no name, mtime 0), so the same content
always gives the same bytes (gzip itself, ISA-L or zlib and its levels, is
:mod:`phrasescore.compression`'s). ``-`` is standard output; a named pipe or a device
(``/dev/null``, ``/dev/stdout``, ``mkfifo``) is written in place as a stream
(:func:`~phrasescore.files.kinds.is_stream_target`), and refused where the output must be a file
(:func:`atomic_path`: models, checkpoints). :func:`check_output_path` refuses an output location
that cannot be written before any work."""

from __future__ import annotations

import errno
import gzip
import io
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO

from phrasescore.compression import ZLIB_LEVEL
from phrasescore.compression import gzip_writer as _gzip_stream
from phrasescore.errors import InputError
from phrasescore.files.disk import disk_errors, write_error
from phrasescore.files.kinds import IO_BUFFER, is_stream_target

GZIP_LEVEL = ZLIB_LEVEL


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


def temporary_pattern(name: str) -> re.Pattern:
    """The names of :func:`_temporary_beside`'s files for an output named ``name``."""
    return re.compile(rf"\.{re.escape(name)}\.[a-z0-9_]{{8}}\.tmp")


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
                raw = WholeWrites(open(self.path, "ab", buffering=IO_BUFFER))
            except OSError as exc:
                raise InputError(f"cannot write ({exc.strerror})", self.path) from None
            self._stream = True
            return self._wrap(raw)
        fd = -1
        try:  # __exit__ does not run when __enter__ fails: the temporary file is removed here
            with _stop_signals_held():  # made and named together
                fd, self._tmp = _temporary_beside(self.path)
            self._raw = os.fdopen(fd, "wb", buffering=IO_BUFFER)
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
