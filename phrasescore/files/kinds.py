"""What a path names, as phrasescore's files see it: ``-`` (standard input or output), an input
that can be read only once (a pipe), an output written in place as a stream (a named pipe, a
device, ``/dev/stdout``), and the name used for it in messages."""

from __future__ import annotations

import os
import re
import stat

IO_BUFFER = 1 << 20
"""The block in which files are read and written (1 MiB)."""


def display_name(path: str) -> str:
    """The name used in messages: ``<stdin>``/``<stdout>`` for ``-``."""
    return "<stdin>" if path == "-" else path


def is_pipe(path: str) -> bool:
    """True for an input that can be read only once: ``-``, a named pipe, ``/dev/fd/N``."""
    return path == "-" or not stat.S_ISREG(os.stat(path).st_mode)


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
