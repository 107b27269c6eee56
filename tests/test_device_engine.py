"""The CUDA-graph engine (engine/graph_scoring.py) checked on the CPU: its fixed-shape batch plan, its
scores against the CPU engine's for every architecture and recurrence, and that nothing in a
block reads a value back from the device (no host sync: what lets a GPU run a block without
waiting and a CUDA graph hold a batch). The captured graphs themselves are checked in
tests/test_cuda.py on a GPU."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from phrasescore.bundle import TrainedModel, load_model
from phrasescore.cuda_graphs import CapturedShapes
from phrasescore.engine.batching import MIN_ROWS, FixedShapeBuckets, IdPairs, fixed_rows
from phrasescore.engine.graph_scoring import NO_GRAPHS, CudaGraphScorer
from phrasescore.engine.protocol import ENGINES, IdScorer
from phrasescore.engine.scoring import CpuScorer
from phrasescore.model.base import select_rows
from phrasescore.model.output_layer import _eager_lse_gather, target_logprobs

from .conftest import HostReads, untrained_model
from .test_engine_arrays import table_pairs

NETWORKS = [
    ("cho", "written"),
    ("cho", "fused"),
    ("attention", "written"),
    ("attention", "fused"),
    ("lstm", "written"),
]


def table_model(arch: str, recurrence: str, self_normalize: float = 0.0) -> TrainedModel:
    """A freshly initialised tiny network of ``arch`` with the table's vocabularies."""
    src, tgt = table_pairs()
    return untrained_model(src, tgt, arch, recurrence, self_normalize=self_normalize)


def test_fixed_shape_plan_repeats_few_shapes_and_covers_every_row_once():
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 40, size=5000)
    order = np.argsort(lengths, kind="stable")
    plan = FixedShapeBuckets(batch_pairs=256, batch_tokens=4096)
    batches = plan.batches(lengths, order, 1)
    own = np.concatenate([b.index[: b.own_rows] for b in batches])
    assert sorted(own.tolist()) == list(range(5000))
    shapes = set()
    for b in batches:
        rows = len(b.index)
        cap = plan.row_cap(b.width, 1)
        assert rows & (rows - 1) == 0 and MIN_ROWS <= rows <= cap <= 256  # a power of two
        assert rows * (b.width + 1) <= 4096
        assert b.width in plan.bounds.tolist()
        assert (lengths[b.index] <= b.width).all()
        assert (b.index[b.own_rows :] == b.index[b.own_rows - 1]).all()  # filled: the last row
        shapes.add((rows, b.width))
    assert len(batches) > 40
    # 2 sizes per width at most here: the cap and one remainder's power of two
    assert len(shapes) <= 2 * len({b.width for b in batches})
    assert [fixed_rows(n, 1024) for n in (1, 16, 17, 600, 1024)] == [16, 16, 32, 1024, 1024]


@pytest.mark.parametrize(("arch", "recurrence"), NETWORKS)
def test_the_gpu_engine_scores_as_the_cpu_engine_without_reading_back(arch, recurrence):
    """Every architecture and recurrence on the CPU: the engine's fixed shapes (small batches
    here, so that the 300 pairs make many, and several logit chunks a batch) give the CPU
    engine's log p and per-token terms within 1e-5, and no operator of the block reads a
    value back or selects by a boolean mask."""
    model = table_model(arch, recurrence)
    src, tgt = table_pairs()
    expected = CpuScorer(model).score_phrases(src, tgt, per_token=True)
    engine = CudaGraphScorer(
        model, device="cpu", buckets=FixedShapeBuckets(batch_pairs=64), chunk_rows=37
    )
    assert isinstance(engine, IdScorer)
    ids = engine.encode_phrases(src, tgt)
    pairs = IdPairs.from_lists(ids.src_ids, ids.tgt_ids)
    with HostReads() as reads:
        got, per_token = engine.score_arrays(pairs, per_token=True)
    assert not reads.seen, reads.seen
    assert np.abs(got - expected.logprob).max() < 1e-5
    assert (got < 0).all()
    for a, b in zip(per_token, expected.token_logprobs, strict=True):
        assert a.shape == b.shape
        assert np.abs(a - b).max() < 1e-5
    # the same block again, twice (outside the detector, under which PyTorch may take another
    # kernel: the LSTM's): the same bytes
    again = engine.score_arrays(pairs)[0]
    assert np.abs(again - got).max() < 1e-5
    assert engine.score_arrays(pairs)[0].tobytes() == again.tobytes()


