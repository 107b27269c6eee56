"""The one interface every architecture implements, and what is computed on top of it.

An architecture is a module with four methods; everything else (training loss, scoring, beam
search, sampling) is written once, here and in ``phrasescore.engine.scoring``/``phrasescore.engine.search``,
on the output layer's kernels (the softmax's loss, log-sum-exp and maxout:
:mod:`phrasescore.model.output_layer`):

``encode(src, src_lengths) -> dict[str, Tensor]``
    The encoder's summary of each source, every tensor with the batch first, so that rows can be
    selected or repeated for many targets of one source (:func:`select_rows`). ``src_lengths``
    None: every row is ``src.shape[1]`` positions long, taken without looking
    (:func:`padded_lengths`).
``decode_features(enc, tgt_in) -> Tensor [B, T, R]``
    Teacher-forced decoding: the output-layer features for every target position, given the
    previous words ``tgt_in`` (BOS first).
``start(enc) -> dict`` and ``step(state, prev) -> (features [B, R], state)``
    The same decoder one step at a time, for generation.
``logits(features) -> Tensor [N, V]``
    The last (vocabulary) projection; kept separate so that scoring can compute the softmax in
    row chunks and never hold a [tokens, vocabulary] matrix for a whole batch. It is the linear
    layer ``out_vocab`` (logits = W f + b) in every architecture: self-normalised scoring
    (:meth:`EncoderDecoder.target_logits`) reads single rows of it.
``POSITIONAL_OUTPUTS``
    The keys of ``encode``'s output that hold one entry per source position ([B, S, ...]);
    every other tensor is one vector per source. :meth:`EncoderDecoder.concat_encodings` pads
    exactly those when encodings of different source lengths are joined (as fairseq's
    ``reorder_encoder_out`` makes reordering an architecture's own business).

p(y | x) = Π_t p(y_t | y_<t, x) (Cho et al. 2014, eq. 4); log p sums over target tokens including
the end-of-sequence symbol.

Self-normalisation (Devlin et al. 2014, "Fast and Robust Neural Network Joint Models for
Statistical Machine Translation", §2.1): with ``config.self_normalize`` = α > 0 the training
objective adds α (log Z(x, y_<t))² per target token, Z being the softmax's normaliser Σ_v exp(u_v),
so that log Z stays near 0 and log p(y_t | y_<t, x) ≈ u_{y_t}, the target word's logit alone.
Scoring can then skip the softmax: :meth:`EncoderDecoder.target_logits` computes one row of the
output matrix per token instead of the whole vocabulary.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch import Tensor, nn

from phrasescore.model.config import ModelConfig
from phrasescore.model.output_layer import (
    chunked_output_nll,
    library_gold_logprobs,
    target_logprobs,
    token_nll,
    vocabulary_logits,
)

EncoderOutput = dict[str, Tensor]


def bf16_autocast(device: torch.device, enabled: bool, cache: bool = True):
    """bf16 autocast on ``device`` where ``enabled``; otherwise nothing: the caller's precision
    stays, including a whole-network autocast around it (an autocast block entered with
    ``enabled=False`` would switch that off, and bf16 activations would meet fp32 weights).
    ``cache`` False: no bf16 copies of the weights kept across the block's operations, as
    inside a CUDA graph capture (PyTorch's CUDA graphs documentation: autocast's cache would
    hold copies made during the capture)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache)


class LossTerms(NamedTuple):
    """A batch's training loss, summed over its real target tokens (the caller divides)."""

    objective: Tensor
    """What is minimised: the NLL plus α Σ_t (log Z_t)² when the model self-normalises."""
    nll: Tensor
    """The summed negative log-likelihood alone (detached): what perplexity is made of."""
    abs_log_z: Tensor | None
    """Σ_t |log Z_t| (detached) when asked for or when α > 0, else None."""


