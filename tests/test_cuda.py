"""The CUDA code paths: training with bf16 autocast, its reproducibility and
resume, and scoring, re-ranking and translating on the GPU against the same model on the CPU.

Skipped where PyTorch sees no CUDA device. ``PHRASESCORE_TEST_DEVICE=cpu`` runs the same checks
on the CPU (the comparisons are then CPU against CPU): how they are checked on a machine without
a GPU before they run on one.
"""

from __future__ import annotations

import gzip
import math
import os

import numpy as np
import pytest
import torch

from phrasescore.bundle import load_model
from phrasescore.engine.scoring import CpuScorer
from phrasescore.model.output_layer import OUTPUT_KERNEL_PACKAGES
from phrasescore.moses.nbest import iter_nbest_groups, read_nbest
from phrasescore.moses.phrase_table import format_entry, read_phrase_table
from phrasescore.training.trainer import Trainer

from .conftest import DATA, OperatorCounts, run_cli, sample_pairs, train_tiny, write_lines

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS handle
DEVICE = os.environ.get("PHRASESCORE_TEST_DEVICE", "cuda")
AMP = DEVICE == "cuda"  # bf16 autocast, the CUDA default of `train`
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(), reason="no CUDA device"
)
TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"
NBEST_LIST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
NBEST_SRC = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"


def _files(tmp_path, n):
    src, tgt = sample_pairs(n)
    return write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)


def _train(path, src, tgt, arch="attention", resume=False, **overrides):
    kw = dict(seed=5, learning_rate=1e-2, valid_every=1000)
    kw.update(overrides)
    return train_tiny(path, src, tgt, valid=(src, tgt), resume=resume, arch=arch, device=DEVICE,
                      amp=AMP, **kw)  # fmt: skip


@pytest.mark.parametrize("arch", ["cho", "attention", "lstm", "transformer"])
def test_training_learns_and_the_model_scores_the_same_on_the_cpu(tmp_path, arch):
    src, tgt = _files(tmp_path, 20)
    path = tmp_path / "m.safetensors"
    result = _train(path, src, tgt, arch, max_steps=200, batch_tokens=2000, valid_every=200,
                    epochs=1000)  # fmt: skip
    assert result.unigram_valid_ppl > 50
    assert result.best_valid_ppl < 5.0  # the 20 pairs nearly learnt by heart
    pairs = sample_pairs(20)
    on_cpu = CpuScorer(load_model(str(path))).score_phrases(*pairs).logprob
    on_device = CpuScorer(load_model(str(path), DEVICE), DEVICE).score_phrases(*pairs).logprob
    assert np.isfinite(on_cpu).all() and (on_cpu < 0).all()
    np.testing.assert_allclose(on_device, on_cpu, rtol=1e-4, atol=1e-4)
    # the mean of the training pairs' log p is the validation perplexity's (EOS counted)
    tokens = sum(len(t.split()) + 1 for t in pairs[1])
    assert math.exp(-on_cpu.sum() / tokens) == pytest.approx(result.best_valid_ppl, rel=0.05)


def test_training_is_byte_reproducible_and_resume_is_exact(tmp_path):
    src, tgt = _files(tmp_path, 60)
    common = dict(batch_tokens=300, valid_every=4, seed=9, learning_rate=3e-3)
    paths = {}
    for name in ("a", "b", "parts"):
        (tmp_path / name).mkdir()
        paths[name] = tmp_path / name / "m.safetensors"
    first = _train(paths["a"], src, tgt, max_steps=12, **common)
    second = _train(paths["b"], src, tgt, max_steps=12, **common)
    assert paths["a"].read_bytes() == paths["b"].read_bytes()
    assert first.signature == second.signature
    _train(paths["parts"], src, tgt, max_steps=7, **common)
    _train(paths["parts"], src, tgt, max_steps=12, resume=True, **common)
    a = Trainer.read_checkpoint(str(paths["a"]) + ".checkpoint")
    b = Trainer.read_checkpoint(str(paths["parts"]) + ".checkpoint")
    assert a["meta"]["position"]["step"] == b["meta"]["position"]["step"] == 12
    for name, tensor in a["network"].items():
        assert torch.equal(tensor, b["network"][name]), name


