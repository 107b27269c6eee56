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
neither CPU nor CUDA, and where capture is off (``graphs=False``, the figures' eager baseline;
``PHRASESCORE_NO_CUDA_GRAPHS=1`` turns it off for every command, what gpu-check's n-best row
without graphs times).
Scores equal the CPU engine's within the engine's tolerance (float32 sums over other batch
shapes, and the log-sum-exp shifted by the row's maximum: < 1e-4 in log p,
tests/test_device_engine.py).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence
from functools import partial

import numpy as np
import torch

from phrasescore.bundle import TrainedModel
from phrasescore.cuda_graphs import CapturedShapes, Tensors
from phrasescore.engine.batching import FixedShapeBuckets
from phrasescore.engine.scoring import EXACT, BlockScorer
from phrasescore.model.output_layer import OUTPUT_KERNEL_PACKAGES, OUTPUT_KERNELS

log = logging.getLogger(__name__)

LOGITS_PER_CHUNK = 1 << 27
"""Logits per row chunk of the output layer (9,000 rows of a 15,000-word vocabulary: 256 MB in
bf16): large products, few launches."""


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


NO_GRAPHS = "PHRASESCORE_NO_CUDA_GRAPHS"
"""An environment variable: set (``=1``), the engine captures nothing and runs each batch's
work as it is (a command's figures with and without graphs; the bytes may differ from a run
with graphs in the last digits, as the eager baseline's do)."""


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
        self.graphs = graphs and not os.environ.get(NO_GRAPHS)
        """Whether batches are captured (on CUDA): ``graphs``, unless :data:`NO_GRAPHS` is set."""
        self.captured = CapturedShapes(self.device, self.graphs)

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


def log_captured_graphs(scorers: Sequence) -> None:
    """Log how many CUDA graphs the GPU engines among ``scorers`` (an ensemble's members
    included) captured and how often a buffer's growth dropped them: each capture cost a warm-up
    run and the capture, what a short command's time may hold."""
    engines = [member for scorer in scorers for member in getattr(scorer, "scorers", [scorer])]
    captured = [
        engine.captured
        for engine in engines
        if isinstance(engine, CudaGraphScorer) and engine.graphs and engine.device.type == "cuda"
    ]
    if captured:
        log.info(
            "CUDA graphs: %d captured, dropped %d times when an input buffer grew",
            sum(graphs.captures for graphs in captured),
            sum(graphs.drops for graphs in captured),
        )
