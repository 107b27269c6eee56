"""The output layer's kernels: what every network computes on top of its features.

The last layer of each network is a softmax over the target vocabulary,
``p(y_t | y_<t, x) = exp(u_{y_t}) / Z``, ``u = W f + b`` (``logits``), ``Z = Σ_v exp(u_v)``
(Cho et al. 2014, A.1.2; Bahdanau et al. 2015, A.2.2). Here, written once for all networks:

* the training loss -Σ_t log p(y_t | y_<t, x) (Cho et al. 2014, eq. 3) and log Z per token
  (Devlin et al. 2014, §2.1, for self-normalisation), with its own gradient
  (:func:`token_nll`, :class:`_TokenNLL`);
* scoring's log p(y_t | y_<t, x) = u_{y_t} - log Z (eq. 4's factors) over row chunks, the
  log-sum-exp and the reference word's logit in one pass (:func:`target_logprobs`,
  :func:`fused_logsumexp_gather`), compiled on a GPU where torch.compile works
  (:func:`_run_kernel`);
  without a host sync for the CUDA-graph engine (``sync_free``);
* the vocabulary projection u = W f + b itself, on CUDA over a vocabulary padded to a multiple
  of :data:`CUDA_VOCAB_ALIGNMENT` words (:func:`vocabulary_logits`);
* the layers under the softmax: maxout (Goodfellow et al. 2013; Cho et al. A.1.2, Bahdanau et
  al. A.2.2: :func:`maxout`) and its pre-activation, a sum of linear maps (:func:`summed_linear`).

The networks and their contract are :mod:`phrasescore.model.base`.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger(__name__)

CUDA_VOCAB_ALIGNMENT = 8
"""On CUDA the vocabulary projection runs over a vocabulary padded to a multiple of this many
words. cuBLAS takes its fast kernels (sm80/sm90 tensor-core tiles) only where every matrix's
leading dimension is a multiple of 16 bytes: [rows x V] logits with V not a multiple of 8 words
(bf16) or 4 (fp32) fall back to kernels that read one element at a time (``..._align1``), the
largest share of a scoring batch's GPU time where they ran (docs/benchmarks.md, "the engine and
the trainer measured")."""


def vocabulary_logits(layer: nn.Linear, features: Tensor, align: int | None = None) -> Tensor:
    """u = W f + b (the output layer's logits, Cho et al. 2014, A.1.2; Bahdanau et al. 2015,
    A.2.2) of ``features`` [..., R] over the ``layer``'s V words: [..., V].

    On CUDA (or with ``align`` given) a V that is not a multiple of ``align`` (default
    :data:`CUDA_VOCAB_ALIGNMENT`) is padded: the product runs on W and b with zero rows added
    up to the next multiple, and the result is the first V columns of it, a view whose rows
    are aligned. Every logit is the same dot product; the gradient flows back through the view
    and the padding to W and b (the padded rows' share is dropped). Elsewhere, ``layer`` itself:
    the CPU's bytes never change."""
    vocab = layer.out_features
    if align is None:
        align = CUDA_VOCAB_ALIGNMENT if features.is_cuda else 1
    pad = -vocab % align
    if pad == 0:
        return layer(features)
    weight = F.pad(layer.weight, (0, 0, 0, pad))
    bias = None if layer.bias is None else F.pad(layer.bias, (0, pad))
    return F.linear(features, weight, bias)[..., :vocab]


