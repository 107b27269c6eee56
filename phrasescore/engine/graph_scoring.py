"""The CUDA-graph engine: log p(target | source) of many pairs, each batch shape captured once
in a CUDA graph and replayed.

The plan of a block (distinct sources encoded once, pairs ordered, cut into batches, results
back in input order) is :class:`~phrasescore.engine.scoring.BlockScorer`'s, which the CPU
engine shares; on a GPU the CPU engine's loop of small kernels, its boolean selections and its
checks of values would make the host wait for the device several times a batch. Here:

1. the pairs go in batches of a few fixed shapes (:class:`~phrasescore.engine.batching.
   FixedShapeBuckets`: target widths of a few bounds, rows a power of two; the attention
   model's annotations padded to a bound too); a batch is the decoder over every position,
   the output layer's logits in row chunks with the log-sum-exp and the reference word's logit
   in one kernel (:meth:`~phrasescore.model.base.EncoderDecoder.gold_logprobs`, ``sync_free``:
   never a [tokens x vocabulary] matrix for the batch), the padded positions masked and each
   pair's sum taken: nothing in it reads a value back, so the GPU never waits on the host;
2. on CUDA each batch shape's work (the decoder and the output layer; the sources' encoder,
   large batches, runs as it is) is captured once in a CUDA graph (:class:`CapturedShapes`) and
   replayed: one launch a batch instead of a Python loop of small kernels per step. The
   recurrences are the models' own (the GRU of Cho et al. 2014, eq. 5-8, written out; the
   attention decoder; cuDNN's GRU or LSTM where the model has them), unchanged;
3. the scores stay on the device and come back in one copy per block.

The same function runs without capture on the CPU (how the tests check it), on a device that is
neither CPU nor CUDA, and where capture is off (``graphs=False``, the figures' eager baseline).
Scores equal the CPU engine's within the engine's tolerance (float32 sums over other batch
shapes, and the log-sum-exp shifted by the row's maximum: < 1e-4 in log p,
tests/test_device_engine.py).
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import torch

from phrasescore.bundle import TrainedModel
from phrasescore.engine.batching import FixedShapeBuckets
from phrasescore.engine.scoring import EXACT, BlockScorer
from phrasescore.model.output_layer import OUTPUT_KERNEL_PACKAGES, OUTPUT_KERNELS

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

    The pool outlives the graphs dropped: PyTorch's caching allocator forgets a graph pool's
    use only when its memory is freed, and refuses a capture into a pool whose every graph is
    gone (``use_count > 0`` assert in ``CUDACachingAllocator.cpp``). So the pool is anchored by
    an empty graph captured into it and held for this object's life (what
    ``torch/_inductor/cudagraph_trees.py`` does): graphs captured after a growth reuse the
    pool's memory. Where the anchor cannot be captured, the pool is retired with the graphs
    and a fresh one taken for the next capture.

    Elsewhere (not CUDA, or ``enabled`` False) the function is called directly. If a capture
    fails, capture is switched off with a warning, the error is kept in :attr:`failure` (what
    ``tools/gpu-score`` reports as a failure, never as a graphs figure) and the work runs
    uncaptured from then on."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.enabled = enabled and device.type == "cuda"
        self.graphs: dict[tuple, tuple] = {}
        self.arenas: dict[tuple, torch.Tensor] = {}
        self.pool = None
        self.anchor = None
        """An empty graph captured into :attr:`pool`, held so that the pool stays registered."""
        self.failure: str | None = None
        """Why a capture failed (capture then off), None while every capture succeeded."""
        self.captures = 0
        """Graphs captured so far (each costs a warm-up run and the capture)."""
        self.drops = 0
        """Times every graph was dropped because an input's buffer grew."""

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
                self.failure = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self.enabled = False
                self._drop_graphs()
                return fn(*inputs)
            entry = self.graphs[key] = (graph, static_in, static_out)
            self.captures += 1
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
                self._drop_graphs()  # their buffers were views of the arena replaced here
                arena = torch.empty(size, dtype=value.dtype, device=value.device)
                self.arenas[name] = arena
            views.append(arena[: value.numel()].view(value.shape))
        return tuple(views)

    def _drop_graphs(self) -> None:
        """Forget every graph; an unanchored pool goes with them (a capture into a pool whose
        graphs are all gone fails: class docstring), so the next capture takes a fresh one."""
        self.drops += bool(self.graphs)
        self.graphs.clear()
        if self.anchor is None:
            self.pool = None

    def _new_pool(self):
        """A graph pool handle, anchored by an empty graph where one can be captured."""
        pool = torch.cuda.graph_pool_handle()
        anchor = torch.cuda.CUDAGraph()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an empty graph is the point here
                with torch.cuda.graph(anchor, pool=pool):
                    pass
        except RuntimeError as exc:
            log.info("no anchor for the CUDA graph pool (%s): retired with its graphs", exc)
            anchor = None
        self.anchor = anchor
        return pool

    def _capture(self, fn, static_in: Tensors):
        """(the graph of ``fn`` over ``static_in``, its outputs' buffers)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture: lazy set-up, compiled kernels
            fn(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = self._new_pool()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = fn(*static_in)
        return graph, static_out


def check_output_kernel(kernel: str, device: torch.device, scoring: str) -> None:
    """Refuse an output kernel the engine cannot run: an unknown name, a fused library off
    CUDA (Triton kernels) or where it is not installed, or one with self-normalised scoring
    (which reads the reference word's logit alone)."""
    if kernel not in OUTPUT_KERNELS:
        raise ValueError(f"unknown output kernel {kernel!r} (one of {', '.join(OUTPUT_KERNELS)})")
    if kernel == "torch":
        return
    if device.type != "cuda":
        raise ValueError(f"the output kernel {kernel!r} runs on CUDA only (Triton kernels)")
    if scoring != EXACT:
        raise ValueError(f"the output kernel {kernel!r} computes exact log-probabilities only")
    module = OUTPUT_KERNEL_PACKAGES[kernel]
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"the output kernel {kernel!r} needs the package {module}")


