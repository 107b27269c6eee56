"""One writer per output: a run's lock beside its output (:func:`output_lock`), and the
temporary files a killed run left there, removed by the next run that holds the lock."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from phrasescore.errors import InputError
from phrasescore.files.kinds import display_name, is_stream_target
from phrasescore.files.outputs import temporary_pattern

log = logging.getLogger(__name__)


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
    pattern = temporary_pattern(name)
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
