"""Model files: safetensors weights plus JSON metadata (configuration, vocabularies, signature).

A model file is a single ``.safetensors`` file. Loading it executes no code (no pickle): tensors
are read by safetensors, everything else is JSON in the file's metadata header:

``format``          ``phrasescore-model``; anything else is refused
``format_version``  this module's :data:`FORMAT_VERSION`
``config``          :class:`~phrasescore.model.config.ModelConfig`
``src_vocab``/``tgt_vocab``  vocabulary states (words, or a sentencepiece model)
``src_text``/``tgt_text``    text normalisation (tokenise, lowercase) applied before lookup
``info``            how the model was trained (preset, data, validation perplexity, steps)
``signature``       16 hex digits of SHA-256 over weights, configuration and vocabularies: it
                    names exactly this model in logs, moses.ini comments and reports.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from phrasescore import __version__
from phrasescore.errors import ModelFileError
from phrasescore.files import default_file_mode
from phrasescore.model import build_network
from phrasescore.model.base import EncoderDecoder
from phrasescore.model.config import ModelConfig
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import vocabulary_from_state

FORMAT = "phrasescore-model"
FORMAT_VERSION = 1


@dataclass
class TrainedModel:
    """A network with everything needed to use it on text."""

    network: EncoderDecoder
    src_vocab: Any
    tgt_vocab: Any
    src_text: TextNormalizer
    tgt_text: TextNormalizer
    info: dict[str, Any] = field(default_factory=dict)
    signature: str = ""

    @property
    def config(self) -> ModelConfig:
        return self.network.config

    def describe(self) -> dict[str, Any]:
        """What ``phrasescore info`` prints."""
        params = sum(p.numel() for p in self.network.parameters())
        return {
            "signature": self.signature,
            "architecture": self.config.arch,
            "parameters": params,
            "config": self.config.to_dict(),
            "source vocabulary": f"{self.src_vocab.kind}, {len(self.src_vocab)} entries",
            "target vocabulary": f"{self.tgt_vocab.kind}, {len(self.tgt_vocab)} entries",
            "source text": self.src_text.to_state(),
            "target text": self.tgt_text.to_state(),
            **{k: v for k, v in self.info.items()},
        }


def _metadata_core(model: TrainedModel) -> dict[str, str]:
    return {
        "config": json.dumps(model.config.to_dict(), sort_keys=True),
        "src_vocab": json.dumps(model.src_vocab.to_state(), sort_keys=True),
        "tgt_vocab": json.dumps(model.tgt_vocab.to_state(), sort_keys=True),
        "src_text": json.dumps(model.src_text.to_state(), sort_keys=True),
        "tgt_text": json.dumps(model.tgt_text.to_state(), sort_keys=True),
    }


def write_safetensors(
    path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """Write a safetensors file atomically (temporary file beside it, then rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    os.chmod(tmp, default_file_mode())  # mkstemp makes 0600
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_header(path: str, what: str = "model") -> dict[str, str]:
    """The metadata header of a safetensors file; :class:`ModelFileError` for anything else."""
    if not os.path.isfile(path):
        raise ModelFileError(f"no such {what} file", path)
    try:
        with safe_open(path, framework="pt") as handle:
            return handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelFileError(f"not a phrasescore {what} file ({exc})", path) from None


def read_tensors(path: str) -> dict[str, torch.Tensor]:
    with safe_open(path, framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


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
        digest.update(tensors[name].numpy().tobytes())
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
    the signature over weights and ``core``. Shared by model and language-model files."""
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


def save_model(path: str, model: TrainedModel) -> str:
    """Write ``model`` to ``path`` atomically; returns (and sets) its signature."""
    model.signature = save_network_file(
        path, model.network, _metadata_core(model), model.info, FORMAT, FORMAT_VERSION
    )
    return model.signature


def read_metadata(path: str) -> dict[str, str]:
    """The metadata header of a model file, or :class:`ModelFileError` if it is not one."""
    metadata = read_header(path, "model")
    if metadata.get("format") == "phrasescore-lm":
        raise ModelFileError(
            "this is a CSLM language model (phrasescore train-lm), not an encoder-decoder "
            "model: give it with --lm",
            path,
        )
    if metadata.get("format") != FORMAT:
        raise ModelFileError("not a phrasescore model file (no phrasescore metadata)", path)
    version = int(metadata.get("format_version", "0"))
    if version > FORMAT_VERSION:
        raise ModelFileError(
            f"model file format {version} is newer than this phrasescore reads ({FORMAT_VERSION}); "
            "upgrade phrasescore",
            path,
        )
    return metadata


def load_model(path: str, device: str | torch.device = "cpu") -> TrainedModel:
    """Load a model file written by :func:`save_model`; refuses anything else clearly."""
    metadata = read_metadata(path)
    try:
        config = ModelConfig.from_dict(json.loads(metadata["config"]))
        network = build_network(config)
        tensors = read_tensors(path)
        src_vocab = vocabulary_from_state(json.loads(metadata["src_vocab"]))
        tgt_vocab = vocabulary_from_state(json.loads(metadata["tgt_vocab"]))
        src_text = TextNormalizer.from_state(json.loads(metadata["src_text"]))
        tgt_text = TextNormalizer.from_state(json.loads(metadata["tgt_text"]))
        info = json.loads(metadata.get("info", "{}"))
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelFileError(f"damaged phrasescore model file ({exc})", path) from None
    core = {k: metadata[k] for k in ("config", "src_vocab", "tgt_vocab", "src_text", "tgt_text")}
    if compute_signature(tensors, core) != metadata.get("signature"):
        raise ModelFileError(
            "model file is damaged: its signature does not match its content", path
        )
    try:
        network.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ModelFileError(f"weights do not fit the configuration ({first})", path) from None
    network.to(device).eval()
    return TrainedModel(
        network=network,
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        src_text=src_text,
        tgt_text=tgt_text,
        info=info,
        signature=metadata["signature"],
    )