class _TokenNLL(torch.autograd.Function):
    """Summed NLL and log Z of logit rows, with the softmax gradient written in one buffer.

    Forward: log Z_i = logsumexp_v u_iv, NLL = Σ_i w_i (log Z_i - u_{i,gold_i}), the row weights
    w_i 1 unless given (0 at a padded position: every row of a fixed-shape batch enters, the
    padded ones with no weight). Backward, for the incoming gradients g (of the NLL, a scalar)
    and g_i (of log Z_i, for self-normalisation)::

        ∂/∂u_iv = softmax(u_i)_v (g w_i + g_i) - g w_i [v = gold_i]

    as exp(u - log Z) scaled, in float32 and written in the logits' dtype (bf16 logits of
    autocast get a bf16 gradient, so the output layer's backward products stay in bf16), the
    gold words' entries then written again with -g: the [N x V] tensors that
    ``cross_entropy`` makes (the log-softmax output, the one-hot gradient, the log-softmax
    backward's) are never written. Vocabularies from :data:`FUSED_MIN_VOCAB` words take two
    compiled kernels (:func:`log_z_rows`, :func:`_scaled_softmax`), else the same
    formulas eagerly. Same values as ``cross_entropy``'s (fp32: within 1e-6).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, gold: Tensor, weights: Tensor | None) -> tuple[Tensor, Tensor]:
        log_z = log_z_rows(logits)
        gold_logit = _widened(logits.gather(1, gold[:, None])).squeeze(1)
        if weights is None:
            nll = log_z.sum() - gold_logit.sum()
        else:
            nll = ((log_z - gold_logit) * weights).sum()
        ctx.save_for_backward(logits, log_z, gold, weights)
        return nll, log_z

    @staticmethod
    def backward(ctx, grad_nll: Tensor, grad_log_z: Tensor) -> tuple[Tensor, None, None]:
        logits, log_z, gold, weights = ctx.saved_tensors
        grad_gold, scale = row_scales(grad_nll, grad_log_z, weights, log_z.shape)
        grad = _run_kernel(_scaled_softmax, logits.shape[1], logits, log_z, scale)
        # the gold entries again in float32, minus g w_i, written once by indexing (one word
        # per row; scatter_ and scatter_add_ of bf16 copy the whole gradient on the CPU:
        # docs/benchmarks.md, "bf16 output layer on the CPU")
        rows = torch.arange(gold.shape[0], device=gold.device)
        at_gold = torch.exp(_widened(logits[rows, gold]) - log_z) * scale - grad_gold
        grad[rows, gold] = at_gold.to(grad.dtype)
        return grad, None, None


def row_scales(
    grad_nll: Tensor, grad_log_z: Tensor | None, weights: Tensor | None, shape
) -> tuple[Tensor, Tensor]:
    """(g w_i, g w_i + g_i) per row: the gold word's share and the softmax's scale of a row's
    logit gradient, for the NLL's gradient g, log Z's g_i (None: 0) and the row weights w_i
    (None: 1)."""
    grad_gold = grad_nll.expand(shape) if weights is None else grad_nll * weights
    scale = grad_gold if grad_log_z is None else grad_gold + grad_log_z
    return grad_gold, scale.contiguous()


def token_nll(logits: Tensor, gold: Tensor, weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(Σ_i w_i (-log softmax(logits_i)[gold_i]), log Z [N], both float32) for logit rows
    [N, V] (float32, or bf16 under autocast) and row weights ``weights`` [N] (None: 1): the
    training loss of every architecture (Cho et al. 2014, eq. 3), with a gradient that costs
    about half of ``cross_entropy``'s (:class:`_TokenNLL`). With weights 0 at padded positions
    every row of a fixed-shape batch enters and the padded ones count for nothing (the captured
    training step: :mod:`phrasescore.training.captured_step`)."""
    return _TokenNLL.apply(logits, gold, weights)


LOGIT_CHUNK_ELEMENTS = 1 << 21
"""Logits per row chunk when the caller names no chunk (128 rows of a 15,000-word vocabulary): a
chunk's logits stay in the cache; larger chunks slow the log-softmax per row
(docs/benchmarks.md, "The output layer")."""
FUSED_MIN_VOCAB = 1024
"""Vocabularies from this size use the compiled one-pass kernel on a GPU
(:func:`fused_logsumexp_gather`); tiny ones take the eager kernel and pay no compilation."""


SHIFT_COLUMNS = 512
"""The log-sum-exp is shifted by the row's largest logit among its first this-many words."""


