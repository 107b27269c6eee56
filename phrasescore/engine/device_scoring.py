"""The GPU engine: log p(target | source) of many pairs, each batch shape captured once in a
CUDA graph and replayed.

:class:`~phrasescore.engine.scoring.PairScorer` (the CPU's engine) computes the same scores; on
a GPU its loop of small kernels, its boolean selections and its checks of values make the host
wait for the device several times a batch. Here, for a block of pairs:

1. each *distinct* source is encoded once, in batches of one exact length (the encoder is told
   there is no padding: ``encode(src, None)``);
2. the pairs go in batches of a few fixed shapes (:class:`~phrasescore.engine.batching.
   FixedShapeBuckets`: target widths of a few bounds, rows a power of two; the attention
   model's annotations padded to a bound too); a batch is the decoder over every position,
   the output layer's logits in row chunks with the log-sum-exp and the reference word's logit
   in one kernel (:func:`~phrasescore.model.output_layer.padded_target_logprobs`: never a
   [tokens x vocabulary] matrix for the batch), the padded positions masked and each pair's sum
   taken: nothing in it reads a value back, so the GPU never waits on the host;
3. on CUDA each batch shape's work (the decoder and the output layer; the sources' encoder,
   large batches, runs as it is) is captured once in a CUDA graph (:class:`CapturedShapes`) and
   replayed: one launch a batch instead of a Python loop of small kernels per step. The
   recurrences are the models' own (the GRU of Cho et al. 2014, eq. 5-8, written out; the
   attention decoder; cuDNN's GRU or LSTM where the model has them), unchanged;
4. the scores stay on the device and come back in one copy per block.

The same function runs without capture on the CPU (how the tests check it) and where capture
is off (``graphs=False``, the figures' eager baseline). Scores equal PairScorer's within the
engine's tolerance (float32 sums over other batch shapes, and the log-sum-exp shifted by the
row's maximum: < 1e-4 in log p, tests/test_device_engine.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import torch

from phrasescore.bundle import TrainedModel
from phrasescore.engine.batching import (
    Batch,
    FixedShapeBuckets,
    IdPairs,
    distinct_sequences,
    equal_runs,
    source_matrix,
    teacher_forcing,
)
from phrasescore.engine.scoring import EXACT, PairScorer
from phrasescore.model.base import EncoderOutput
from phrasescore.model.output_layer import padded_target_logprobs

log = logging.getLogger(__name__)

LOGITS_PER_CHUNK = 1 << 27
"""Logits per row chunk of the output layer (9,000 rows of a 15,000-word vocabulary: 256 MB in
bf16): large products, few launches."""
Tensors = tuple[torch.Tensor, ...]


class CapturedShapes:
    """The work of a few fixed shapes, each captured in a CUDA graph (``torch.cuda.CUDAGraph``)
    the first time it is asked for and replayed every time, its inputs copied into the graph's
    buffers before and its outputs copied out after: every batch of a shape is computed by the
    same replayed kernels, whatever the order of the blocks (``--io-workers`` hand them over in
    any order), so the same input gives the same bytes.

    Memory stays bounded however many shapes come: the graphs share one memory pool for what
    they compute (they run one after the other on one stream), and their inputs are views of
    one buffer per input (:attr:`arenas`, by kind, position and dtype), as large as the largest
    batch's input; a larger one replaces the buffer and drops the graphs (captured again as
    their shapes come back). Only small outputs are kept per graph (a batch's scores).

    Elsewhere (not CUDA, or ``enabled`` False) the function is called directly. If a capture
    fails, capture is switched off with a warning and the work runs uncaptured from then on."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.enabled = enabled and device.type == "cuda"
        self.graphs: dict[tuple, tuple] = {}
        self.arenas: dict[tuple, torch.Tensor] = {}
        self.pool = None

    def run(self, key: tuple, fn: Callable[..., Tensors], inputs: Tensors) -> Tensors:
        """``fn(*inputs)``, a tuple of tensors, from the graph of ``key`` (a kind and the inputs'
        shapes and dtypes), captured now if it is new: copies of its outputs."""
        if not self.enabled:
            return fn(*inputs)
        entry = self.graphs.get(key)
        if entry is None:
            static_in = self._buffers(key[0], inputs)
            for buffer, value in zip(static_in, inputs, strict=True):
                buffer.copy_(value)  # the warm-up and the capture read real ids, not garbage
            try:
                graph, static_out = self._capture(fn, static_in)
            except RuntimeError as exc:
                log.warning("CUDA graph capture failed (%s); scoring without graphs", exc)
                self.enabled = False
                return fn(*inputs)
            entry = self.graphs[key] = (graph, static_in, static_out)
        graph, static_in, static_out = entry
        for buffer, value in zip(static_in, inputs, strict=True):
            buffer.copy_(value, non_blocking=True)
        graph.replay()
        return tuple(out.clone() for out in static_out)

    def _buffers(self, kind, inputs: Tensors) -> Tensors:
        """The graph's input buffers: views of the arena of each input (grown, and every graph
        dropped, where this input is larger than it)."""
        views = []
        for position, value in enumerate(inputs):
            name = (kind, position, value.dtype)
            arena = self.arenas.get(name)
            if arena is None or arena.numel() < value.numel():
                size = max(value.numel(), 2 * arena.numel() if arena is not None else 0)
                self.graphs.clear()  # their buffers were views of the arena replaced here
                arena = torch.empty(size, dtype=value.dtype, device=value.device)
                self.arenas[name] = arena
            views.append(arena[: value.numel()].view(value.shape))
        return tuple(views)

    def _capture(self, fn, static_in: Tensors):
        """(the graph of ``fn`` over ``static_in``, its outputs' buffers)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture: lazy set-up, compiled kernels
            fn(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = fn(*static_in)
        return graph, static_out


class DeviceScorer(PairScorer):
    """The GPU engine (module docstring): :class:`PairScorer`'s protocol and text half, its
    network half laid out for a GPU. ``graphs``: capture each shape in a CUDA graph (CUDA
    only); ``batch_pairs``: the most pairs a batch."""

    def __init__(
        self,
        model: TrainedModel,
        device: str | torch.device = "cuda",
        dtype: str = "float32",
        batch_tokens: int = 1 << 19,
        chunk_rows: int | None = None,
        include_eos: bool = True,
        scoring: str = EXACT,
        model_path: str | None = None,
        buckets: FixedShapeBuckets | None = None,
        graphs: bool = True,
        batch_pairs: int = 32768,
    ):
        if buckets is None:
            buckets = FixedShapeBuckets(batch_pairs, max(batch_tokens, 1 << 19))
        if not isinstance(buckets, FixedShapeBuckets):
            raise TypeError("the GPU engine cuts batches of fixed shapes (FixedShapeBuckets)")
        super().__init__(
            model, device, dtype, batch_tokens, chunk_rows, include_eos, scoring, model_path,
            buckets,
        )  # fmt: skip
        self.captured = CapturedShapes(self.device, graphs)
        self.positional = self.network.POSITIONAL_OUTPUTS

    def warm_up(self) -> None:
        """Nothing to build before worker processes fork: the ``--io-workers`` never touch the
        device, and each shape is captured as it comes (the CPU engine's warm-up scores with
        3-row logit chunks, which a graph captured then would keep)."""

    # ------------------------------------------------------------------ id level
    @torch.inference_mode()
    def score_arrays(
        self, pairs: IdPairs, per_token: bool = False
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """log p(y | x) for pairs given as flat ids and offsets, in input order (what
        :meth:`PairScorer.score_arrays` returns, by the module docstring's steps)."""
        n = len(pairs)
        if n == 0:
            return np.zeros(0, dtype=np.float64), [] if per_token else None
        first, pair_source = distinct_sequences(pairs.src_ids, pairs.src_offsets)
        enc_all, src_width = self._encode_sources(pairs.src_ids, pairs.src_offsets, first)
        tgt_len = pairs.tgt_lengths()
        order = np.lexsort((pair_source, tgt_len))
        sums = torch.zeros(n, dtype=torch.float64, device=self.device)
        extra = 1 + (src_width if self.positional else 0)  # positions a row holds beside its width
        kept: list[tuple[np.ndarray, torch.Tensor]] = []
        for batch in self.buckets.batches(tgt_len, order, extra):
            own = batch.own_rows
            batch_sums, values = self._score_batch(enc_all, batch, pair_source, pairs, tgt_len)
            sums[self._to_device(batch.index[:own])] = batch_sums[:own]
            if per_token:
                kept.append((batch.index[:own], values[:own]))
        result = sums.cpu().numpy()  # the block's one wait for the device
        per_tok = None
        if per_token:
            per_tok = [np.empty(0)] * n
            for index, values in kept:
                rows = values.double().cpu().numpy()
                for row, i in enumerate(index.tolist()):
                    per_tok[i] = rows[row, : tgt_len[i] + 1]
        if self.self_normalized:  # as PairScorer: p ≤ 1
            above = result > 0.0
            self.clamped += int(above.sum())
            result[above] = 0.0
        return result, per_tok

    def _encode_sources(
        self, flat: np.ndarray, offsets: np.ndarray, first: np.ndarray
    ) -> tuple[EncoderOutput, int]:
        """The distinct sources ``first`` encoded (rows in their order) in batches of one exact
        length, uncaptured (large batches, whose outputs, the largest tensors here, a graph
        would keep); and the width their positional outputs are padded to (a bucket bound, 0
        without positional outputs)."""
        lengths = offsets[first + 1] - offsets[first]
        order = np.argsort(lengths, kind="stable")
        pieces: list[tuple[np.ndarray, EncoderOutput]] = []
        for start, end, length in equal_runs(lengths[order]):
            cap = self.buckets.row_cap(length, 1)
            for s in range(start, end, cap):
                own = order[s : min(end, s + cap)]
                ids = source_matrix(flat, offsets, first[own], length)
                # one exact length: no lengths to look at (None)
                pieces.append((own, self.network.encode(self._to_device(ids), None)))
        longest = int(lengths.max()) + 1
        width = int(self.buckets.width(np.array([longest]))[0]) if self.positional else 0
        return self._merge_encodings(pieces, width), width

    def _score_batch(
        self,
        enc_all: EncoderOutput,
        batch: Batch,
        pair_source: np.ndarray,
        pairs: IdPairs,
        tgt_len: np.ndarray,
    ) -> Tensors:
        """(log p of each row [rows] float64, each position's log p [rows, width + 1] float32)
        of one fixed-shape batch: the source rows selected (their source-only decoder terms once
        per source), then the captured work (:meth:`_batch_logprobs`)."""
        idx, width = batch.index, batch.width
        enc = self._pair_encodings(enc_all, idx, pair_source)
        lengths = tgt_len[idx]
        tgt_in, tgt_out = teacher_forcing(pairs.tgt_ids, pairs.tgt_offsets, idx, width, lengths)
        positions = np.arange(width + 1)[None, :]
        real = positions <= lengths[:, None]  # the words and EOS
        summed = real if self.include_eos else positions < lengths[:, None]
        keys = sorted(enc)
        inputs = tuple(self._to_device(a) for a in (tgt_in, tgt_out, real, summed))
        inputs += tuple(enc[k] for k in keys)
        shape_key = ("score", *((tuple(x.shape), x.dtype) for x in inputs))
        return self.captured.run(shape_key, partial(self._batch_logprobs, keys), inputs)

    def _batch_logprobs(
        self,
        keys: Sequence[str],
        tgt_in: torch.Tensor,
        tgt_out: torch.Tensor,
        real: torch.Tensor,
        summed: torch.Tensor,
        *enc_values: torch.Tensor,
    ) -> Tensors:
        """The captured work of a batch: log p(y_t | y_<t, x) at every position (0 at padded
        ones) and each row's sum over ``summed`` (Cho et al. 2014, eq. 4; without EOS for
        ``include_eos=False``). Exact scoring: the softmax over the vocabulary; self-normalised:
        the reference word's logit alone (Devlin et al. 2014, §2.1)."""
        network = self.network
        features = network.decode_features(dict(zip(keys, enc_values, strict=True)), tgt_in)
        if self.self_normalized:
            flat = features.reshape(-1, features.shape[-1])
            values = network.target_logits(flat, tgt_out.reshape(-1)).view(tgt_out.shape)
        else:
            vocab = network.config.tgt_vocab_size
            chunk = self.chunk_rows or max(256, LOGITS_PER_CHUNK // vocab)
            values = padded_target_logprobs(network.logits, features, tgt_out, vocab, chunk)
        values = torch.where(real, values, 0.0)
        return torch.where(summed, values, 0.0).double().sum(1), values