@pytest.mark.parametrize("arch", ["attention", "transformer"])
def test_captured_training_steps_repeat_their_bytes_resume_exactly_and_learn_as_eager(
    tmp_path, monkeypatch, arch
):
    """``train --graphs --bucket 8``: every batch shape's forward and backward captured once
    and replayed (no capture fails: the log says none did), two runs give the same bytes, a
    run stopped and resumed ends with the uninterrupted run's weights (dropout's generator
    kept across the captures), and the validation perplexities are the eager step's within
    bf16 rounding."""
    if DEVICE != "cuda":  # on the CPU the job refuses --graphs; the trainer runs them uncaptured
        from phrasescore.jobs.training import train as train_job

        monkeypatch.setattr(train_job, "_check_graphs", lambda *args: None)
    src, tgt = _files(tmp_path, 60)
    common = dict(batch_tokens=300, valid_every=4, seed=9, learning_rate=3e-3, bucket=8, arch=arch)
    paths = {}
    for name in ("eager", "a", "b", "parts"):
        (tmp_path / name).mkdir()
        paths[name] = tmp_path / name / "m.safetensors"
    eager = _train(paths["eager"], src, tgt, max_steps=12, **common)
    first = _train(paths["a"], src, tgt, max_steps=12, graphs=True, **common)
    second = _train(paths["b"], src, tgt, max_steps=12, graphs=True, **common)
    log_text = (tmp_path / "a" / "m.safetensors.log").read_text()
    assert "capture failed" not in log_text and "--graphs" in log_text
    assert paths["a"].read_bytes() == paths["b"].read_bytes()
    assert first.signature == second.signature
    for a, b in zip(eager.history, first.history, strict=True):
        assert a["valid_ppl"] == pytest.approx(b["valid_ppl"], rel=2e-2)
    _train(paths["parts"], src, tgt, max_steps=7, graphs=True, **common)
    _train(paths["parts"], src, tgt, max_steps=12, graphs=True, resume=True, **common)
    a = Trainer.read_checkpoint(str(paths["a"]) + ".checkpoint")
    b = Trainer.read_checkpoint(str(paths["parts"]) + ".checkpoint")
    assert a["meta"]["position"]["step"] == b["meta"]["position"]["step"] == 12
    for name, tensor in a["network"].items():
        assert torch.equal(tensor, b["network"][name]), name


def _entries(path):
    return list(read_phrase_table(str(path)))


def test_rescore_on_the_gpu_matches_the_cpu_and_repeats_its_bytes(tmp_path, tiny_model_path):
    outs = {}
    for name, flags in {
        "cpu": ["--device", "cpu", "--dtype", "float32"],
        "fp32": ["--device", DEVICE, "--dtype", "float32"],
        "fp32-again": ["--device", DEVICE, "--dtype", "float32"],
        "bf16": ["--device", DEVICE, "--dtype", "bfloat16"],
    }.items():
        outs[name] = tmp_path / f"{name}.gz"
        proc = run_cli("rescore", TABLE, "-m", tiny_model_path, "-o", outs[name], "--no-progress",
                       *flags)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    assert gzip.decompress(outs["fp32"].read_bytes()) == gzip.decompress(
        outs["fp32-again"].read_bytes()
    )
    source = _entries(TABLE)
    values = {}
    for name in ("cpu", "fp32", "bf16"):
        entries = _entries(outs[name])
        assert len(entries) == len(source) == 300
        for before, after in zip(source, entries, strict=True):
            assert format_entry(after._replace(scores=after.scores[:-1])) == format_entry(before)
        values[name] = np.array([float(e.scores[-1]) for e in entries])
        assert ((values[name] > 0) & (values[name] <= 1)).all()
    np.testing.assert_allclose(np.log(values["fp32"]), np.log(values["cpu"]), rtol=1e-4, atol=1e-4)
    # bf16: about 3 significant digits per product, summed over a phrase's tokens
    np.testing.assert_allclose(np.log(values["bf16"]), np.log(values["cpu"]), rtol=0.05, atol=0.1)


