"""The architecture registry (Joey NMT's ``builders.py``): a name in a model file -> a network.

``NETWORKS`` maps every ``ModelConfig.arch`` to its class; the names are those of the presets
(:data:`~phrasescore.model.config.ARCH_PRESETS`), so a new architecture is one class here and
one preset table there. ``FUSED_NETWORKS`` maps the architectures with a
``recurrence="fused"`` variant (:data:`~phrasescore.model.config.FUSED_ARCHITECTURES`) to theirs:
a model file's ``recurrence`` picks the table, its ``arch`` the class.
"""

from __future__ import annotations

from phrasescore.model.attention import AttentionEncoderDecoder, FusedAttentionEncoderDecoder
from phrasescore.model.base import EncoderDecoder
from phrasescore.model.config import (
    ARCHITECTURES,
    FUSED_ARCHITECTURES,
    RECURRENCES,
    ModelConfig,
)
from phrasescore.model.encdec import FusedGRUEncoderDecoder, GRUEncoderDecoder
from phrasescore.model.initialization import init_self_normalized
from phrasescore.model.lstm import DeepLSTMEncoderDecoder
from phrasescore.model.transformer import TransformerEncoderDecoder

NETWORKS: dict[str, type[EncoderDecoder]] = {
    "cho": GRUEncoderDecoder,
    "lstm": DeepLSTMEncoderDecoder,
    "attention": AttentionEncoderDecoder,
    "transformer": TransformerEncoderDecoder,
}
"""Architecture name -> network class (``recurrence="written"``), in the order of
:data:`ARCHITECTURES`."""

FUSED_NETWORKS: dict[str, type[EncoderDecoder]] = {
    "cho": FusedGRUEncoderDecoder,
    "attention": FusedAttentionEncoderDecoder,
}
"""Architecture name -> network class with :class:`torch.nn.GRU` recurrences
(``recurrence="fused"``), in the order of :data:`FUSED_ARCHITECTURES`."""

if tuple(NETWORKS) != ARCHITECTURES:  # pragma: no cover - a programming error
    raise ImportError("NETWORKS and the preset tables name different architectures")
if tuple(FUSED_NETWORKS) != FUSED_ARCHITECTURES:  # pragma: no cover - a programming error
    raise ImportError("FUSED_NETWORKS and FUSED_ARCHITECTURES name different architectures")


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
    network = (FUSED_NETWORKS if config.recurrence == "fused" else NETWORKS)[config.arch](config)
    if config.self_normalize:
        init_self_normalized(network)
    return network
