"""The training checkpoint file ``MODEL.checkpoint``: written atomically with a checksum, read
back only when the checksum holds.

The file is ``torch.save`` of a dict (tensors, the optimiser's state, random states and a JSON
string ``meta``), read with ``weights_only=True`` (no code runs). ``checksum`` is SHA-256 over
everything else in the dict in a fixed order (tensors by dtype, shape and bytes; mappings by
key; :func:`state_digest`): one byte flipped in a tensor, in ``meta`` or in the pickled
structure, or a truncated file, is refused in one line, never resumed into another model.
Checkpoints written before checksums load with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from typing import Any

import torch

from phrasescore.errors import InputError
from phrasescore.files.disk import disk_errors
from phrasescore.files.outputs import atomic_path
from phrasescore.model.checkpoint import is_torch_checkpoint

log = logging.getLogger(__name__)

CHECKSUM_KEY = "checksum"
REQUIRED_KEYS = ("network", "optimizer", "torch_rng", "meta")


def _feed(digest, value: Any) -> None:
    """Add ``value`` (tensors, mappings, sequences and scalars, nested) to ``digest``."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu").contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}:".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # no copy of the bytes
    elif isinstance(value, dict):
        digest.update(b"{")
        for key in sorted(value, key=repr):
            _feed(digest, key)
            _feed(digest, value[key])
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for item in value:
            _feed(digest, item)
        digest.update(b"]")
    else:  # str, int, float, bool, None
        digest.update(f"{type(value).__name__}:{value!r};".encode())


def state_digest(state: dict[str, Any]) -> str:
    """SHA-256 (hex) of a checkpoint's content, ``checksum`` left out."""
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in state.items() if k != CHECKSUM_KEY})
    return digest.hexdigest()


def write_checkpoint(path: str, state: dict[str, Any]) -> None:
    """Write ``state`` with its checksum to ``path`` atomically: under a temporary name beside
    it, renamed into place when complete, removed on any failure; a full disk is one
    :class:`~phrasescore.errors.RunStopped` line naming ``path``."""
    state = {**state, CHECKSUM_KEY: state_digest(state)}
    with disk_errors(path), atomic_path(path) as tmp, open(tmp, "wb") as fh:
        writer = _Writer(fh)
        try:
            torch.save(state, writer)
        except RuntimeError:  # torch's words for a write that failed ("unexpected pos")
            if writer.error is not None:
                raise writer.error from None
            raise
        fh.flush()
        os.fsync(fh.fileno())


class _Writer:
    """A file for ``torch.save`` that keeps the OSError of a failed write (a full disk), which
    torch's zip writer turns into a RuntimeError of its own."""

    def __init__(self, fh):
        self.fh = fh
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def read_checkpoint(path: str) -> dict[str, Any]:
    """The checkpoint at ``path``, its ``meta`` parsed; one :class:`InputError` line for a file
    that torch cannot read (garbage, truncated), that is not a training checkpoint, or whose
    content does not match its checksum."""
    unreadable = (
        "not a readable training checkpoint (damaged, truncated or another kind of file); "
        "train without --resume to start again"
    )
    if os.path.isdir(path):
        raise InputError("is a directory, not a checkpoint", path)
    if os.path.isfile(path) and not is_torch_checkpoint(path):  # torch is not asked
        raise InputError(unreadable, path)
    try:
        with warnings.catch_warnings():  # torch's own words about a file it cannot read
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except IsADirectoryError:
        raise InputError("is a directory, not a checkpoint", path) from None
    except Exception:  # noqa: BLE001 - torch's reasons run over several lines; one says enough
        raise InputError(unreadable, path) from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        raise InputError(unreadable, path)
    saved = state.pop(CHECKSUM_KEY, None)
    if saved is None:
        log.warning(
            "%s was written before checkpoints had a checksum: its integrity cannot be checked",
            path,
        )
    elif state_digest(state) != saved:
        raise InputError(
            "damaged checkpoint: its content does not match its checksum (changed or "
            "truncated since it was written); train without --resume to start again",
            path,
        )
    try:
        state["meta"] = json.loads(state["meta"])
    except (TypeError, ValueError):
        raise InputError(unreadable, path) from None
    if not isinstance(state["meta"], dict) or "position" not in state["meta"]:
        raise InputError(unreadable, path)
    return state
