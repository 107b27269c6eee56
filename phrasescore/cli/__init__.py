"""The ``phrasescore`` command line: parses options and calls one library function per command.

One module per product folder of :mod:`phrasescore.jobs` (``training``, ``analysis``,
``rescore``, ``nbest``, ``tuning``, ``recipe``; ``scripts`` for the bin/ scripts' check) adds its commands to
the group of :mod:`~phrasescore.cli.group`, which ends every command the same way on a user's
error or a signal; :mod:`~phrasescore.cli.options` holds the option types and the options that
several commands share.
"""

from __future__ import annotations

# importing a command module adds its commands to the group
from phrasescore.cli import (  # noqa: F401
    analysis,
    ems,
    nbest,
    recipe,
    rescore,
    scripts,
    training,
    tuning,
)
from phrasescore.cli.group import cli, main

__all__ = ["cli", "main"]
