"""``MODEL.log``: the training log written beside the model, whatever stderr shows."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def quiet_handlers(logger: logging.Logger):
    """While the block runs, ``logger`` passes INFO records, and the handlers above it (standard
    error) keep the level they had: ``train -q`` (warnings only on stderr) still writes the
    whole training log to ``MODEL.log`` (it is made at its first record)."""
    effective = logger.getEffectiveLevel()
    if effective <= logging.INFO:
        yield
        return
    raised = [(h, h.level) for h in logging.getLogger().handlers if h.level < effective]
    for handler, _ in raised:
        handler.setLevel(effective)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(level)
        for handler, old in raised:
            handler.setLevel(old)


class TrainingLogFile(logging.FileHandler):
    """``MODEL.log``. A write that fails (a full disk) ends the file's part of the log quietly:
    logging's own handler prints a traceback for each record it cannot write, and the run's
    one-line error comes from the checkpoint or model it cannot write."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self.failed = True
