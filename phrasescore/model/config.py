"""Model and training configuration, and the presets.

One :class:`ModelConfig` is saved inside every model file; every command reads the architecture,
sizes and text settings from it, so no command needs to be told again what a model is.

Presets
-------
``paper``  Cho et al. (2014) §3.1/§4.1: 1000 hidden units, 100-dim (rank-100) embeddings and
           output matrix, 500 maxout units, 15,000-word vocabularies, Adadelta (ρ 0.95,
           ε 1e-6), minibatches of 64 phrase pairs, no dropout.
``default`` Sized to train well on a 2-core CPU in minutes: 256 hidden, 128-dim embeddings and
           output rank, 256 maxout units, 15,000-word vocabularies, Adam (lr 1e-3), token-budget
           batches of ~2,000 target tokens, dropout 0.2 on embeddings and the maxout layer. The
           README gives the measurements (Adadelta vs Adam in the same budget) behind the choice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ARCHITECTURES = ("cho",)


@dataclass
class ModelConfig:
    """Sizes and text settings of a network; saved with the model."""

    arch: str = "cho"
    embedding_dim: int = 128
    hidden_dim: int = 256
    maxout_units: int = 256
    output_rank: int = 128
    dropout: float = 0.2
    init_std: float = 0.01
    src_vocab_size: int = 0
    tgt_vocab_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class TrainConfig:
    """How a model is trained; saved with the model for the record."""

    optimizer: str = "adam"  # adam | adadelta
    learning_rate: float = 1e-3
    adadelta_rho: float = 0.95
    adadelta_eps: float = 1e-6
    clip_norm: float = 1.0
    batch_tokens: int = 2000
    batch_pairs: int | None = None
    max_length: int = 50
    vocab_size: int = 15000
    subwords: int | None = None
    epochs: int = 20
    max_steps: int | None = None
    max_minutes: float | None = None
    valid_every: int = 200
    patience: int = 5
    checkpoint_every: int = 200
    valid_fraction: float = 0.02
    valid_max_pairs: int = 2000
    seed: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


PRESETS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "default": ({}, {}),
    "paper": (
        dict(embedding_dim=100, hidden_dim=1000, maxout_units=500, output_rank=100, dropout=0.0),
        dict(
            optimizer="adadelta",
            learning_rate=1.0,
            clip_norm=1.0,
            batch_pairs=64,
            batch_tokens=100000,
            vocab_size=15000,
        ),
    ),
    # A very small network for tests and the quick demo.
    "tiny": (
        dict(embedding_dim=32, hidden_dim=64, maxout_units=64, output_rank=32, dropout=0.0),
        dict(batch_tokens=600, valid_every=50, checkpoint_every=50),
    ),
}


def preset(name: str) -> tuple[ModelConfig, TrainConfig]:
    """The model and training configuration of a named preset."""
    if name not in PRESETS:
        raise KeyError(name)
    model_kw, train_kw = PRESETS[name]
    return ModelConfig(**model_kw), TrainConfig(**train_kw)
