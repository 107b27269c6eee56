"""The progress bar of every command: tqdm on stderr, fit for a terminal and for a log file.

On a terminal the bar is redrawn in place as usual. When stderr is not a terminal (a batch
job's log, ``2> run.log``), each redraw would be one more record in the log, thousands per
run; there the bar is drawn at most every :data:`LOG_INTERVAL` seconds, one line each (no
carriage returns), and once more, complete, when it closes. ``--no-progress`` draws nothing.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

LOG_INTERVAL = 30.0
"""Seconds between two progress lines when stderr is not a terminal."""


class _LogLines:
    """A stream for tqdm that writes each redraw as one line (a log has no carriage return)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(enabled: bool = True, **options: Any) -> tqdm:
    """A tqdm bar on stderr (``options`` as tqdm's: total, unit, desc, ...); disabled unless
    ``enabled``."""
    stream = sys.stderr
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if terminal:
        return tqdm(disable=not enabled, file=stream, dynamic_ncols=True, **options)
    return tqdm(
        disable=not enabled,
        file=_LogLines(stream),
        mininterval=LOG_INTERVAL,
        maxinterval=LOG_INTERVAL,
        ncols=100,
        **options,
    )


def log_startup(log: logging.Logger, what: str) -> float:
    """Log and return the seconds from the process's first import of phrasescore to now, when a
    command starts its work (``what``: what the start-up did, e.g. "models loaded"): the
    imports, the device's set-up and the loading, apart from the work's own rate."""
    import phrasescore  # noqa: PLC0415 - the package's own start time

    seconds = time.monotonic() - phrasescore.STARTED
    log.info("start-up %.1f s (imports, device set-up, %s)", seconds, what)
    return seconds
