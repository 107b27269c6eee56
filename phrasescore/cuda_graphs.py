"""CUDA graphs by shape: the work of a few fixed shapes, each captured once in a CUDA graph and
replayed, with bounded memory (:class:`CapturedShapes`). The GPU scoring engine
(:mod:`phrasescore.engine.graph_scoring`) and the captured training step
(:mod:`phrasescore.training.captured_step`) run their batches through it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

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

    Each capture runs the work once first, uncaptured (a warm-up: lazy set-up, compiled
    kernels); with ``keep_rng`` the CUDA generator is put back after it, so that work drawing
    random numbers (dropout) draws in the replays what it would have drawn eagerly.

    Elsewhere (not CUDA, or ``enabled`` False) the function is called directly. If a capture
    fails, capture is switched off with a warning, the error is kept in :attr:`failure` (what
    ``tools/gpu-score`` reports as a failure, never as a graphs figure) and the work runs
    uncaptured from then on."""

    def __init__(self, device: torch.device, enabled: bool = True, keep_rng: bool = False):
        self.device = device
        self.enabled = enabled and device.type == "cuda"
        self.keep_rng = keep_rng
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
                log.warning(
                    "CUDA graph capture failed (%s); running without graphs from now on", exc
                )
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
        rng = torch.cuda.get_rng_state(self.device) if self.keep_rng else None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture: lazy set-up, compiled kernels
            fn(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        if rng is not None:
            torch.cuda.set_rng_state(rng, self.device)
        if self.pool is None:
            self.pool = self._new_pool()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = fn(*static_in)
        return graph, static_out
