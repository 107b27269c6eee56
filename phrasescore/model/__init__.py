"""The networks (no file or text I/O here) and the architecture registry."""

from __future__ import annotations

from phrasescore.model.base import EncoderDecoder
from phrasescore.model.config import ARCHITECTURES, ModelConfig


def build_network(config: ModelConfig) -> EncoderDecoder:
    """A freshly initialised network of ``config.arch``."""
    if config.arch == "cho":
        from phrasescore.model.encdec import GRUEncoderDecoder

        return GRUEncoderDecoder(config)
    if config.arch == "lstm":
        from phrasescore.model.lstm import DeepLSTMEncoderDecoder

        return DeepLSTMEncoderDecoder(config)
    if config.arch == "attention":
        from phrasescore.model.attention import AttentionEncoderDecoder

        return AttentionEncoderDecoder(config)
    raise ValueError(f"unknown architecture {config.arch!r} (known: {', '.join(ARCHITECTURES)})")
