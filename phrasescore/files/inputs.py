"""Inputs checked before any work: missing, a directory, not permitted; what identifies an
input's content (:func:`content_digest`, what ``--resume`` compares)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files.kinds import IO_BUFFER, is_pipe


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
                block = fh.read(min(length, IO_BUFFER))
                if not block:
                    break
                digest.update(block)
                length -= len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}
