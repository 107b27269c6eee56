"""The model file: a network bundled with the vocabularies and text settings that make it usable
on text. It sits above the networks (:mod:`phrasescore.model`, ids only) and the text layer
(:mod:`phrasescore.text`), the one place that knows both.

Two kinds of file, one loader and one saver (:func:`load_bundle`, :func:`save_bundle`):

=================  ==========================  ==================================================
``format``         bundle                      metadata ``core`` (JSON strings)
=================  ==========================  ==================================================
phrasescore-model  :class:`TrainedModel`       ``config`` ``src_vocab`` ``tgt_vocab``
                   (encoder-decoder)           ``src_text`` ``tgt_text``
phrasescore-lm     :class:`TrainedLM` (CSLM)   ``config`` ``vocab`` ``text``
=================  ==========================  ==================================================

Every file also holds ``format_version``, ``phrasescore_version``, ``info`` (how it was trained)
and the ``signature`` over weights and core (:mod:`phrasescore.model.checkpoint`). Loading
refuses, each time with one :class:`~phrasescore.errors.ModelFileError` line: a file of the
other kind or of no kind, a newer format, damaged JSON, insane sizes, a signature that does not
match, tensors that do not fit the configuration -- all before a network is allocated.

The networks and the vocabularies use the one set of special ids of
:mod:`phrasescore.special_ids`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from phrasescore.errors import ModelFileError
from phrasescore.model import build_network
from phrasescore.model.base import EncoderDecoder
from phrasescore.model.checkpoint import (
    check_shapes,
    check_sizes,
    compute_signature,
    load_weights,
    read_header,
    read_tensors,
    save_network_file,
)
from phrasescore.model.config import ModelConfig
from phrasescore.model.cslm import FeedForwardLM, LMConfig
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import Vocabulary, vocabulary_from_state

FORMAT = "phrasescore-model"
FORMAT_VERSION = 1
LM_FORMAT = "phrasescore-lm"
LM_FORMAT_VERSION = 1


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


@dataclass
class TrainedModel:
    """An encoder-decoder network with everything needed to use it on text."""

    network: EncoderDecoder
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    src_text: TextNormalizer
    tgt_text: TextNormalizer
    info: dict[str, Any] = field(default_factory=dict)
    signature: str = ""

    FORMAT: ClassVar[str] = FORMAT
    VERSION: ClassVar[int] = FORMAT_VERSION
    WHAT: ClassVar[str] = "model"
    CORE_KEYS: ClassVar[tuple[str, ...]] = (
        "config",
        "src_vocab",
        "tgt_vocab",
        "src_text",
        "tgt_text",
    )

    @property
    def config(self) -> ModelConfig:
        return self.network.config

    def target_words(self, ids: Sequence[int]) -> list[str]:
        """The target words of decoder output ``ids``, in their natural order (a right-to-left
        model's are turned round: :meth:`ModelConfig.target_order`)."""
        return self.config.target_order(self.tgt_vocab.decode(ids))

    def core(self) -> dict[str, str]:
        """The metadata the signature covers besides the weights."""
        return {
            "config": _json(self.config.to_dict()),
            "src_vocab": _json(self.src_vocab.to_state()),
            "tgt_vocab": _json(self.tgt_vocab.to_state()),
            "src_text": _json(self.src_text.to_state()),
            "tgt_text": _json(self.tgt_text.to_state()),
        }

    @classmethod
    def from_core(cls, core: dict[str, Any], info: dict[str, Any]) -> tuple[Callable, Callable]:
        """(network builder, bundle maker) for parsed ``core`` JSON (see :func:`load_bundle`)."""
        config = ModelConfig.from_dict(core["config"])
        src_vocab = vocabulary_from_state(core["src_vocab"])
        tgt_vocab = vocabulary_from_state(core["tgt_vocab"])
        src_text = TextNormalizer.from_state(core["src_text"])
        tgt_text = TextNormalizer.from_state(core["tgt_text"])

        def make(network: EncoderDecoder, signature: str) -> TrainedModel:
            return cls(network, src_vocab, tgt_vocab, src_text, tgt_text, info, signature)

        return (lambda: build_network(config)), make

    def describe(self) -> dict[str, Any]:
        """What ``phrasescore info`` prints."""
        params = sum(p.numel() for p in self.network.parameters())
        return {
            "signature": self.signature,
            "architecture": self.config.arch,
            "parameters": params,
            "config": self.config.to_dict(),
            "self-normalization": (
                f"alpha {self.config.self_normalize:g} (Devlin et al. 2014): rescore/nbest "
                "--scoring self-normalized available"
                if self.config.self_normalize
                else "off (exact scoring only)"
            ),
            "source vocabulary": f"{self.src_vocab.kind}, {len(self.src_vocab)} entries",
            "target vocabulary": f"{self.tgt_vocab.kind}, {len(self.tgt_vocab)} entries",
            "source text": self.src_text.to_state(),
            "target text": self.tgt_text.to_state(),
            **{k: v for k, v in self.info.items()},
        }


@dataclass
class TrainedLM:
    """A CSLM network with the vocabulary and text settings needed to use it on text."""

    network: FeedForwardLM
    vocab: Vocabulary
    text: TextNormalizer
    info: dict[str, Any] = field(default_factory=dict)
    signature: str = ""

    FORMAT: ClassVar[str] = LM_FORMAT
    VERSION: ClassVar[int] = LM_FORMAT_VERSION
    WHAT: ClassVar[str] = "language model"
    CORE_KEYS: ClassVar[tuple[str, ...]] = ("config", "vocab", "text")

    @property
    def config(self) -> LMConfig:
        return self.network.config

    def core(self) -> dict[str, str]:
        """The metadata the signature covers besides the weights."""
        return {
            "config": _json(self.config.to_dict()),
            "vocab": _json(self.vocab.to_state()),
            "text": _json(self.text.to_state()),
        }

    @classmethod
    def from_core(cls, core: dict[str, Any], info: dict[str, Any]) -> tuple[Callable, Callable]:
        """(network builder, bundle maker) for parsed ``core`` JSON (see :func:`load_bundle`)."""
        config = LMConfig.from_dict(core["config"])
        vocab = vocabulary_from_state(core["vocab"])
        text = TextNormalizer.from_state(core["text"])

        def make(network: FeedForwardLM, signature: str) -> TrainedLM:
            return cls(network, vocab, text, info, signature)

        return (lambda: FeedForwardLM(config)), make

    def describe(self) -> dict[str, Any]:
        """What describes the file (as ``phrasescore info`` does for encoder-decoders)."""
        return {
            "signature": self.signature,
            "architecture": "cslm (feed-forward n-gram language model)",
            "parameters": sum(p.numel() for p in self.network.parameters()),
            "config": self.config.to_dict(),
            "vocabulary": f"{self.vocab.kind}, {len(self.vocab)} entries",
            "text": self.text.to_state(),
            **self.info,
        }


Bundle = TrainedModel | TrainedLM
_WRONG_KIND = {
    (TrainedModel, LM_FORMAT): "this is a CSLM language model (phrasescore train-lm), not an "
    "encoder-decoder model: give it with --lm",
    (TrainedLM, FORMAT): "this is an encoder-decoder model (phrasescore train), not a CSLM "
    "language model (phrasescore train-lm): give it with --model",
}
_NOT_ONE = {
    TrainedModel: "not a phrasescore model file (no phrasescore metadata)",
    TrainedLM: "not a phrasescore language model file",
}


# ---------------------------------------------------------------------------- saving
def save_bundle(path: str, bundle: Bundle) -> str:
    """Write ``bundle`` to ``path`` atomically; returns (and sets) its signature."""
    bundle.signature = save_network_file(
        path, bundle.network, bundle.core(), bundle.info, bundle.FORMAT, bundle.VERSION
    )
    return bundle.signature


def save_model(path: str, model: TrainedModel) -> str:
    """Write an encoder-decoder model file (:func:`save_bundle`)."""
    return save_bundle(path, model)


def save_lm(path: str, lm: TrainedLM) -> str:
    """Write a CSLM file (:func:`save_bundle`)."""
    return save_bundle(path, lm)


# ---------------------------------------------------------------------------- loading
def read_bundle_metadata(path: str, kind: type[Bundle]) -> dict[str, str]:
    """The metadata header of a file of ``kind``, or :class:`ModelFileError` saying what the
    file is instead (the other kind, no phrasescore file, a newer format)."""
    metadata = read_header(path, kind.WHAT)
    found = metadata.get("format")
    if (kind, found) in _WRONG_KIND:
        raise ModelFileError(_WRONG_KIND[kind, found], path)
    if found != kind.FORMAT:
        raise ModelFileError(_NOT_ONE[kind], path)
    version = int(metadata.get("format_version", "0"))
    if version > kind.VERSION:
        name = "model file" if kind is TrainedModel else "language model"
        raise ModelFileError(
            f"{name} format {version} is newer than this phrasescore reads ({kind.VERSION}); "
            "upgrade phrasescore",
            path,
        )
    return metadata


def read_metadata(path: str) -> dict[str, str]:
    """The metadata header of an encoder-decoder model file."""
    return read_bundle_metadata(path, TrainedModel)


def read_lm_metadata(path: str) -> dict[str, str]:
    """The metadata header of a CSLM file."""
    return read_bundle_metadata(path, TrainedLM)


def load_bundle(path: str, kind: type[Bundle], device: str | torch.device = "cpu") -> Bundle:
    """Load a file written by :func:`save_bundle` as a ``kind``, checked (module docstring)."""
    metadata = read_bundle_metadata(path, kind)
    try:
        core_text = {k: metadata[k] for k in kind.CORE_KEYS}
        core = {k: json.loads(v) for k, v in core_text.items()}
        check_sizes(core["config"], path)
        info = json.loads(metadata.get("info", "{}"))
        build, make = kind.from_core(core, info)
        tensors = read_tensors(path)
        if compute_signature(tensors, core_text) != metadata.get("signature"):
            raise ModelFileError(
                f"{kind.WHAT} file is damaged: its signature does not match its content", path
            )
        shell = check_shapes(build, tensors, path)  # no memory allocated for the network
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelFileError(f"damaged phrasescore {kind.WHAT} file ({exc})", path) from None
    network = load_weights(shell, tensors, path)
    return make(network.to(device), metadata["signature"])


def load_model(path: str, device: str | torch.device = "cpu") -> TrainedModel:
    """Load an encoder-decoder model file (:func:`load_bundle`), in eval mode."""
    return load_bundle(path, TrainedModel, device)


def load_lm(path: str, device: str | torch.device = "cpu") -> TrainedLM:
    """Load a CSLM file (:func:`load_bundle`), in eval mode."""
    return load_bundle(path, TrainedLM, device)
