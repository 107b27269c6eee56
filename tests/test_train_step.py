"""The training step's update: one optimiser call and foreach clipping over all the parameters,
with the arithmetic of PyTorch's per-parameter loops, to the bit."""

from __future__ import annotations

import pytest
import torch

from phrasescore.model import build_network
from phrasescore.model.config import TrainConfig, preset
from phrasescore.text.corpus import make_batch
from phrasescore.text.vocab import WordVocabulary
from phrasescore.training.loop import clip_gradients, make_optimizer

from .conftest import OperatorCounts, sample_pairs


def _network_and_batch(arch: str = "attention"):
    """A tiny network of ``arch`` and a batch of 24 real Multi30k pairs."""
    src, tgt = sample_pairs(24)
    src_words, tgt_words = [s.split() for s in src], [t.split() for t in tgt]
    src_vocab, tgt_vocab = WordVocabulary.build(src_words), WordVocabulary.build(tgt_words)
    config, _ = preset("tiny", arch)
    config.src_vocab_size, config.tgt_vocab_size = len(src_vocab), len(tgt_vocab)
    torch.manual_seed(0)
    network = build_network(config)
    batch = make_batch(
        [src_vocab.encode(s) for s in src_words], [tgt_vocab.encode(t) for t in tgt_words]
    )
    return network, batch


def _backward(network, batch) -> None:
    network.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks
    mask = batch.tgt_out != 0
    terms = network.loss_terms(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, mask)
    (terms.objective / batch.n_tgt_tokens).backward()


@pytest.mark.parametrize("max_norm", [1e-3, 1e3])
def test_clipping_scales_the_gradients_as_torch_s_loop_to_the_bit(max_norm):
    """Foreach clipping gives the per-parameter loop's gradients, scaled (a small max_norm) or
    left as they are (a large one)."""
    network, batch = _network_and_batch()
    params = list(network.parameters())
    _backward(network, batch)
    grads = [p.grad.clone() for p in params]
    torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
    want = [p.grad.clone() for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    clip_gradients(params, max_norm)
    assert all(torch.equal(p.grad, w) for p, w in zip(params, want, strict=True))
    total = torch.linalg.vector_norm(torch.stack([g.norm() for g in want]))
    assert float(total) == pytest.approx(min(max_norm, float(torch.stack(
        [g.norm() for g in grads]).norm())), rel=1e-4)  # fmt: skip


@pytest.mark.parametrize("optimizer", ["adadelta", "sgd"])
def test_foreach_optimisers_update_as_the_per_parameter_loop_to_the_bit(optimizer):
    """Three updates of make_optimizer's Adadelta and SGD (foreach) on real gradients give the
    weights of PyTorch's per-parameter loop (foreach=False) exactly."""
    network, batch = _network_and_batch()
    tcfg = TrainConfig(optimizer=optimizer, learning_rate=0.5)
    start = {n: p.detach().clone() for n, p in network.named_parameters()}
    opt = make_optimizer(network, tcfg)
    assert opt.param_groups[0]["foreach"] is True
    loop_kw = dict(lr=0.5, foreach=False)
    if optimizer == "adadelta":
        loop_kw.update(rho=tcfg.adadelta_rho, eps=tcfg.adadelta_eps)
    results = []
    for make in (lambda: opt, lambda: type(opt)(network.parameters(), **loop_kw)):
        with torch.no_grad():
            for n, p in network.named_parameters():
                p.copy_(start[n])
        this = make()
        for _ in range(3):
            _backward(network, batch)
            this.step()
        results.append({n: p.detach().clone() for n, p in network.named_parameters()})
    moved = [n for n in start if not torch.equal(start[n], results[0][n])]
    assert len(moved) > len(start) // 2
    for name, value in results[0].items():
        assert torch.equal(value, results[1][name]), name


@pytest.mark.parametrize("optimizer", ["adam", "adadelta", "sgd"])
def test_an_update_is_one_optimiser_call_and_one_clipping_pass(optimizer):
    """Clipping and the optimiser dispatch a fixed number of operators whatever the number of
    parameter tensors: one norm, one scaling, one optimiser kernel (Adam's fused kernel) or one
    call per foreach operation, never an operator per parameter (after the first update,
    which makes the optimiser's state)."""
    network, batch = _network_and_batch()
    params = list(network.parameters())
    assert len(params) > 10
    opt = make_optimizer(network, TrainConfig(optimizer=optimizer))
    _backward(network, batch)
    opt.step()  # the first makes the optimiser's state, a tensor or two per parameter
    _backward(network, batch)
    with OperatorCounts() as ops:
        clip_gradients(params, 1.0)
        opt.step()
    per_parameter = {k: v for k, v in ops.counts.items() if v >= len(params)}
    assert not per_parameter, per_parameter
    assert ops.counts["aten._foreach_norm"] == 1
    assert ops.counts["aten._foreach_mul_"] >= 1
    if optimizer == "adam":
        assert ops.counts["aten._fused_adam_"] == 1


def test_deterministic_cuda_kernels_without_filling_every_new_tensor(monkeypatch):
    """deterministic_kernels for a CUDA device (flags only: nothing touches a GPU): cuDNN's and
    PyTorch's deterministic algorithms on, PyTorch's NaN filling of each new tensor's memory
    (which deterministic mode turns on too, one more kernel per allocation) off; on the CPU
    nothing changes. The flags are restored afterwards."""
    import torch.utils.deterministic as fill

    from phrasescore.hardware import deterministic_kernels

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        fill.fill_uninitialized_memory,
    )
    try:
        deterministic_kernels(torch.device("cpu"))
        assert not torch.are_deterministic_algorithms_enabled() or saved[0]
        torch.use_deterministic_algorithms(True)  # what deterministic mode does alone
        assert fill.fill_uninitialized_memory
        deterministic_kernels(torch.device("cuda"))
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert not fill.fill_uninitialized_memory
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:4]
        fill.fill_uninitialized_memory = saved[4]
