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
           batches of ~2,000 target tokens, dropout 0.2 on embeddings and the maxout layer,
           PyTorch's fan-in initialisation (``init="fan_in"``) instead of the paper's N(0, 0.01²)
           (see DEFAULT_INIT). docs/benchmarks.md gives the measurements behind each choice
           (Adam against Adadelta; learning curves against a plain PyTorch model).

Presets are per architecture (:data:`ARCH_PRESETS`, :func:`preset`); ``PRESETS`` is the ``cho``
table. The ``default`` presets of the three recurrent ones share the training settings above, so
that they compare at equal budgets; ``paper`` is each paper's own setting:

``lstm``      Sutskever et al. (2014) §3.4: 4 layers of 1000 cells, 1000-dim embeddings, source
              reversed, uniform init ±0.08, plain SGD lr 0.7 halved every half epoch after 5
              epochs, 7.5 epochs, batches of 128 pairs, gradient norm clipped to 5, no dropout;
              the gradient is the summed log-likelihood's divided by the 128 sentences (not by
              the target tokens, as elsewhere: SGD's learning rate depends on that scale).
              (The paper's vocabularies are 160,000 source / 80,000 target words; one
              ``vocab_size`` serves both sides here, set to 80,000.) ``default``: 2 x 256 cells,
              128-dim embeddings, output rank 128.
``attention`` Bahdanau et al. (2015) App. A/B: 1000 hidden units per direction and in the
              decoder, 620-dim embeddings, 500 maxout units (output W_o straight from them),
              30,000-word vocabularies, Adadelta (ρ 0.95, ε 1e-6), minibatches of 80, gradient
              norm clipped to 1, no dropout. ``default``: 256 hidden, 128-dim embeddings, 256
              maxout units, output rank 128.