def test_nbest_feature_on_the_gpu_matches_the_cpu(tmp_path, tiny_model_path):
    """The device's values are the CPU's within 1e-4; io-workers (which never touch the
    device) feeding the GPU give the bytes of the GPU run without them."""
    features = {}
    for name, device, extra in (("cpu", "cpu", []), ("device", DEVICE, []),
                                ("io", DEVICE, ["--io-workers", "2"])):  # fmt: skip
        out = tmp_path / f"{name}.nbest"
        proc = run_cli("nbest", NBEST_LIST, "--source", NBEST_SRC, "-m", tiny_model_path,
                       "--device", device, "-o", out, "--no-progress", "--chunk-lines", "50",
                       *extra)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        entries = list(read_nbest(str(out)))
        assert len(entries) == 324  # the 5 sentences' distinct hypotheses
        features[name] = np.array([e.parsed_features()[-1][1][0] for e in entries])
    np.testing.assert_allclose(features["device"], features["cpu"], rtol=1e-4, atol=1e-4)
    assert (tmp_path / "io.nbest").read_bytes() == (tmp_path / "device.nbest").read_bytes()


def test_translate_on_the_gpu_gives_hypotheses_whose_scores_the_cpu_confirms(
    tmp_path, tiny_model_path
):
    src, _ = sample_pairs(8)
    path = write_lines(tmp_path / "in.en", src)
    out = tmp_path / "out.nbest"
    proc = run_cli("translate", path, "-m", tiny_model_path, "--device", DEVICE, "--beam", "4",
                   "--nbest", "2", "--length-penalty", "0", "--max-length", "8", "-o", out,
                   "--no-progress")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    groups = list(iter_nbest_groups(read_nbest(str(out))))
    assert [g[0].id for g in groups] == list(range(8))
    scorer = CpuScorer(load_model(tiny_model_path))
    for group, line in zip(groups, src, strict=True):
        values = [e.parsed_features()[0][1][0] for e in group]
        assert values == sorted(values, reverse=True)
        scored = scorer.score_phrases([line] * len(group), [e.hypothesis for e in group])
        assert list(scored.logprob) == pytest.approx(values, rel=1e-4, abs=1e-3)


