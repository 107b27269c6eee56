"""Weights files: a network's tensors in safetensors plus JSON metadata, nothing executable.

Loading executes no code (no pickle): tensors are read by safetensors, everything else is JSON
strings in the file's metadata header. This module knows networks and tensors only; what the
metadata means (configuration, vocabularies, text settings) is :mod:`phrasescore.bundle`'s.

``signature``  16 hex digits of SHA-256 over the weights (in name order) and the metadata
               ``core`` (configuration, vocabularies...): it names exactly one model in logs,
               moses.ini comments and reports, and a damaged file fails to match it.

A file can say anything, so before a network is built from it :func:`check_sizes` refuses
sizes no phrasescore model has (``hidden_dim 300000`` would ask for terabytes), and
:func:`check_shapes` builds the network on the ``meta`` device (no memory) and compares every
tensor shape with the file's, each refusal one :class:`~phrasescore.errors.ModelFileError` line.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch.overrides import TorchFunctionMode

from phrasescore import __version__
from phrasescore.errors import ModelFileError
from phrasescore.files.outputs import atomic_path

MAX_DIM = 1 << 16
"""Largest width of any layer or embedding (the papers use at most 3072)."""
MAX_VOCAB = 1 << 24
"""Largest vocabulary (the papers use at most 80,000 words)."""
MAX_DEPTH = 64
"""Largest number of layers and largest n-gram order."""


_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
"""safetensors' names of the dtypes a model file may hold."""


def write_safetensors(
    path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """Write a safetensors file atomically (its directory is created if needed), the same
    bytes for the same tensors and metadata.

    safetensors' own writer puts the metadata in hash-map order, a new order in every run, so
    two identical trainings gave different files (and a cache keyed on a file's hash missed).
    Here the header is JSON with sorted keys and the tensors are laid out in name order; any
    safetensors reader reads it (the format: an 8-byte little-endian header size, the header
    padded with spaces to a multiple of 8, then the tensors' bytes, little-endian, C order).
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if sys.byteorder != "little":  # pragma: no cover - the tensors' bytes are not the format's
        with atomic_path(path) as tmp:
            save_file(tensors, tmp, metadata=metadata)
        return
    names = sorted(tensors)
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in names:
        tensor = tensors[name]
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"cannot write {name} of dtype {tensor.dtype} in a model file")
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    head = text.encode("utf-8")
    head += b" " * (-len(head) % 8)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)))
        fh.write(head)
        for name in names:
            data = tensors[name].detach().to("cpu").contiguous().reshape(-1)
            if data.numel():
                fh.write(data.view(torch.uint8).numpy().data)  # no copy of the bytes
        fh.flush()
        os.fsync(fh.fileno())


TORCH_ZIP_MAGIC = b"PK\x03\x04"
"""The first bytes of a file ``torch.save`` writes (a zip archive): a training checkpoint."""


def is_torch_checkpoint(path: str) -> bool:
    """Whether ``path`` starts as ``torch.save``'s files do (told by its first bytes, before any
    library reads it: no pickle is opened to find out)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == TORCH_ZIP_MAGIC
    except OSError:
        return False


def read_header(path: str, what: str = "model") -> dict[str, str]:
    """The metadata header of a safetensors file; :class:`ModelFileError` for anything else."""
    if os.path.isdir(path):
        raise ModelFileError(f"is a directory, not a {what} file", path)
    if not os.path.exists(path):
        raise ModelFileError(f"no such {what} file", path)
    if not os.path.isfile(path):  # /dev/null, a pipe: safetensors reads a file by its size
        raise ModelFileError(
            f"is not a regular file (a device or a pipe): give the {what} file", path
        )
    if is_torch_checkpoint(path):
        raise ModelFileError(
            f"is a training checkpoint (MODEL.checkpoint), not a {what} file: give the "
            f"{what} file itself",
            path,
        )
    try:
        with safe_open(path, framework="pt") as handle:
            return handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelFileError(f"not a phrasescore {what} file ({exc})", path) from None


TENSOR_ALIGNMENT = 64
"""Bytes to which every tensor read from a file is aligned (PyTorch's own CPU allocations are)."""