``transformer`` Vaswani et al. (2017), pre-norm (:mod:`phrasescore.model.transformer`): no
              ``paper`` preset (its training is not phrasescore's). ``default``: 3 layers of 256
              units, 4 heads, 1,024 feed-forward units, dropout 0.3, Adam 1e-3 halved on plateau.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

DEFAULT_LEARNING_RATE = {"adam": 1e-3, "adadelta": 1.0, "sgd": 0.7}
"""The learning rate each optimiser starts from: Adam's usual 1e-3 (Kingma & Ba 2015), 1.0 for
Adadelta (Zeiler 2012, as Cho et al. and Bahdanau et al. use it), 0.7 for plain SGD (Sutskever et
al. 2014 §3.4). The optimisers phrasescore knows are its keys."""

OPTIMIZERS = tuple(DEFAULT_LEARNING_RATE)

RECURRENCES = ("written", "fused")
"""The values of ``ModelConfig.recurrence``: the GRU equations written out (Cho et al. 2014,
eq. 5-8) or :class:`torch.nn.GRU` (cuDNN's formulation; :mod:`phrasescore.model.gru`)."""

FUSED_ARCHITECTURES = ("cho", "attention")
"""The architectures with a ``recurrence="fused"`` encoder (lstm's recurrences are
:class:`torch.nn.LSTM` already)."""


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
    # cho: the paper's own scheme (Cho et al. §4.1, Bahdanau et al. App. B.1, Sutskever et al.
    # §3.4 with init_uniform); fan_in: PyTorch's own scales for every architecture (embeddings
    # N(0, 1), weights and biases U(±1/√fan_in), written-out recurrent matrices orthogonal;
    # initialization.init_fan_in). Model files written before it load as "cho".
    init: str = "cho"
    # the GRUs: "written", those of gru.py written out step by step, exactly Cho et
    # al. eq. 5-8 (every preset); "fused", torch.nn.GRU (cuDNN's fused kernel on a GPU) for the
    # encoders of cho and attention and cho's decoder, whose candidate applies the reset gate
    # after the recurrent product (gru.py's docstring; refused by the paper presets). Model
    # files written before it load as "written".
    recurrence: str = "written"
    layers: int = 1  # lstm, transformer: stacked layers in encoder and decoder
    # transformer: attention heads and the feed-forward layers' width (Vaswani et al. 2017,
    # §3.2.2, §3.3); its embeddings are hidden_dim wide. Model files written before them load
    # with the defaults, which no other architecture reads.
    heads: int = 4
    feedforward_dim: int = 1024
    reverse_source: bool = True  # lstm: read the source words in reverse order
    # right-to-left model (``train --reverse-target``, any architecture): the decoder predicts the
    # target words last to first, p(y) = prod_t p(y_t | y_>t, x), the R2L re-ranker of Sennrich et
    # al. (2016) and Liu et al. (2016). Commands give and get words in their natural order;
    # :meth:`target_order` turns them round at the word level (subwords stay in order within a
    # word). Model files written before it load as False.
    reverse_target: bool = False
    init_uniform: float | None = None  # lstm: weights U(-a, a) instead of N(0, init_std²)
    # alpha of the self-normalisation penalty alpha (log Z)² per target token (Devlin et al.
    # 2014, §2.1; ``train --self-normalize``); 0: off. Model files written before it load as 0.
    # Recorded here because scoring reads it: ``--scoring self-normalized`` needs alpha > 0.
    self_normalize: float = 0.0
    src_vocab_size: int = 0
    tgt_vocab_size: int = 0

    def target_order(self, words: list[str]) -> list[str]:
        """Target words in the order the decoder predicts them (its own inverse): reversed for
        a right-to-left model, as given otherwise."""
        return words[::-1] if self.reverse_target else words

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class TrainConfig:
    """How a model is trained; saved with the model for the record."""

    optimizer: str = "adam"  # one of OPTIMIZERS
    learning_rate: float = DEFAULT_LEARNING_RATE["adam"]
    # Sutskever et al.: halve the learning rate every ``lr_halve_every_epochs`` epochs once
    # ``lr_halve_after_epochs`` epochs are done (None: a constant learning rate)
    lr_halve_after_epochs: float | None = None
    lr_halve_every_epochs: float = 0.5
    # reduce on plateau: multiply the learning rate by this factor after every validation that
    # does not improve on the best so far (None: never). The default presets: 0.5 (why:
    # docs/benchmarks.md, "Learning curves against a plain PyTorch model").
    lr_plateau_factor: float | None = None
    # the gradient of the summed NLL divided by the pairs of the batch instead of its tokens
    loss_per_sentence: bool = False
    adadelta_rho: float = 0.95
    adadelta_eps: float = 1e-6
    clip_norm: float = 1.0
    batch_tokens: int = 2000
    batch_pairs: int | None = None
    max_length: int = 50
    vocab_size: int = 15000
    subwords: int | None = None
    epochs: float = 20  # may be fractional (Sutskever et al.: 7.5)
    max_steps: int | None = None
    max_minutes: float | None = None
    valid_every: int = 200
    patience: int = 5
    checkpoint_every: int = 200
    valid_fraction: float = 0.02
    valid_max_pairs: int = 2000
    seed: int = 1
    # train --bucket N: each batch padded to widths and a row count that are multiples of N
    # (shapes repeat, for --compile's graphs and CUDA graphs); 0: off (the default)
    bucket: int = 0
    # train --compile: the written-out recurrences' steps through torch.compile (off by default)
    compile: bool = False
    # train --chunked-output: the vocabulary projection and the loss fused over row chunks, no
    # [tokens x vocabulary] logits kept (one more product in the backward; off by default)
    chunked_output: bool = False
    # train --graphs: each batch shape's forward and backward captured in a CUDA graph and
    # replayed (training/captured_step.py; CUDA, with --bucket; off by default)
    graphs: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


PresetTable = dict[str, tuple[dict[str, Any], dict[str, Any]]]

# The default presets start from PyTorch's fan-in scales (init="fan_in"), the paper presets
# from the papers' own. The papers' N(0, 0.01²) weights leave the source path ~1e-5 in size (four
# 0.01-scaled products from the source words to the decoder), and Adam at 1e-3 needs hundreds of
# updates to grow it: with fan_in the held-out perplexity falls from the first updates, on phrase
# pairs and on sentences (the figures: docs/benchmarks.md, "Which model to train for the column
# (history)" and "Learning curves against a plain PyTorch model").
DEFAULT_INIT = dict(init="fan_in")

# The default presets halve the learning rate after each validation without a new best (reduce
# on plateau, as Joey NMT's "plateau" scheduler): docs/benchmarks.md "Learning curves".
DEFAULT_SCHEDULE = dict(lr_plateau_factor=0.5)

PRESETS: PresetTable = {
    "default": (DEFAULT_INIT, DEFAULT_SCHEDULE),
    "paper": (
        dict(embedding_dim=100, hidden_dim=1000, maxout_units=500, output_rank=100, dropout=0.0),
        dict(
            optimizer="adadelta",
            learning_rate=DEFAULT_LEARNING_RATE["adadelta"],
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

LSTM_PRESETS: PresetTable = {
    "default": (dict(layers=2, output_rank=128, **DEFAULT_INIT), DEFAULT_SCHEDULE),
    "paper": (
        dict(
            layers=4,
            embedding_dim=1000,
            hidden_dim=1000,
            output_rank=1000,  # = hidden_dim: the softmax reads the top layer's state directly
            dropout=0.0,
            init_uniform=0.08,
        ),
        dict(
            optimizer="sgd",
            learning_rate=DEFAULT_LEARNING_RATE["sgd"],
            lr_halve_after_epochs=5.0,
            lr_halve_every_epochs=0.5,
            loss_per_sentence=True,
            epochs=7.5,
            clip_norm=5.0,
            batch_pairs=128,
            batch_tokens=100000,
            vocab_size=80000,
        ),
    ),
    "tiny": (
        dict(
            layers=2,
            embedding_dim=32,
            hidden_dim=64,
            output_rank=32,
            dropout=0.0,
            init_uniform=0.08,
        ),
        dict(batch_tokens=600, valid_every=50, checkpoint_every=50),
    ),
}

# The attention model's default preset starts Adam at 2e-3, twice the usual 1e-3: on Multi30k it
# reaches a lower validation perplexity sooner and a lower plateau, left to right and right to
# left (docs/benchmarks.md, "The recipe in short", training the models). cho and lstm keep 1e-3
# (not measured at 2e-3).
ATTENTION_LEARNING_RATE = 2e-3

# `train --phrase-table` (the column's model, cho) with the default preset starts Adam at 2e-3
# too: on the Multi30k table its held-out pair perplexity is lower at every update than at 1e-3
# (3e-3 no better), and only its column moves BLEU significantly (docs/benchmarks.md, "The
# column's model at 2e-3, alone and with the three re-ranking models"). Sentence-level cho
# training keeps 1e-3 (not measured at 2e-3).
PHRASE_PAIR_LEARNING_RATE = 2e-3

ATTENTION_PRESETS: PresetTable = {
    "default": (DEFAULT_INIT, dict(DEFAULT_SCHEDULE, learning_rate=ATTENTION_LEARNING_RATE)),
    "paper": (
        dict(
            embedding_dim=620,
            hidden_dim=1000,
            maxout_units=500,
            output_rank=500,  # = maxout_units: W_o reads the maxout units directly
            dropout=0.0,
        ),
        dict(
            optimizer="adadelta",
            learning_rate=DEFAULT_LEARNING_RATE["adadelta"],
            clip_norm=1.0,
            batch_pairs=80,
            batch_tokens=100000,
            vocab_size=30000,
        ),
    ),
    "tiny": PRESETS["tiny"],
}

# The Transformer's default preset: 3 layers of 256 units, 4 heads, 1,024 feed-forward units and
# dropout 0.3, the small-data sizes of Multi30k systems (Libovický et al. 2018 and the WMT18
# multimodal task's text-only Transformers), Adam at 1e-3 (pre-norm layers train without a
# warm-up, Xiong et al. 2020; on Multi30k 1e-3 was lower in validation perplexity than 5e-4 at
# every validation: docs/benchmarks.md, "A Transformer re-ranking model") and reduce on plateau
# as the other defaults. No paper preset: see phrasescore/model/transformer.py.
TRANSFORMER_LEARNING_RATE = 1e-3

TRANSFORMER_PRESETS: PresetTable = {
    "default": (
        dict(
            embedding_dim=256,
            hidden_dim=256,
            output_rank=256,
            layers=3,
            heads=4,
            feedforward_dim=1024,
            dropout=0.3,
        ),
        dict(DEFAULT_SCHEDULE, learning_rate=TRANSFORMER_LEARNING_RATE),
    ),
    "tiny": (
        dict(
            embedding_dim=32,
            hidden_dim=32,
            output_rank=32,
            layers=1,
            heads=2,
            feedforward_dim=64,
            dropout=0.0,
        ),
        PRESETS["tiny"][1],
    ),
}

ARCH_PRESETS: dict[str, PresetTable] = {
    "cho": PRESETS,
    "lstm": LSTM_PRESETS,
    "attention": ATTENTION_PRESETS,
    "transformer": TRANSFORMER_PRESETS,
}

ARCHITECTURES = tuple(ARCH_PRESETS)
"""The architecture names (``ModelConfig.arch``); :mod:`phrasescore.model.builders` maps each to
its network class."""


LM_PRESETS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # Sized for a 2-core CPU: 0.4M parameters + 385 per vocabulary word (4.3M for 10,000).
    "default": ({}, dict(max_length=100)),
    # Schwenk (2007): 6 context words, 512-dim embeddings, 3072-1536-1024 relu, softmax.
    "paper": (
        dict(order=7, embedding_dim=512, hidden_dims=[3072, 1536, 1024], dropout=0.0),
        dict(learning_rate=5e-4, max_length=100),
    ),
    # For tests and demos.
    "tiny": (
        dict(order=4, embedding_dim=32, hidden_dims=[64], dropout=0.0),
        dict(batch_tokens=600, valid_every=50, checkpoint_every=50, max_length=100),
    ),
}
"""The CSLM presets (:mod:`phrasescore.model.cslm`): its sizes and training settings."""


def initialisation_overrides(name: str | None, arch: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields of ``train --init``: ``fan-in`` (PyTorch's scales, the
    default presets') or ``paper`` (each paper's own: N(0, 0.01²), for lstm U(±0.08)); None
    changes nothing."""
    if name is None:
        return {}
    if name == "fan-in":
        return {"init": "fan_in", "init_uniform": None}
    if name == "paper":
        return {"init": "cho", "init_uniform": 0.08 if arch == "lstm" else None}
    raise ValueError(f"unknown initialisation {name!r} (fan-in or paper)")


def preset(
    name: str, arch: str = "cho", phrase_pairs: bool = False
) -> tuple[ModelConfig, TrainConfig]:
    """The model and training configuration of the preset ``name`` of architecture ``arch``;
    ``phrase_pairs`` (``train --phrase-table``): the cho default starts at
    :data:`PHRASE_PAIR_LEARNING_RATE`."""
    if arch not in ARCH_PRESETS:
        raise KeyError(arch)
    table = ARCH_PRESETS[arch]
    if name not in table:
        raise KeyError(name)
    model_kw, train_kw = table[name]
    if phrase_pairs and name == "default" and arch == "cho":
        train_kw = dict(train_kw, learning_rate=PHRASE_PAIR_LEARNING_RATE)
    return ModelConfig(arch=arch, **model_kw), TrainConfig(**train_kw)
