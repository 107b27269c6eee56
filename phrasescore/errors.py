"""The one error type for user-facing input problems.

Library code raises :class:`InputError` for anything a user can fix (a malformed line, a missing
file, a model that does not fit the request). ``phrasescore.cli`` turns it into one line on stderr
and a non-zero exit code; every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class InputError(Exception):
    """A problem with the user's input, reported as ``path:line: message``."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = f"{self.path}:"
            if self.line is not None:
                where += f"{self.line}:"
            where += " "
        return f"{where}{self.message}"


class ModelFileError(InputError):
    """A model file that is not a phrasescore model, or does not fit the request."""