def read_tensors(path: str) -> dict[str, torch.Tensor]:
    """The file's tensors, each at an address aligned to :data:`TENSOR_ALIGNMENT` bytes.

    safetensors gives views of the file mapped in memory, at 8 + header size + offset bytes from
    a page: their alignment depends on the metadata header's length (its paths, its
    configuration), and the matrix library takes other code paths for other alignments (float32
    log p moves in its last digits: docs/benchmarks.md, "Tensor alignment"). A tensor that is not
    aligned is copied, so that a model's scores depend on its weights alone: the same weights in
    two files (a model saved again with other metadata) give the same bytes."""
    with safe_open(path, framework="pt") as handle:
        return {name: _aligned(handle.get_tensor(name)) for name in handle.keys()}


def _aligned(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.numel() == 0 or tensor.data_ptr() % TENSOR_ALIGNMENT == 0:
        return tensor
    return tensor.clone()


def state_tensors(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The network's weights as contiguous float32 CPU tensors (what model files hold)."""
    return {
        name: t.detach().to("cpu", torch.float32).contiguous()
        for name, t in network.state_dict().items()
    }


def compute_signature(tensors: dict[str, torch.Tensor], core: dict[str, str]) -> str:
    """SHA-256 over the weights (in name order), configuration and vocabularies; 16 hex digits."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(tensors[name].numpy()))  # no copy of the bytes
    for key in sorted(core):
        digest.update(key.encode())
        digest.update(core[key].encode())
    return digest.hexdigest()[:16]


def save_network_file(
    path: str,
    network: torch.nn.Module,
    core: dict[str, str],
    info: dict[str, Any],
    file_format: str,
    version: int,
) -> str:
    """Write weights + metadata (``core``: configuration, vocabularies...) atomically; returns
    the signature over weights and ``core``."""
    tensors = state_tensors(network)
    signature = compute_signature(tensors, core)
    metadata = {
        "format": file_format,
        "format_version": str(version),
        "phrasescore_version": __version__,
        "signature": signature,
        "info": json.dumps(info, sort_keys=True, default=str),
        **core,
    }
    write_safetensors(path, tensors, metadata)
    return signature


def _limit(name: str) -> int:
    if name.endswith("vocab_size"):
        return MAX_VOCAB
    if name in ("layers", "order"):
        return MAX_DEPTH
    return MAX_DIM


def check_sizes(config: dict[str, Any], path: str) -> None:
    """Refuse a configuration whose integer sizes are negative or beyond any sane model."""
    for name, value in config.items():
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, bool) or not isinstance(item, int):
                continue
            if not 0 <= item <= _limit(name):
                raise ModelFileError(
                    f"damaged or foreign model file: {name} {item} is outside 0..{_limit(name)}",
                    path,
                )


class _NoInitialValues(TorchFunctionMode):
    """Skips the initialisations (``torch.nn.init`` and the tensors' random fills) of a network
    built for its shapes alone: a meta tensor holds no values, and ``normal_`` on the meta
    device goes through PyTorch's reference implementations, whose first call imports
    torch._dynamo (seconds of a command's start-up)."""

    _FILLS = (torch.Tensor.normal_, torch.Tensor.uniform_)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init" or func in self._FILLS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def check_shapes(
    build: Callable[[], torch.nn.Module], tensors: dict[str, Any], path: str
) -> torch.nn.Module:
    """Build the network on the meta device (no memory) and refuse a file whose tensors do not
    have exactly its parameter names and shapes; returns the shape-only network, for
    :func:`load_weights` to fill."""
    with torch.device("meta"), _NoInitialValues():
        shell = build()
    expected = {name: tuple(t.shape) for name, t in shell.state_dict().items()}
    found = {name: tuple(t.shape) for name, t in tensors.items()}
    if expected == found:
        return shell
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        detail = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
    else:
        name = next(n for n in sorted(expected) if expected[n] != found[n])
        detail = f"{name} is {list(found[name])}, the configuration needs {list(expected[name])}"
    raise ModelFileError(f"weights do not fit the configuration ({detail})", path)


def load_weights(
    network: torch.nn.Module, tensors: dict[str, torch.Tensor], path: str
) -> torch.nn.Module:
    """``network`` with the file's ``tensors`` loaded (strictly), in eval mode. The tensors
    become the parameters (``assign``): a shape-only network from :func:`check_shapes` is filled
    without a second copy of the weights or a random initialisation."""
    try:
        network.load_state_dict(tensors, strict=True, assign=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ModelFileError(f"weights do not fit the configuration ({first})", path) from None
    return network.eval()
