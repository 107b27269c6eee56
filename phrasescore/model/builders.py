"""The architecture registry (Joey NMT's ``builders.py``): a name in a model file -> a network.

``NETWORKS`` maps every ``ModelConfig.arch`` to its class; the names are those of the presets
(:data:`~phrasescore.model.config.ARCH_PRESETS`), so a new architecture is one class here and
one preset table there.
"""

from __future__ import annotations

from phrasescore.model.attention import AttentionEncoderDecoder
from phrasescore.model.base import EncoderDecoder
from phrasescore.model.config import (
    ARCHITECTURES,
    FUSED_ARCHITECTURES,
    RECURRENCES,
    ModelConfig,
)
from phrasescore.model.encdec import GRUEncoderDecoder
from phrasescore.model.initialization import init_self_normalized
from phrasescore.model.lstm import DeepLSTMEncoderDecoder

NETWORKS: dict[str, type[EncoderDecoder]] = {
    "cho": GRUEncoderDecoder,
    "lstm": DeepLSTMEncoderDecoder,
    "attention": AttentionEncoderDecoder,
}
"""Architecture name -> network class, in the order of :data:`ARCHITECTURES`."""

if tuple(NETWORKS) != ARCHITECTURES:  # pragma: no cover - a programming error
    raise ImportError("NETWORKS and the preset tables name different architectures")


def build_network(config: ModelConfig) -> EncoderDecoder:
    """A freshly initialised network of ``config.arch`` (output biases lowered by log V when it
    self-normalises: :func:`~phrasescore.model.initialization.init_self_normalized`)."""
    if config.arch not in NETWORKS:
        raise ValueError(
            f"unknown architecture {config.arch!r} (known: {', '.join(ARCHITECTURES)})"
        )
    if config.recurrence not in RECURRENCES:
        raise ValueError(
            f"unknown recurrence {config.recurrence!r} (known: {', '.join(RECURRENCES)})"
        )
    if config.recurrence == "fused" and config.arch not in FUSED_ARCHITECTURES:
        raise ValueError(f"no fused recurrence for architecture {config.arch!r}")
    network = NETWORKS[config.arch](config)
    if config.self_normalize:
        init_self_normalized(network)
    return network