@pytest.mark.parametrize("arch", ["attention", "cho"])
def test_compiled_bucketed_loss_on_cuda_equals_eager(arch):
    """``train --compile --bucket 8`` on the GPU: the compiled steps' loss and
    gradients equal the eager ones (fp32, TF32 off), and ``--chunked-output``'s too."""
    from phrasescore.model import build_network
    from phrasescore.model.config import ModelConfig
    from phrasescore.text.corpus import make_batch
    from phrasescore.training.loop import bucketed

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, embedding_dim=16, hidden_dim=32, maxout_units=16,
                      output_rank=16, dropout=0.0, src_vocab_size=50, tgt_vocab_size=1200)  # fmt: skip
    net = build_network(cfg).to(DEVICE)
    pairs = [([4, 5, 6, 7, 8], [9, 10, 11]), ([8, 9], [12]), ([10], [13, 14, 40]), ([5, 6], [9])]
    batch = bucketed(make_batch([s for s, _ in pairs], [t for _, t in pairs]), 8).to(DEVICE)
    mask = batch.tgt_out != 0

    def run():
        net.zero_grad(set_to_none=True)
        terms = net.loss_terms(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, mask)
        terms.objective.backward()
        grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
        return float(terms.nll), grads

    loss, grads = run()
    net.chunked_output = True
    loss_chunked, grads_chunked = run()
    net.chunked_output = False
    net.compile_steps()
    loss_compiled, grads_compiled = run()
    for other, other_grads in ((loss_chunked, grads_chunked), (loss_compiled, grads_compiled)):
        assert other == pytest.approx(loss, rel=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(other_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_decoder_gru_on_the_device_runs_the_fused_cell_with_the_written_values():
    """Cho's decoder (A.1.1) over 12 steps: on CUDA each step is PyTorch's fused GRU cell,
    whose states and gradients equal the written steps' (fp32, TF32 off; bf16 autocast within
    bf16's rounding of the written steps, which round every intermediate)."""
    from phrasescore.model.gru import gru_decoder_loop_step, run_gru_decoder

    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(0)
    batch, steps, hid = 64, 12, 256
    inputs = [
        torch.randn(batch, steps, 3 * hid, generator=g),
        torch.randn(batch, hid, generator=g).tanh(),
        torch.randn(hid, 3 * hid, generator=g) / hid**0.5,
        torch.randn(batch, 3 * hid, generator=g),
    ]
    inputs = [t.to(DEVICE).requires_grad_() for t in inputs]
    weights = torch.randn(batch, steps, hid, generator=g).to(DEVICE)

    def run(step, bf16=False):
        # under autocast the decoder's inputs come out of bf16 products (u stays a parameter)
        args = [t.bfloat16() if bf16 and t is not inputs[2] else t for t in inputs]
        with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
            states = run_gru_decoder(*args, step=step)
        grads = torch.autograd.grad((states.float() * weights).sum(), inputs)
        return states.float(), grads

    with OperatorCounts() as ops:
        states, grads = run(None)
    written, written_grads = run(gru_decoder_loop_step)
    if DEVICE == "cuda":
        assert ops.counts["aten._thnn_fused_gru_cell"] == steps
        assert ops.counts["aten.sigmoid"] == 0
    torch.testing.assert_close(states, written, rtol=1e-5, atol=1e-5)
    for grad, want in zip(grads, written_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-4)
    if DEVICE == "cuda":
        states_bf16, _ = run(None, bf16=True)
        written_bf16, _ = run(gru_decoder_loop_step, bf16=True)
        assert (states_bf16 - written).abs().max() <= (written_bf16 - written).abs().max() * 1.5


@pytest.mark.parametrize("arch", ["cho", "attention", "lstm", "transformer"])
def test_the_gpu_engine_replays_its_graphs_as_the_cpu_scores(arch):
    """The GPU engine (engine/graph_scoring.py), what ``rescore`` and ``nbest`` get on CUDA:
    each batch shape captured once in a CUDA graph; the table's pairs score as on the CPU
    (fp32, TF32 off), as without graphs, the same bytes on a replay, and a block waits for the
    device once (the scores' copy back), however many batches it has; nothing is captured
    again once the buffers have their size."""
    import warnings

    from phrasescore.engine.graph_scoring import CudaGraphScorer
    from phrasescore.engine.protocol import build_scorer

    from .test_device_engine import table_model, table_pairs

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    src, tgt = table_pairs()
    model = table_model(arch, "written")
    expected = CpuScorer(model).score_phrases(src, tgt).logprob
    engine = build_scorer(table_model(arch, "written"), device=DEVICE)
    if DEVICE == "cuda":
        assert isinstance(engine, CudaGraphScorer)
        engine.buckets.batch_pairs = 64  # many batches, several shapes
    engine.score_phrases(src, tgt)  # the shapes captured, the input buffers grown to size
    first = engine.score_phrases(src, tgt).logprob
    np.testing.assert_allclose(first, expected, rtol=1e-4, atol=1e-4)
    eager = CudaGraphScorer(table_model(arch, "written"), device=DEVICE, graphs=False)
    np.testing.assert_allclose(eager.score_phrases(src, tgt).logprob, first, rtol=1e-5, atol=1e-5)
    assert not eager.captured.graphs
    if DEVICE != "cuda":
        return
    assert len(engine.captured.graphs) >= 4
    ids = engine.encode_phrases(src, tgt)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again, _ = engine.score_ids(ids.src_ids, ids.tgt_ids)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= 1, [str(w.message) for w in syncs]
    assert again.tobytes() == first.tobytes()
    graphs = dict(engine.captured.graphs)
    engine.score_ids(ids.src_ids, ids.tgt_ids)
    assert engine.captured.graphs == graphs  # the same graph objects: none captured again


def test_graphs_capture_again_after_their_input_buffers_grow():
    """A block of small batches first, then blocks of larger ones: each input buffer grows
    (twice as large, the graphs captured into it dropped) and the shapes are captured again
    into the same memory pool. Every capture succeeds (no fallback to uncaptured scoring) and
    the scores stay the CPU's."""
    from phrasescore.cuda_graphs import CapturedShapes
    from phrasescore.engine.graph_scoring import CudaGraphScorer

    from .test_device_engine import table_model, table_pairs

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    src, tgt = table_pairs()
    expected = CpuScorer(table_model("cho", "written")).score_phrases(src, tgt).logprob
    engine = CudaGraphScorer(table_model("cho", "written"), device=DEVICE, batch_pairs=64)
    for n in (8, 40, 120, len(src), len(src)):
        got = engine.score_phrases(src[:n], tgt[:n]).logprob
        np.testing.assert_allclose(got, expected[:n], rtol=1e-4, atol=1e-4)
        assert engine.graph_failure is None
    if DEVICE != "cuda":
        return
    assert engine.captured.enabled and len(engine.captured.graphs) >= 2
    captured = CapturedShapes(torch.device(DEVICE))
    for rows in (16, 64, 256, 1024, 64, 16):  # three growths, then shapes captured before
        x = torch.arange(rows * 8, dtype=torch.float32, device=DEVICE).view(rows, 8)
        (out,) = captured.run(("sum", (rows, 8)), lambda v: (v.square().sum(1),), (x,))
        torch.testing.assert_close(out, x.square().sum(1))
        assert captured.failure is None and captured.enabled


@pytest.mark.parametrize("kernel", ["liger", "cce"])
def test_fused_linear_cross_entropy_libraries_equal_the_chunked_torch_output_layer(kernel):
    """liger-kernel's and cut-cross-entropy's fused output layers (CUDA, where installed) give
    the log p of the torch reference (target_logprobs: row chunks, checked against the full
    log-softmax in tests/test_device_engine.py)
    within 1e-4 in fp32, the bias included."""
    from phrasescore.model.output_layer import library_gold_logprobs, target_logprobs

    if DEVICE != "cuda":
        pytest.skip("Triton kernels: CUDA only")
    pytest.importorskip(OUTPUT_KERNEL_PACKAGES[kernel])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    vocab, width = 11_000, 500
    layer = torch.nn.Linear(width, vocab).to(DEVICE)
    features = torch.randn(3000, width, device=DEVICE)
    gold = torch.randint(0, vocab, (3000,), device=DEVICE)
    with torch.no_grad():
        expected = target_logprobs(layer, features, gold, vocab, chunk_rows=512)
        got = library_gold_logprobs(kernel, features, layer, gold)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_the_vocabulary_projection_runs_on_aligned_rows_and_no_align1_kernel():
    """On CUDA the output layer's product over a vocabulary of 10,001 words (not a multiple of
    8) runs on rows padded to 10,008 (vocabulary_logits): bf16 logits within bf16's rounding of
    the float64 product, and none of cuBLAS's one-element-at-a-time kernels (``align1``, what
    an unpadded vocabulary gets) in the profile of the product."""
    from torch.profiler import ProfilerActivity, profile

    from phrasescore.model.output_layer import vocabulary_logits

    if DEVICE != "cuda":
        pytest.skip("cuBLAS's kernels: CUDA only")
    torch.manual_seed(0)
    vocab, width = 10_001, 128
    layer = torch.nn.Linear(width, vocab).to(DEVICE, torch.bfloat16)
    features = torch.randn(4096, width, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        vocabulary_logits(layer, features)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            logits = vocabulary_logits(layer, features)
            torch.cuda.synchronize()
        exact = features.double() @ layer.weight.double().T + layer.bias.double()
    assert logits.shape == (4096, vocab) and logits.stride(0) == 10_008
    err = (logits.double() - exact).norm() / exact.norm()
    assert err < 1e-2
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels and not [k for k in kernels if "align1" in k], kernels


@pytest.mark.parametrize("kernel", ["cce", "liger"])
@pytest.mark.parametrize("graphs", [True, False])
def test_the_gpu_engine_with_a_fused_output_library_scores_as_with_torch(kernel, graphs):
    """CudaGraphScorer(output_kernel=...) on CUDA where the package is installed: the table's
    pairs score as with the torch row chunks (fp32, TF32 off), inside CUDA graphs or not."""
    from phrasescore.engine.graph_scoring import CudaGraphScorer

    from .test_device_engine import table_model, table_pairs

    if DEVICE != "cuda":
        pytest.skip("Triton kernels: CUDA only")
    pytest.importorskip(OUTPUT_KERNEL_PACKAGES[kernel])
    torch.backends.cuda.matmul.allow_tf32 = False
    src, tgt = table_pairs()
    torch_engine = CudaGraphScorer(table_model("cho", "written"), device=DEVICE, graphs=graphs)
    expected = torch_engine.score_phrases(src, tgt).logprob
    engine = CudaGraphScorer(
        table_model("cho", "written"), device=DEVICE, graphs=graphs, output_kernel=kernel
    )
    got = engine.score_phrases(src, tgt).logprob
    assert engine.graph_failure is None
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