def test_the_cpu_engine_reads_back_where_the_gpu_engine_does_not():
    """The detector above is not blind: the CPU engine looks at the output layer's values (its
    one-pass log-sum-exp checks for rows to compute again), what the GPU engine does without."""
    model = table_model("cho", "written")
    src, tgt = table_pairs(50)
    scorer = CpuScorer(model)
    ids = scorer.encode_phrases(src, tgt)
    with HostReads() as reads:
        scorer.score_ids(ids.src_ids, ids.tgt_ids)
    assert any("is_nonzero" in k for k in reads.seen)


@pytest.mark.parametrize("include_eos", [True, False])
def test_the_gpu_engine_on_the_trained_model(tiny_model_path, include_eos):
    """The trained tiny model (a real model file), with and without the end-of-sequence term,
    in the default fixed shapes (one batch per width)."""
    model = load_model(tiny_model_path)
    src, tgt = table_pairs()
    expected = CpuScorer(model, include_eos=include_eos).score_phrases(src, tgt)
    engine = CudaGraphScorer(model, device="cpu", include_eos=include_eos)
    got = engine.score_phrases(src, tgt)
    assert np.abs(got.logprob - expected.logprob).max() < 1e-5
    assert got.n_tokens.tolist() == expected.n_tokens.tolist()
    assert got.src_unknown.tolist() == expected.src_unknown.tolist()


def test_the_gpu_engine_self_normalized():
    model = table_model("cho", "written", self_normalize=0.5)
    src, tgt = table_pairs()
    expected = CpuScorer(model, scoring="self-normalized")
    engine = CudaGraphScorer(model, device="cpu", scoring="self-normalized")
    a = expected.score_phrases(src, tgt).logprob
    b = engine.score_phrases(src, tgt).logprob
    assert np.abs(a - b).max() < 1e-5
    assert engine.clamped == expected.clamped


@pytest.mark.parametrize("arch", ["cho", "attention", "lstm"])
def test_encoders_told_there_is_no_padding_encode_as_when_they_look(arch):
    model = table_model(arch, "written")
    src = torch.randint(4, 100, (6, 5))
    full = torch.full((6,), 5)
    told = model.network.encode(src, None)
    looked = model.network.encode(src, full)
    assert told.keys() == looked.keys()
    for key in told:
        assert torch.equal(told[key], looked[key]), key


def test_padded_logprobs_equal_log_softmax_and_stay_finite_for_any_logits():
    """The output layer of the engine (compiled from 1,024 words): PyTorch's log-softmax and
    gather at every position, also where one logit outside the first 512 words is far above
    the others (the CPU engine's one-pass shift would overflow and look again)."""
    torch.manual_seed(0)
    vocab, width = 3000, 16
    layer = torch.nn.Linear(width, vocab)
    features = torch.randn(5, 7, width)
    gold = torch.randint(0, vocab, (5, 7))
    with torch.no_grad():
        layer.bias[2500] = 200.0
        rows, flat_gold = features.reshape(-1, width), gold.reshape(-1)
        got = target_logprobs(layer, rows, flat_gold, vocab, chunk_rows=6, sync_free=True)
        expected = _eager_lse_gather(layer(rows), flat_gold)
    assert got.shape == (35,)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("sync_free", [False, True])
def test_chunked_output_layer_equals_the_full_log_softmax_and_never_makes_more_rows(sync_free):
    """The output layer of both engines (and the reference the CUDA libraries are tested
    against): log p of the reference word from row chunks, the product, the log-sum-exp and the
    gather; equal to the log-softmax of the whole [rows x vocabulary] logits within 1e-5 in
    fp32, and no product of more rows than a chunk (its memory bounded whatever the rows)."""
    torch.manual_seed(1)
    vocab, width, rows, chunk = 4000, 48, 700, 128
    layer = torch.nn.Linear(width, vocab)
    features, gold = torch.randn(rows, width), torch.randint(0, vocab, (rows,))
    seen = []

    def logits_of(x):
        seen.append(x.shape[0])
        return layer(x)

    with torch.no_grad():
        got = target_logprobs(logits_of, features, gold, vocab, chunk, sync_free=sync_free)
        full = torch.log_softmax(layer(features), dim=1).gather(1, gold[:, None]).squeeze(1)
    assert max(seen) == chunk and sum(seen) == rows
    torch.testing.assert_close(got, full, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("arch", "recurrence"), NETWORKS)
