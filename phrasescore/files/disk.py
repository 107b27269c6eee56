"""A disk's write errors (full, quota, a file too large, I/O, read-only) as one line
(:class:`~phrasescore.errors.RunStopped`), not a traceback."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager

from phrasescore.errors import RunStopped

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