class CudaGraphScorer(BlockScorer):
    """The CUDA-graph engine (module docstring): :class:`~phrasescore.engine.scoring.
    BlockScorer`'s plan with fixed-shape batches, each shape's kernel captured in a CUDA graph
    (CUDA only, ``graphs``); on a device that is neither CPU nor CUDA the same plan runs
    uncaptured. ``batch_pairs``: the most pairs a batch. ``output_kernel``: the output layer's
    kernel (:data:`~phrasescore.model.output_layer.OUTPUT_KERNELS`): torch's row chunks (the
    default), or on CUDA liger-kernel's or cut-cross-entropy's fused linear cross-entropy where
    the package is installed (tools/gpu-score times each; exact scoring only)."""

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
        shared_prefixes: bool = False,
        output_kernel: str = "torch",
    ):
        check_output_kernel(output_kernel, torch.device(device), scoring)
        self.output_kernel = output_kernel
        if buckets is None:
            buckets = FixedShapeBuckets(batch_pairs, max(batch_tokens, 1 << 19))
        if not isinstance(buckets, FixedShapeBuckets):
            raise TypeError(
                "the CUDA-graph engine cuts batches of fixed shapes (FixedShapeBuckets)"
            )
        super().__init__(
            model,
            device,
            dtype,
            chunk_rows,
            include_eos,
            scoring,
            model_path,
            buckets,
            shared_prefixes,
        )
        self.captured = CapturedShapes(self.device, graphs)

    @property
    def graph_failure(self) -> str | None:
        """Why capture was switched off (a failed capture), None while graphs run or were never
        asked for: a run with a failure scored without graphs."""
        return self.captured.failure

    def warm_up(self) -> None:
        """Nothing to build before worker processes fork: the ``--io-workers`` never touch the
        device, and each shape is captured as it comes (the CPU engine's warm-up scores with
        3-row logit chunks, which a graph captured then would keep)."""

    def _batch_scores(self, enc, batch, tgt_in, tgt_out, lengths):
        """The masks of one fixed-shape batch made on the host, then the captured work
        (:meth:`_batch_logprobs`) over its inputs."""
        positions = np.arange(batch.width + 1)[None, :]
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
        ``include_eos=False``), the output layer in the scoring mode
        (:meth:`~phrasescore.model.base.EncoderDecoder.gold_logprobs`) over every position,
        without a look at a value."""
        network = self.network
        features = network.decode_features(dict(zip(keys, enc_values, strict=True)), tgt_in)
        flat = features.reshape(-1, features.shape[-1])
        chunk = self.chunk_rows or max(256, LOGITS_PER_CHUNK // network.config.tgt_vocab_size)
        values = network.gold_logprobs(
            flat,
            tgt_out.reshape(-1),
            chunk,
            self.self_normalized,
            sync_free=True,
            kernel=self.output_kernel,
        ).view(tgt_out.shape)
        values = torch.where(real, values, 0.0)
        return torch.where(summed, values, 0.0).double().sum(1), values