def test_source_terms_computed_once_per_source_give_the_per_pair_log_p(
    monkeypatch, arch, recurrence
):
    """What does not change across a pair's target steps (for cho: V'c, C c in the decoder's
    gates, O_c c in the output layer's pre-activation) is computed once per distinct source of
    a batch and repeated per pair: the log p of every pair is the one computed from each pair's
    own c at every step, within 1e-6."""
    model = table_model(arch, recurrence)
    src, tgt = table_pairs(120)
    shared = CpuScorer(model).score_phrases(src, tgt, per_token=True)

    def each_pair_its_own(self, enc_all, idx, pair_source):  # the network's start() makes them
        return select_rows(enc_all, torch.from_numpy(pair_source[idx]))

    monkeypatch.setattr(CpuScorer, "_pair_encodings", each_pair_its_own)
    per_pair = CpuScorer(model).score_phrases(src, tgt, per_token=True)
    np.testing.assert_allclose(shared.logprob, per_pair.logprob, rtol=0, atol=1e-6)
    for a, b in zip(shared.token_logprobs, per_pair.token_logprobs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_the_gpu_engine_is_the_cuda_engine_and_captures_only_on_cuda():
    assert ENGINES["cuda"] is CudaGraphScorer
    assert ENGINES["cpu"] is CpuScorer
    assert not CapturedShapes(torch.device("cpu")).enabled
    with pytest.raises(TypeError):
        CudaGraphScorer(table_model("cho", "written"), device="cpu", buckets=object())


def test_the_environment_turns_the_graphs_off(monkeypatch):
    """``PHRASESCORE_NO_CUDA_GRAPHS=1``: the engine asks for no capture (the run a command's
    figures without graphs come from); unset, it captures unless told ``graphs=False``."""
    model = table_model("cho", "written")
    assert CudaGraphScorer(model, device="cpu").graphs
    assert not CudaGraphScorer(model, device="cpu", graphs=False).graphs
    monkeypatch.setenv(NO_GRAPHS, "1")
    assert not CudaGraphScorer(model, device="cpu").graphs


class ReplayOnTheCpu(CapturedShapes):
    """:class:`CapturedShapes` with its CUDA graph stood in for by what a replay does: the work
    run again on the graph's own input buffers (views of the shared arenas), its results written
    into the same output buffers each time (fixed addresses, as a graph's). What the engine
    does around a graph (the inputs copied in, the outputs copied out before the next replay
    overwrites them, shapes sharing one buffer per input, the graphs dropped when a buffer
    grows) is then checked on the CPU."""

    class Graph:
        def __init__(self, fn, static_in):
            self.fn, self.static_in = fn, static_in
            self.static_out = tuple(x.clone() for x in fn(*static_in))
            self.replays = 0

        def replay(self):
            self.replays += 1
            for buffer, value in zip(self.static_out, self.fn(*self.static_in), strict=True):
                buffer.copy_(value)

    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.enabled = True

    def _capture(self, fn, static_in):
        graph = self.Graph(fn, static_in)
        return graph, graph.static_out


class FailingCapture(ReplayOnTheCpu):
    """Every capture fails, as one did on an H100 (an allocator assert inside the capture)."""

    def _capture(self, fn, static_in):
        self.captures += 1
        raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED\nat c10/cuda/...")


def test_a_failed_capture_scores_without_graphs_and_is_recorded():
    """The block is still scored (uncaptured, the same scores), capture is switched off, and the
    engine keeps the error's first line, which tools/gpu-score reports as a failure row."""
    model = table_model("cho", "written")
    src, tgt = table_pairs(60)
    expected = CudaGraphScorer(model, device="cpu").score_phrases(src, tgt).logprob
    engine = CudaGraphScorer(model, device="cpu")
    assert engine.graph_failure is None
    captured = engine.captured = FailingCapture()
    got = engine.score_phrases(src, tgt).logprob
    assert got.tobytes() == expected.tobytes()
    assert engine.graph_failure == "it->second->use_count > 0 INTERNAL ASSERT FAILED"
    assert not captured.enabled and captured.captures == 1 and not captured.graphs


def test_growing_a_buffer_retires_an_unanchored_pool_with_its_graphs():
    """PyTorch refuses a capture into a pool whose graphs are all gone: where no anchor holds
    the pool, the graphs dropped by a growth take their pool handle with them; an anchored
    pool is kept (its memory reused by the captures that follow)."""
    captured = ReplayOnTheCpu()
    small, large = torch.zeros(4, dtype=torch.long), torch.zeros(64, dtype=torch.long)
    for anchor in (None, object()):
        captured.arenas.clear()
        captured.run(("k", 4), lambda x: (x + 1,), (small,))
        assert len(captured.graphs) == 1
        captured.pool, captured.anchor = object(), anchor  # as a first capture leaves them
        kept = captured.pool
        captured.run(("k", 64), lambda x: (x + 1,), (large,))  # the buffer grows
        assert list(captured.graphs) == [("k", 64)]
        assert (captured.pool is kept) == (anchor is not None)
        captured.graphs.clear()


@pytest.mark.parametrize(("arch", "recurrence"), [("cho", "written"), ("attention", "fused")])
def test_replayed_shapes_score_as_the_engine_without_capture(arch, recurrence):
    """Every batch from a replay, the graphs' inputs in shared buffers: the bytes of the engine
    without capture, block after block; the buffers are as large as the largest batch's input
    (not one per shape), and a shape is captured once unless a buffer grew."""
    model = table_model(arch, recurrence)
    src, tgt = table_pairs()
    plain = CudaGraphScorer(model, device="cpu", buckets=FixedShapeBuckets(batch_pairs=32))
    expected = plain.score_phrases(src, tgt, per_token=True)
    engine = CudaGraphScorer(model, device="cpu", buckets=FixedShapeBuckets(batch_pairs=32))
    captured = engine.captured = ReplayOnTheCpu()
    small = engine.score_phrases(src[:40], tgt[:40])  # smaller batches first: buffers grow later
    assert np.abs(small.logprob - expected.logprob[:40]).max() < 1e-5
    captures, drops = [], []
    for _ in range(3):
        got = engine.score_phrases(src, tgt, per_token=True)
        assert got.logprob.tobytes() == expected.logprob.tobytes()
        for a, b in zip(got.token_logprobs, expected.token_logprobs, strict=True):
            assert a.tobytes() == b.tobytes()
        captures.append(captured.captures)
        drops.append(captured.drops)
    # the buffers grew in the first full block, dropping the graphs captured before (captured
    # again as their shapes come back, in the next block); then nothing new
    assert captures[0] > len(captured.graphs) >= 4 and captures[2] == captures[1]
    assert drops[0] >= 1 and drops[2] == drops[1] == drops[0]
    assert all(graph.replays >= 3 for graph, _, _ in captured.graphs.values())
    largest = {}
    for key, (_, static_in, _) in captured.graphs.items():
        for position, buffer in enumerate(static_in):
            name = (key[0], position, buffer.dtype)
            largest[name] = max(largest.get(name, 0), buffer.numel())
            assert buffer.untyped_storage().data_ptr() == captured.arenas[name].data_ptr()
    assert all(captured.arenas[name].numel() <= 2 * n for name, n in largest.items())


def test_the_graphs_a_run_captured_are_logged_for_every_engine_of_it(caplog):
    """An ensemble's members and a single model, each with its graphs (a replay standing in):
    one line with their captures and drops summed; the CPU engine and an engine told not to
    capture count for nothing."""
    from phrasescore.engine.graph_scoring import log_captured_graphs
    from phrasescore.engine.scoring import EnsembleScorer

    model = table_model("cho", "written")
    src, tgt = table_pairs()
    engines = [CudaGraphScorer(model, device="cpu", buckets=FixedShapeBuckets(batch_pairs=32))
               for _ in range(3)]  # fmt: skip
    for engine in engines:
        engine.captured = ReplayOnTheCpu()
        engine.score_phrases(src[:40], tgt[:40])
        engine.score_phrases(src, tgt)
        engine.device = torch.device("cuda")  # what the log looks at: the engine's device
    eager = CudaGraphScorer(model, device="cpu", graphs=False)
    scorers = [EnsembleScorer(engines[:2]), engines[2], CpuScorer(model), eager]
    with caplog.at_level("INFO", logger="phrasescore.engine.graph_scoring"):
        log_captured_graphs(scorers)
        log_captured_graphs([CpuScorer(model), eager])
    captures = sum(engine.captured.captures for engine in engines)
    drops = sum(engine.captured.drops for engine in engines)
    assert captures >= 12 and drops >= 3
    assert [record.getMessage() for record in caplog.records] == [
        f"CUDA graphs: {captures} captured, dropped {drops} times when an input buffer grew"
    ]


@pytest.mark.parametrize("arch", ["cho", "attention"])
def test_empty_and_very_long_phrases_score_as_the_cpu_engine(arch):
    """An n-best list can hold an empty hypothesis, and a sentence can be longer than the last
    bucket bound (256): the engine's widths for them (the first bound; the length itself)."""
    model = table_model(arch, "written")
    src, tgt = table_pairs(200)
    long_target = " ".join(tgt[:120])  # past the last bound
    assert len(long_target.split()) > 256
    sources = [*src[:10], "", src[0], src[1] + " " + src[2]]
    targets = [*tgt[:10], tgt[3], "", long_target]
    expected = CpuScorer(model).score_phrases(sources, targets, per_token=True)
    got = CudaGraphScorer(model, device="cpu").score_phrases(sources, targets, per_token=True)
    assert np.abs(got.logprob - expected.logprob).max() < 1e-4
    assert [len(t) for t in got.token_logprobs] == [len(t) for t in expected.token_logprobs]
    assert len(got.token_logprobs[11]) == 1  # the empty target: EOS alone


@pytest.mark.parametrize(("arch", "recurrence"), NETWORKS)
def test_full_rows_taken_as_padded_encode_as_unpadded(monkeypatch, arch, recurrence):
    """On a GPU an encoder takes the lengths it is given without looking whether any row is
    padded (the look would make the host wait): full rows then go through the padded path
    (masked or packed), which gives them their unpadded values: the same floats for the
    written recurrences, cuDNN's within rounding."""
    import phrasescore.model.attention as attention
    import phrasescore.model.encdec as encdec
    import phrasescore.model.lstm as lstm

    model = table_model(arch, recurrence)
    src = torch.randint(4, 100, (6, 5))
    full = torch.full((6,), 5)
    unpadded = model.network.encode(src, full)
    for module in (attention, encdec, lstm):  # what padded_lengths does on a GPU
        monkeypatch.setattr(module, "padded_lengths", lambda lengths, steps: lengths)
    as_padded = model.network.encode(src, full)
    for key, value in unpadded.items():
        if recurrence == "written" and arch != "lstm":
            assert torch.equal(value, as_padded[key]), key
        else:
            torch.testing.assert_close(value, as_padded[key], rtol=1e-5, atol=1e-6)


def test_an_ensemble_of_gpu_engines_scores_as_one_of_cpu_engines(
    tiny_model_path, tiny_second_seed_model_path
):
    """``nbest -m A -m B`` on a GPU averages two GPU engines' per-token terms: on 40 real
    Multi30k sentence pairs (tests/data/text), as two CPU engines'."""
    from phrasescore.engine.scoring import EnsembleScorer

    from .conftest import sample_pairs

    src, tgt = sample_pairs(40)
    models = [load_model(tiny_model_path), load_model(tiny_second_seed_model_path)]
    cpu = EnsembleScorer([CpuScorer(m) for m in models]).score_phrases(src, tgt)
    gpu_engines = [CudaGraphScorer(m, device="cpu", buckets=FixedShapeBuckets(16)) for m in models]
    gpu = EnsembleScorer(gpu_engines).score_phrases(src, tgt, per_token=True)
    assert np.abs(gpu.logprob - cpu.logprob).max() < 1e-5
    assert [len(t) for t in gpu.token_logprobs] == [len(t.split()) + 1 for t in tgt]


def test_an_output_kernel_the_engine_cannot_run_is_refused():
    """The GPU engine's output kernels: torch's anywhere; a fused library only on CUDA, with
    exact scoring and its package installed; an unknown name never."""
    from phrasescore.engine.graph_scoring import check_output_kernel
    from phrasescore.engine.scoring import EXACT, SELF_NORMALIZED
    from phrasescore.model.output_layer import OUTPUT_KERNEL_PACKAGES

    model = table_model("cho", "written")
    src, tgt = table_pairs(20)
    plain = CudaGraphScorer(model, device="cpu").score_phrases(src, tgt).logprob
    same = CudaGraphScorer(model, device="cpu", output_kernel="torch")
    assert same.score_phrases(src, tgt).logprob.tobytes() == plain.tobytes()
    with pytest.raises(ValueError, match="unknown output kernel 'fast'"):
        CudaGraphScorer(model, device="cpu", output_kernel="fast")
    with pytest.raises(ValueError, match="runs on CUDA only"):
        CudaGraphScorer(model, device="cpu", output_kernel="cce")
    cuda = torch.device("cuda")  # a device object: nothing here touches a GPU
    with pytest.raises(ValueError, match="exact log-probabilities only"):
        check_output_kernel("liger", cuda, SELF_NORMALIZED)
    for kernel, module in OUTPUT_KERNEL_PACKAGES.items():
        if importlib.util.find_spec(module) is None:
            with pytest.raises(ValueError, match=f"needs the package {module}"):
                check_output_kernel(kernel, cuda, EXACT)
        else:
            check_output_kernel(kernel, cuda, EXACT)