def _widened(logits: Tensor) -> Tensor:
    """The logits in float32 (bf16 and fp16 widened; float64 kept, for gradient checks)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _log_z_rows(logits: Tensor) -> Tensor:
    """log Z_i = log Σ_v exp(u_iv) in float32, shifted by the row's largest logit among its first
    :data:`SHIFT_COLUMNS` (one pass over the row; see :func:`_lse_gather`). Not finite where a
    logit outside the head exceeds that shift by more than fp32's exp range; the caller
    recomputes those rows."""
    x = _widened(logits)
    shift = x[:, :SHIFT_COLUMNS].amax(1, keepdim=True)
    return shift.squeeze(1) + torch.exp(x - shift).sum(1).log()


def _exact_log_z_rows(logits: Tensor) -> Tensor:
    """log Z_i in float32 shifted by the row's maximum: finite for any finite logits (two
    reductions over the row in one compiled kernel; nothing to look at afterwards)."""
    x = _widened(logits)
    shift = x.amax(1, keepdim=True)
    return shift.squeeze(1) + torch.exp(x - shift).sum(1).log()


def log_z_rows(logits: Tensor) -> Tensor:
    """log Z_i = log Σ_v exp(u_iv) in float32 of logit rows [N, V], the training loss's
    normaliser. On the CPU one pass shifted by the head's maximum (:func:`_log_z_rows`; the rare
    rows where that overflows computed again); on a GPU the row's maximum
    (:func:`_exact_log_z_rows`): there a look at which rows overflowed would make the host wait
    for the device every step, and the second pass over a row costs less than the wait."""
    if logits.device.type != "cpu":
        return _run_kernel(_exact_log_z_rows, logits.shape[1], logits)
    log_z = _run_kernel(_log_z_rows, logits.shape[1], logits)
    missed = ~torch.isfinite(log_z)
    if missed.any():  # a logit far above the head's maximum (see _log_z_rows): two passes
        log_z[missed] = _log_z_rows_eager(logits[missed])
    return log_z


def _scaled_softmax(logits: Tensor, log_z: Tensor, scale: Tensor) -> Tensor:
    """softmax(u_i)_v scale_i = exp(u_iv - log Z_i) scale_i in float32, written in the logits'
    dtype: the gradient of :class:`_TokenNLL` before its gold-word term."""
    return (torch.exp(_widened(logits) - log_z[:, None]) * scale[:, None]).to(logits.dtype)


def _lse_gather(logits: Tensor, gold: Tensor) -> Tensor:
    """``logits[i, gold[i]] - logsumexp(logits[i])`` in float32 (bf16 logits are read as such).

    log Σ_v exp(u_v) = m + log Σ_v exp(u_v - m) holds for any m; m is usually the row's
    maximum, which costs a pass over the whole row before the one that sums. Here m is the
    maximum of the first :data:`SHIFT_COLUMNS` logits (the most frequent words: vocabularies
    are sorted by frequency): one pass over the row instead of two (docs/benchmarks.md, "The
    engine with `--threads 1`"). The sum is >= 1 (its largest term is exp(0)), so it cannot
    underflow; where a logit outside the head exceeds m by more than fp32's exp range (~88) the
    result is not finite, and :func:`fused_logsumexp_gather` computes that row again the usual
    way.
    """
    x = logits.float()
    return x.gather(1, gold[:, None]).squeeze(1) - _log_z_rows(x)


def _exact_lse_gather(logits: Tensor, gold: Tensor) -> Tensor:
    """``logits[i, gold[i]] - logsumexp(logits[i])`` in float32, shifted by the row's maximum:
    finite for any finite logits, so nothing is looked at afterwards (no host sync on a GPU;
    :func:`target_logprobs`'s ``sync_free``). Two reductions over the row in one compiled kernel."""
    x = logits.float()
    return x.gather(1, gold[:, None]).squeeze(1) - _exact_log_z_rows(x)


def _eager_lse_gather(logits: Tensor, gold: Tensor) -> Tensor:
    """The eager equivalent: PyTorch's log-softmax (float32 accumulation) and a gather."""
    logp = torch.log_softmax(logits, dim=1, dtype=torch.float32)
    return logp.gather(1, gold[:, None]).squeeze(1)


def _log_z_rows_eager(logits: Tensor) -> Tensor:
    return torch.logsumexp(_widened(logits), dim=1)


def _scaled_softmax_eager(logits: Tensor, log_z: Tensor, scale: Tensor) -> Tensor:
    grad = torch.sub(_widened(logits), log_z[:, None]).exp_().mul_(scale[:, None])
    return grad.to(logits.dtype)


_EAGER = {
    _lse_gather: _eager_lse_gather,
    _exact_lse_gather: _eager_lse_gather,
    _log_z_rows: _log_z_rows_eager,
    _exact_log_z_rows: _log_z_rows_eager,
    _scaled_softmax: _scaled_softmax_eager,
}
"""The eager kernel that computes what each compiled one computes (PyTorch's own two-pass
reductions, in place where it can), for small vocabularies and machines without a compiler."""

_compiled: dict[object, object] = {}


def _run_kernel(kernel, vocab: int, *args: Tensor) -> Tensor:
    """``kernel(*args)`` compiled by torch.compile (one pass over the [rows x vocabulary]
    logits, nothing of that size written but the result) for logits on a GPU, where it
    compiles; else its eager equivalent (:data:`_EAGER`): on the CPU, for vocabularies under
    :data:`FUSED_MIN_VOCAB`, and with ``PHRASESCORE_NO_COMPILE=1``.

    On a GPU the logits' memory traffic is what the one pass saves. On the CPU the compiled
    kernel scored no faster than PyTorch's log-softmax (rescore, a 15,000-word vocabulary) and
    its compilation and imports cost seconds in every process (docs/benchmarks.md, "The output
    layer"). The first call per kernel and dtype compiles (cached on disk by PyTorch
    afterwards). Compiled and eager agree within ~2e-6 per token; one device always takes the
    same one, so the same input and flags give the same bytes.
    """
    eager = _EAGER[kernel]
    if vocab < FUSED_MIN_VOCAB or not args[0].is_cuda or os.environ.get("PHRASESCORE_NO_COMPILE"):
        return eager(*args)
    fn = _compiled.get(kernel)
    if fn is None:
        try:
            fn = torch.compile(kernel, dynamic=True)
        except Exception as exc:  # noqa: BLE001 - any failure means: no compiler here
            log.info("torch.compile unavailable (%s); eager output layer", exc)
            fn = False
        _compiled[kernel] = fn
    if fn is False:
        return eager(*args)
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001
        log.warning("compiled output layer failed (%s); using the eager kernels", exc)
        _compiled[kernel] = False
        return eager(*args)


def fused_logsumexp_gather(logits: Tensor, gold: Tensor) -> Tensor:
    """log softmax(logits_i)[gold_i] in float32: :func:`_lse_gather` as one compiled kernel
    (one read of the logits, log-sum-exp and the gold entry, nothing [rows x vocabulary]
    written), else PyTorch's log-softmax and a gather (:func:`_run_kernel`)."""
    values = _run_kernel(_lse_gather, logits.shape[1], logits, gold)
    overflow = ~torch.isfinite(values)
    if overflow.any():  # a logit far above the shift (see _lse_gather): the exact two passes
        values[overflow] = _eager_lse_gather(logits[overflow], gold[overflow])
    return values


def target_logprobs(
    logits_of,
    rows: Tensor,
    gold: Tensor,
    vocab: int,
    chunk_rows: int | None = None,
    sync_free: bool = False,
) -> Tensor:
    """log p(gold[i] | rows[i]) = u_{gold[i]} - log Σ_v exp(u_v) in float32 (eq. 4's factors)
    for feature rows [N, R] and the vocabulary projection ``logits_of`` onto ``vocab`` words
    (bf16 products accumulated in fp32 by the matrix library where rows are bf16): the output
    layer without the [N x vocabulary] logits, over row chunks of ``chunk_rows`` (default:
    :data:`LOGIT_CHUNK_ELEMENTS` logits a chunk), so that its peak memory is one chunk's logits
    whatever N. Per chunk one logit product, then the log-sum-exp and the gather of the
    reference word in one pass: :func:`fused_logsumexp_gather` (shifted by the head's maximum,
    overflowing rows computed again), or with ``sync_free`` :func:`_exact_lse_gather` (shifted
    by the row's maximum: no boolean selection and no look at a value, so that a GPU runs it
    without waiting on the host and a CUDA graph can hold it).
    """
    values = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
    if rows.shape[0] == 0:
        return values
    chunk = chunk_rows or max(16, LOGIT_CHUNK_ELEMENTS // vocab)
    for begin in range(0, rows.shape[0], chunk):
        end = min(begin + chunk, rows.shape[0])
        logits = logits_of(rows[begin:end])
        if sync_free:
            values[begin:end] = _run_kernel(_exact_lse_gather, vocab, logits, gold[begin:end])
        else:
            values[begin:end] = fused_logsumexp_gather(logits, gold[begin:end])
    return values


OUTPUT_KERNELS = ("torch", "liger", "cce")
"""The output layer's kernels for log p of the reference words: ``torch`` (:func:`target_logprobs`,
row chunks, everywhere) and, on CUDA where the package is importable, liger-kernel's fused linear
cross-entropy or Apple's cut-cross-entropy (Triton kernels: the product, the log-sum-exp and the
gather without the [rows x vocabulary] logits in memory). tools/gpu-score measures each."""

OUTPUT_KERNEL_PACKAGES = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}
"""The Python package each library kernel of :data:`OUTPUT_KERNELS` imports."""


def library_gold_logprobs(kernel: str, features: Tensor, layer: nn.Linear, gold: Tensor) -> Tensor:
    """log p(gold[i] | features[i]) = -CE(layer(features_i), gold_i) in float32 from a fused
    linear cross-entropy library (``kernel``: ``liger`` or ``cce``; :data:`OUTPUT_KERNELS`),
    with per-row losses (``reduction="none"``). cut-cross-entropy takes no bias: the bias is its
    classifier's last column, the features' a column of ones (padded with zeros to a multiple
    of 16 columns), the same sums. ImportError where the package is missing."""
    if kernel == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        loss = liger_fused_linear_cross_entropy(
            features, layer.weight, gold, layer.bias, reduction="none"
        )
        return -loss.float()
    if kernel == "cce":
        from cut_cross_entropy import linear_cross_entropy

        weight, bias = layer.weight, layer.bias
        if bias is not None:
            width = -(-(weight.shape[1] + 1) // 16) * 16
            pad = width - weight.shape[1] - 1
            ones = features.new_ones(features.shape[0], 1)
            features = torch.cat([features, ones, features.new_zeros(features.shape[0], pad)], 1)
            extra = [bias[:, None].to(weight.dtype), weight.new_zeros(weight.shape[0], pad)]
            weight = torch.cat([weight, *extra], 1)
        loss = linear_cross_entropy(features, weight, gold, reduction="none")
        return -loss.float()
    raise ValueError(f"unknown output kernel {kernel!r} (one of {', '.join(OUTPUT_KERNELS)})")


def maxout(x: Tensor, pool: int = 2) -> Tensor:
    """Maxout over groups of ``pool`` consecutive units (Goodfellow et al. 2013), as in Cho et al.

    Pools of 2 (both papers') take the larger of the even and the odd units, one elementwise
    pass, faster than a reduction over a last dimension of 2 (docs/benchmarks.md, "The output
    layer")."""
    if pool == 2:
        return torch.maximum(x[..., 0::2], x[..., 1::2])
    return x.unflatten(-1, (x.shape[-1] // pool, pool)).amax(dim=-1)


def summed_linear(terms: list[tuple[nn.Linear, Tensor]], extra: Tensor | None = None) -> Tensor:
    """``Σ_k layer_k(x_k) + extra`` for inputs [..., in_k] with the same leading dimensions
    (``extra`` broadcasts against them, e.g. a per-sequence term [B, 1, out] over [B, T, out]).

    The maxout layers' pre-activations (Cho et al. A.1.2, Bahdanau et al. A.2.2) are such sums.
    Each product after the first adds onto the sum inside the matrix product (``addmm``'s input
    term) instead of in a separate pass over [tokens x out] (docs/benchmarks.md, "The engine with
    `--threads 1`"). Only the first layer may have a bias.
    """
    (first, x0), rest = terms[0], terms[1:]
    lead = x0.shape[:-1]
    width = first.out_features
    flat = x0.reshape(-1, x0.shape[-1])
    if first.bias is not None:
        total = torch.addmm(first.bias, flat, first.weight.t())
    else:
        total = flat @ first.weight.t()
    if extra is not None:
        total = (total.view(*lead, width) + extra).view(-1, width)
    for layer, x in rest:
        if layer.bias is not None:
            raise ValueError("summed_linear: only the first layer may have a bias")
        total = torch.addmm(total, x.reshape(-1, x.shape[-1]), layer.weight.t())
    return total.view(*lead, width)


class _ChunkedOutputNLL(torch.autograd.Function):
    """:func:`token_nll` of the logits ``features @ weight.T + bias`` computed row chunk by row
    chunk, the vocabulary projection included: forward keeps log Z and the features, never the
    [N x V] logits; backward makes each chunk's logits again (one more product, the price of
    the memory) and its softmax gradient, and accumulates the gradients of the features, the
    weight and the bias. Products in the dtype autocast chose in forward (bf16 on a GPU), the
    log-sum-exp and the gradients' sums in float32."""

    @staticmethod
    def forward(ctx, features, weight, bias, gold, chunk_rows: int, weights=None):
        n = features.shape[0]
        log_z = torch.empty(n, dtype=torch.float32, device=features.device)
        gold_logit = torch.empty(n, dtype=torch.float32, device=features.device)
        dtype = None
        for begin in range(0, n, chunk_rows):
            end = min(n, begin + chunk_rows)
            logits = torch.nn.functional.linear(features[begin:end], weight, bias)
            dtype = logits.dtype
            log_z[begin:end] = log_z_rows(logits)
            gold_logit[begin:end] = _widened(logits.gather(1, gold[begin:end, None])).squeeze(1)
        ctx.save_for_backward(features, weight, bias, gold, log_z, weights)
        ctx.chunk_rows, ctx.dtype = chunk_rows, dtype or features.dtype
        terms = log_z - gold_logit
        return (terms if weights is None else terms * weights).sum(), log_z

    @staticmethod
    def backward(ctx, grad_nll, grad_log_z):
        features, weight, bias, gold, log_z, weights = ctx.saved_tensors
        dtype, chunk_rows = ctx.dtype, ctx.chunk_rows
        gold_all, scale_all = row_scales(grad_nll, grad_log_z, weights, log_z.shape)
        w = weight.to(dtype)
        grad_f = torch.empty_like(features)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        grad_b = None if bias is None else torch.zeros(bias.shape, dtype=torch.float32,
                                                       device=bias.device)  # fmt: skip
        for begin in range(0, features.shape[0], chunk_rows):
            end = min(features.shape[0], begin + chunk_rows)
            f = features[begin:end].to(dtype)
            logits = torch.nn.functional.linear(f, w, None if bias is None else bias.to(dtype))
            scale = scale_all[begin:end].contiguous()
            grad = _run_kernel(_scaled_softmax, logits.shape[1], logits, log_z[begin:end], scale)
            rows = torch.arange(end - begin, device=gold.device)
            g = gold[begin:end]
            at_gold = (
                torch.exp(_widened(logits[rows, g]) - log_z[begin:end]) * scale
                - gold_all[begin:end]
            )
            grad[rows, g] = at_gold.to(grad.dtype)
            grad_f[begin:end] = (grad @ w).to(grad_f.dtype)
            grad_w += (grad.t() @ f).float()
            if grad_b is not None:
                grad_b += grad.float().sum(0)
        return (
            grad_f,
            grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
        )


def chunked_output_nll(
    features: Tensor,
    layer: nn.Linear,
    gold: Tensor,
    chunk_rows: int | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`token_nll` of ``layer(features)`` (row weights ``weights`` as there) without the
    [N x V] logits in memory: the vocabulary projection and the loss fused over row chunks
    (:class:`_ChunkedOutputNLL`; ``train --chunked-output``). Default chunk:
    :data:`LOGIT_CHUNK_ELEMENTS` logits."""
    vocab = layer.out_features
    chunk = chunk_rows or max(16, LOGIT_CHUNK_ELEMENTS // vocab)
    return _ChunkedOutputNLL.apply(features, layer.weight, layer.bias, gold, chunk, weights)
