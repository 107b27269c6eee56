"""How each network's weights start (Joey NMT's ``initialization.py``): one function per paper.

* :func:`init_cho` -- Cho et al. (2014) §4.1 / App. A: weights N(0, 0.01²) (``init_std``),
  recurrent matrices orthogonal (each H x H block of ``[U_r U_z U]`` on its own), biases 0.
* :func:`init_lstm` -- Sutskever et al. (2014) §3.4: every parameter U(-0.08, 0.08)
  (``init_uniform``); without ``init_uniform``: N(0, init_std²) weights and zero biases.
* :func:`init_attention` -- Bahdanau et al. (2015) App. B.1: recurrent matrices orthogonal,
  W_a and U_a N(0, 0.001²), v_a and biases 0, every other weight N(0, init_std²).
* :func:`init_fan_in` -- the ``default`` presets of all three architectures (``init="fan_in"``):
  PyTorch's own scales (embeddings N(0, 1); linear layers, weights and biases,
  U(±1/√fan_in); :class:`torch.nn.LSTM` U(±1/√H)), recurrent matrices of the GRUs
  orthogonal (the fused :class:`torch.nn.GRU` of ``recurrence="fused"`` starts as the written
  one: :func:`_fused_gru_fan_in`). The papers' N(0, 0.01²) leaves a product of several 0.01-scaled matrices between
  source and output, which Adam at 1e-3 takes hundreds of updates to grow
  (docs/benchmarks.md, "Learning curves against a plain PyTorch model").
* :func:`init_transformer` -- the Transformer (Vaswani et al. 2017, which gives no scheme):
  matrices Xavier-uniform (Glorot & Bengio 2010, as tensor2tensor and :class:`torch.nn.Transformer`),
  biases 0, LayerNorm gains 1, embeddings N(0, 1/d) (√d E x of unit variance, §3.4).
* :func:`init_cslm` -- the CSLM (Schwenk 2007): embeddings and output N(0, init_std²), rectified
  hidden layers He-uniform (He et al. 2015), biases 0.

Every scheme ends with the PAD rows of the embeddings at 0 (:func:`zero_padding_rows`). The
parameters are visited in the network's registration order, so a seed gives the same weights.
A self-normalised model (``self_normalize`` > 0) then has its output biases lowered by log V
(:func:`init_self_normalized`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from phrasescore.special_ids import PAD_ID

ATTENTION_INIT_STD = 0.001
"""Standard deviation of W_a and U_a (Bahdanau et al. App. B.1)."""


def orthogonal_blocks(param: torch.Tensor, size: int) -> None:
    """Each [size, size] block of ``param`` a random orthogonal matrix of its own: the column
    blocks of the written GRUs' ``[U_r U_z U]`` [H, 3H], the row blocks of
    :class:`torch.nn.GRU`'s ``weight_hh`` [3H, H] (``[U_r; U_z; U]``)."""
    if param.shape[0] > param.shape[1]:
        for block in range(param.shape[0] // size):
            nn.init.orthogonal_(param.data[block * size : (block + 1) * size])
        return
    for block in range(param.shape[1] // size):
        nn.init.orthogonal_(param.data[:, block * size : (block + 1) * size])


def _is_bias(name: str) -> bool:
    """A bias vector: ``x.bias``, or :class:`torch.nn.GRU`'s ``bias_ih_l0``/``bias_hh_l0``."""
    return name.rpartition(".")[2].startswith("bias")


def _fused_gru_fan_in(name: str, param: torch.Tensor, gru: nn.GRU) -> None:
    """A :class:`torch.nn.GRU` parameter (``recurrence="fused"``) as the written GRU's start:
    the input matrices and their biases U(±1/√fan_in) (the encoders': exactly the written
    ``nn.Linear(E, 3H)``'s; cho's decoder reads [e(y); c], E + H wide), the recurrent biases b_h
    (which the written GRU does not have) 0. (The recurrent matrices are orthogonal: the
    caller's ``recurrent`` names.)"""
    if "bias_hh" in name:
        nn.init.zeros_(param)
    else:
        bound = 1.0 / gru.input_size**0.5
        nn.init.uniform_(param, -bound, bound)


@torch.no_grad()
def zero_padding_rows(*embeddings: nn.Embedding) -> None:
    """e(PAD) = 0: padding contributes nothing to any sum."""
    for embedding in embeddings:
        embedding.weight[PAD_ID].zero_()


def init_cho(network: nn.Module, recurrent: tuple[str, ...]) -> None:
    """Cho et al. (2014) §4.1: N(0, init_std²) weights, orthogonal ``recurrent``, zero biases
    (``config.init == "fan_in"``: :func:`init_fan_in`)."""
    config = network.config
    if _fan_in(config):
        init_fan_in(network, recurrent)
        return
    for name, param in network.named_parameters():
        if name in recurrent:
            orthogonal_blocks(param, config.hidden_dim)
        elif _is_bias(name):
            nn.init.zeros_(param)
        else:
            nn.init.normal_(param, 0.0, config.init_std)
    zero_padding_rows(network.src_embed, network.tgt_embed)


def _fan_in(config) -> bool:
    """True for ``init="fan_in"``, False for the paper's ``"cho"``; anything else is refused."""
    if config.init not in ("cho", "fan_in"):
        raise ValueError(f"unknown init {config.init!r} (cho or fan_in)")
    return config.init == "fan_in"


def init_fan_in(network: nn.Module, recurrent: tuple[str, ...] = ()) -> None:
    """PyTorch's default scales (what a plain PyTorch model starts from), for every architecture:
    embeddings N(0, 1); each :class:`~torch.nn.Linear` weight and bias U(±1/√in_features); each
    :class:`~torch.nn.LSTM` parameter U(±1/√H); the ``recurrent`` matrices of the written-out
    GRUs orthogonal, one H x H block at a time. PAD rows 0."""
    config = network.config
    modules = dict(network.named_modules())
    for name, param in network.named_parameters():
        owner = modules[name.rpartition(".")[0]]
        if name in recurrent:
            orthogonal_blocks(param, config.hidden_dim)
        elif isinstance(owner, nn.Embedding):
            nn.init.normal_(param)
        elif isinstance(owner, nn.Linear):
            bound = 1.0 / owner.in_features**0.5
            nn.init.uniform_(param, -bound, bound)
        elif isinstance(owner, nn.GRU):
            _fused_gru_fan_in(name, param, owner)
        elif isinstance(owner, nn.RNNBase):
            bound = 1.0 / owner.hidden_size**0.5
            nn.init.uniform_(param, -bound, bound)
        else:  # pragma: no cover - a new kind of layer must choose its scale here
            raise ValueError(f"no fan-in initialisation for {name} ({type(owner).__name__})")
    zero_padding_rows(network.src_embed, network.tgt_embed)


def init_lstm(network: nn.Module) -> None:
    """Sutskever et al. (2014) §3.4: U(±init_uniform) for every parameter, else N(0, init_std²)
    weights and zero biases."""
    config = network.config
    if _fan_in(config):
        init_fan_in(network)
        return
    bound = config.init_uniform
    for name, param in network.named_parameters():
        if bound is not None:
            nn.init.uniform_(param, -bound, bound)
        elif "bias" in name:
            nn.init.zeros_(param)
        else:
            nn.init.normal_(param, 0.0, config.init_std)
    zero_padding_rows(network.src_embed, network.tgt_embed)


def init_attention(network: nn.Module, recurrent: tuple[str, ...]) -> None:
    """Bahdanau et al. (2015) App. B.1 (see the module docstring); ``config.init == "fan_in"``:
    :func:`init_fan_in`."""
    config = network.config
    if _fan_in(config):
        init_fan_in(network, recurrent)
        return
    for name, param in network.named_parameters():
        if _is_bias(name) or name.startswith("att_v."):
            nn.init.zeros_(param)
        elif name in recurrent:
            orthogonal_blocks(param, config.hidden_dim)
        elif name.startswith(("att_state.", "att_annotation.")):
            nn.init.normal_(param, 0.0, ATTENTION_INIT_STD)
        else:
            nn.init.normal_(param, 0.0, config.init_std)
    zero_padding_rows(network.src_embed, network.tgt_embed)


def init_transformer(network: nn.Module) -> None:
    """The Transformer's start (see the module docstring), whatever ``config.init`` says."""
    dim = network.config.hidden_dim
    modules = dict(network.named_modules())
    for name, param in network.named_parameters():
        owner = modules[name.rpartition(".")[0]]
        if isinstance(owner, nn.Embedding):
            nn.init.normal_(param, 0.0, dim**-0.5)
        elif isinstance(owner, nn.LayerNorm) and name.endswith(".weight"):
            nn.init.ones_(param)
        elif param.dim() > 1:
            nn.init.xavier_uniform_(param)
        else:
            nn.init.zeros_(param)
    zero_padding_rows(network.src_embed, network.tgt_embed)


def init_cslm(network: nn.Module) -> None:
    """Embeddings N(0, init_std²); hidden layers He-uniform (rectifiers); zero biases."""
    std = network.config.init_std
    nn.init.normal_(network.embed.weight, 0.0, std)
    zero_padding_rows(network.embed)
    for module in network.hidden:
        if isinstance(module, nn.Linear):
            nn.init.kaiming_uniform_(module.weight, nonlinearity="relu")
            nn.init.zeros_(module.bias)
    nn.init.normal_(network.output.weight, 0.0, std)
    nn.init.zeros_(network.output.bias)


def init_self_normalized(network: nn.Module) -> None:
    """Lower every output bias of ``out_vocab`` by log V (V target words), so that the softmax's
    log Z starts near 0 instead of near log V (small logits: Z ≈ V e^(-log V) = 1).

    Our addition to Devlin et al. (2014): otherwise α (log Z)² starts at α (log V)² (8.5 nats a
    token for α = 0.1 and 11,000 words), its gradient dominates the clipped gradient of the
    first updates, and a short training ends with a clearly higher perplexity (docs/benchmarks.md:
    Self-normalised output layer). It changes no probability: softmax is shift-invariant.
    """
    layer = network.out_vocab
    with torch.no_grad():
        layer.bias.sub_(math.log(layer.out_features))