class EncoderDecoder(nn.Module):
    """Base class of the architectures (see the module docstring for the contract)."""

    config: ModelConfig
    POSITIONAL_OUTPUTS: tuple[str, ...] = ()
    """Keys of the encoder output indexed by source position (see the module docstring)."""
    compiled: bool = False
    """``train --compile``: the written-out recurrences' steps run through torch.compile
    (:meth:`compile_steps`)."""

    chunked_output: bool = False
    """``train --chunked-output``: the loss's vocabulary projection and log-sum-exp fused over
    row chunks (:func:`~phrasescore.model.output_layer.chunked_output_nll`), no [tokens x
    vocabulary] logits kept for the backward."""

    def compile_steps(self) -> None:
        """Run the written-out recurrences' steps (the GRU of eq. 5-8, the attention decoder's
        step) through :func:`torch.compile`: the same equations in a few fused kernels per
        step (``train --compile``). Networks whose recurrences are torch.nn modules (the LSTM,
        ``--recurrence fused``'s GRUs: cuDNN's kernels already) keep those."""
        self.compiled = True

    def encode(self, src: Tensor, src_lengths: Tensor | None) -> EncoderOutput:
        raise NotImplementedError

    def decode_features(self, enc: EncoderOutput, tgt_in: Tensor) -> Tensor:
        raise NotImplementedError

    def start(self, enc: EncoderOutput) -> dict[str, Tensor]:
        raise NotImplementedError

    def step(self, state: dict[str, Tensor], prev: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError

    def logits(self, features: Tensor) -> Tensor:
        """u = W f + b over the target vocabulary ([..., V] for features [..., R]): every
        architecture's last layer ``out_vocab`` (:func:`~phrasescore.model.output_layer.
        vocabulary_logits`, aligned for cuBLAS on CUDA)."""
        return vocabulary_logits(self.out_vocab, features)

    def scoring_flops(self, src_len: float, tgt_len: float, share: float = 1.0) -> float:
        """Analytic FLOPs to score one pair (for benchmarks); see the architectures."""
        raise NotImplementedError

    def summary_vector(self, enc: EncoderOutput) -> Tensor:
        """The fixed-length representation of each source (used by analyses)."""
        raise NotImplementedError

    def source_terms(self, enc: EncoderOutput) -> EncoderOutput:
        """Decoder terms that depend on the source alone (per-source vectors, batch first), to
        add to an encoding *before* its rows are repeated for many targets: :meth:`start` then
        reads them instead of computing them once per target. None by default."""
        return {}

    # ------------------------------------------------------------------ written once for all
    def concat_encodings(self, encodings: list[EncoderOutput], width: int = 0) -> EncoderOutput:
        """Encoder outputs joined along the batch; the :attr:`POSITIONAL_OUTPUTS` are padded to
        the longest source (at least ``width`` positions) first (0, or False for a mask),
        per-source vectors never are."""
        positional = self.POSITIONAL_OUTPUTS
        longest = max((e[k].shape[1] for e in encodings for k in positional), default=0)
        longest = max(longest, width) if positional else 0
        if len(encodings) == 1 and all(encodings[0][k].shape[1] == longest for k in positional):
            return encodings[0]
        merged: dict[str, list[Tensor]] = {k: [] for k in encodings[0]}
        for enc in encodings:
            for key, value in enc.items():
                if key in positional and value.shape[1] < longest:
                    shape = list(value.shape)
                    shape[1] = longest - value.shape[1]
                    value = torch.cat([value, value.new_zeros(shape)], dim=1)
                merged[key].append(value)
        return {k: torch.cat(v) for k, v in merged.items()}

    def loss(
        self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor, tgt_mask: Tensor
    ) -> Tensor:
        """The summed training objective of the real target tokens (the mean is taken by the
        caller): the NLL, plus α Σ_t (log Z_t)² when ``config.self_normalize`` = α > 0."""
        return self.loss_terms(src, src_lengths, tgt_in, tgt_out, tgt_mask).objective

    def loss_terms(
        self,
        src: Tensor,
        src_lengths: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor,
        tgt_mask: Tensor,
        log_z: bool = False,
        bf16_output: bool = False,
    ) -> LossTerms:
        """The objective, the NLL alone and (``log_z`` or α > 0) Σ_t |log Z_t|, summed over the
        real target tokens: ``tgt_mask`` True at them, or their flat positions (row-major, made
        on the host: :meth:`~phrasescore.text.corpus.Batch.with_positions`), which select the
        same rows in the same order without the host waiting for a mask on a GPU, or a float
        weight per position (1 at them, 0 at padding), with which every position of the batch
        enters the output layer and the padded ones count for nothing: shapes that do not
        depend on the batch's values, as a captured CUDA graph needs
        (:mod:`phrasescore.training.captured_step`).

        NLL: -Σ_t log p(y_t | y_<t, x) (Cho et al. 2014, eq. 3, summed). Self-normalisation
        (Devlin et al. 2014, §2.1): objective = NLL + α Σ_t (log Z_t)², log Z_t = logsumexp of
        the logits at step t, α = ``config.self_normalize``. Perplexity is made of the NLL alone.

        ``bf16_output``: the vocabulary projection (the [tokens x vocabulary] product and its
        gradients) under bf16 autocast, the recurrences in the caller's precision; the
        log-sum-exp and the softmax gradient are computed in float32 either way (:func:`token_nll`).
        """
        enc = self.encode(src, src_lengths)
        features = self.decode_features(enc, tgt_in)
        weights = tgt_mask.reshape(-1) if tgt_mask.is_floating_point() else None
        if weights is None:
            flat = real_positions(features, tgt_mask)
            gold = real_positions(tgt_out, tgt_mask)
        else:
            flat = features.reshape(-1, features.shape[-1])
            gold = tgt_out.reshape(-1)
        if self.chunked_output:
            with bf16_autocast(flat.device, bf16_output):
                nll, lz = chunked_output_nll(flat, self.out_vocab, gold, weights=weights)
        else:
            with bf16_autocast(flat.device, bf16_output):
                logits = self.logits(flat)
            nll, lz = token_nll(logits, gold, weights)
        alpha = float(self.config.self_normalize)
        if not (alpha or log_z):
            return LossTerms(nll, nll.detach(), None)
        if weights is not None:  # padded positions' log Z neither penalised nor reported
            lz = lz * weights
        objective = nll + alpha * lz.square().sum() if alpha else nll
        return LossTerms(objective, nll.detach(), lz.detach().abs().sum())

    def target_logits(self, features: Tensor, gold: Tensor) -> Tensor:
        """u_{gold[i]} = W[gold[i]] · features[i] + b[gold[i]] in float32, for feature rows
        [N, R]: the logit of each reference word alone, never the [N x vocabulary] product.

        For a self-normalised model (Devlin et al. 2014, §2.1: log Z ≈ 0) this approximates
        log p(gold[i] | ...) = u_{gold[i]} - log Z; exactly, it is log p + log Z. The rows of
        the output matrix ``out_vocab`` (every architecture's last layer) are gathered and a
        row-wise dot product taken in float32 (bf16 rows are read as such).
        """
        layer: nn.Linear = self.out_vocab
        weight = layer.weight.index_select(0, gold).float()
        values = (features.float() * weight).sum(1)
        if layer.bias is not None:
            values = values + layer.bias.index_select(0, gold).float()
        return values

    @torch.no_grad()
    def token_logprobs(
        self,
        enc: EncoderOutput,
        tgt_in: Tensor,
        tgt_out: Tensor,
        tgt_mask: Tensor | None = None,
        chunk_rows: int | None = None,
        self_normalized: bool = False,
    ) -> Tensor:
        """log p(y_t | y_<t, x) for every target position [B, T] (0 where ``tgt_mask`` is False).

        No gradients (scoring only; training takes :meth:`loss`). The output layer runs over row
        chunks of the real tokens only (:func:`target_logprobs`): per chunk the logits, then the
        log-sum-exp over the vocabulary and the reference word's logit in one pass, in float32,
        never a [rows x vocabulary] log-softmax.

        ``self_normalized``: the reference word's logit alone (:meth:`target_logits`), the
        approximation log p ≈ u_{y_t} of a self-normalised model (Devlin et al. 2014, §2.1); no
        vocabulary-sized product at all. It may exceed 0; the caller clamps what it needs to.
        """
        features = self.decode_features(enc, tgt_in)
        out = torch.zeros(tgt_out.shape, dtype=torch.float32, device=tgt_out.device)
        if tgt_mask is None:
            rows = features.reshape(-1, features.shape[-1])
            gold = tgt_out.reshape(-1)
        else:
            rows = features[tgt_mask]
            gold = tgt_out[tgt_mask]
        values = self.gold_logprobs(rows, gold, chunk_rows, self_normalized)
        if tgt_mask is None:
            out.view(-1).copy_(values)
        else:
            out[tgt_mask] = values
        return out

    def gold_logprobs(
        self,
        rows: Tensor,
        gold: Tensor,
        chunk_rows: int | None = None,
        self_normalized: bool = False,
        sync_free: bool = False,
        kernel: str = "torch",
    ) -> Tensor:
        """log p(gold[i] | rows[i]) in float32 for feature rows [N, R], the scoring modes written
        once for every engine. Exact: u_{gold[i]} - log Z over the vocabulary, row chunk by row
        chunk (``kernel`` "torch": :func:`~phrasescore.model.output_layer.target_logprobs`; a
        fused linear cross-entropy library on CUDA, ``liger`` or ``cce``:
        :func:`~phrasescore.model.output_layer.library_gold_logprobs`; ``sync_free``: nothing
        that makes a GPU wait for the host). Self-normalised: u_{gold[i]} alone
        (:meth:`target_logits`), the approximation log p ≈ u_{y_t} (Devlin et al. 2014, §2.1),
        which may exceed 0."""
        if self_normalized:
            return self.target_logits(rows, gold)
        if kernel != "torch":
            return library_gold_logprobs(kernel, rows, self.out_vocab, gold)
        vocab = self.config.tgt_vocab_size
        return target_logprobs(self.logits, rows, gold, vocab, chunk_rows, sync_free)


def real_positions(x: Tensor, where: Tensor) -> Tensor:
    """The entries of ``x`` [B, T, ...] at the real target positions, in row-major order:
    ``where`` a boolean mask [B, T], or the flat positions of its True entries (the same rows,
    gathered without a look at the mask)."""
    if where.dtype == torch.bool:
        return x[where]
    return x.reshape(-1, *x.shape[2:]).index_select(0, where)


def padded_lengths(lengths: Tensor | None, steps: int) -> Tensor | None:
    """``lengths`` when some row is shorter than ``steps`` positions, else None (no padding to
    mask or pack). ``lengths`` None is the caller's word that every row is full, taken without
    the check (the GPU engine encodes sources of one exact length and says so). On a GPU the
    lengths are taken as they are, without the check, which would make the host wait for the
    device: the rows are then masked (or packed) as if padded, which gives full rows the values
    they have unpadded (masked: the same floats; packed: up to cuDNN's rounding;
    tests/test_device_engine.py)."""
    if lengths is None:
        return None
    if lengths.device.type != "cpu":
        return lengths
    return lengths if bool((lengths != steps).any()) else None


def full_lengths(src: Tensor, lengths: Tensor | None) -> Tensor:
    """``lengths``, or (None: every row full) ``src.shape[1]`` for every row, made on the device."""
    if lengths is not None:
        return lengths
    return torch.full((src.shape[0],), src.shape[1], dtype=torch.long, device=src.device)


def select_rows(enc: EncoderOutput, index: Tensor) -> EncoderOutput:
    """Rows ``index`` of every tensor of an encoder output (to share one encoding among targets)."""
    return {key: value.index_select(0, index) for key, value in enc.items()}
