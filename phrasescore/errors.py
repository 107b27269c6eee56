"""The error types a user sees as one line.

Library code raises :class:`InputError` for anything a user can fix (a malformed line, a missing
file, a model that does not fit the request), and :class:`RunStopped` when the machine stopped a
run (a worker killed, a full disk). ``phrasescore.cli`` turns them into one line on stderr and a
non-zero exit code; every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


def _where(path: str | None, line: int | None) -> str:
    """``path:line: `` (or ``path: ``, or nothing) before a message."""
    if path is None:
        return ""
    return f"{path}:{line}: " if line is not None else f"{path}: "


class InputError(Exception):
    """A problem with the user's input, reported as ``path:line: message``."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line

    def __str__(self) -> str:
        return f"{_where(self.path, self.line)}{self.message}"

    def located(self, path: str) -> InputError:
        """This error, naming ``path`` when it names no file yet (a parser of text that does
        not know which file the text came from gives the line alone)."""
        if self.path is not None:
            return self
        return type(self)(self.message, path, self.line)


class ModelFileError(InputError):
    """A model file that is not a phrasescore model, or does not fit the request."""


class RunStopped(Exception):
    """The machine stopped a run (a worker killed, a full disk): reported like
    :class:`InputError`, one line and exit code 1, but what was written so far is kept for
    ``--resume`` (the input was fine: running again can finish the work)."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.message = message
        self.path = path
        self.reason: str | None = None
        """The system's words for a write error (``No space left on device``), if that is it."""

    def __str__(self) -> str:
        return f"{_where(self.path, None)}{self.message}"
