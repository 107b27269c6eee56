"""train --bucket (batches padded to repeating shapes) and train --compile (the recurrences'
steps through torch.compile): the same loss and gradients as the plain eager batch."""

from __future__ import annotations

import os

import pytest
import torch

from phrasescore.model import build_network
from phrasescore.model.config import ModelConfig
from phrasescore.text.corpus import make_batch
from phrasescore.training.loop import bucketed

PAIRS = [([4, 5, 6, 7], [9, 10, 11]), ([8, 9], [12]), ([10], [13, 14]), ([5, 6, 7], [9, 9, 15])]


def _network(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        arch=arch,
        embedding_dim=8,
        hidden_dim=12,
        maxout_units=6,
        output_rank=5,
        dropout=0.0,
        src_vocab_size=20,
        tgt_vocab_size=17,
    )
    return build_network(cfg)


def _loss_and_grads(net, batch):
    net.zero_grad(set_to_none=True)
    mask = batch.tgt_out != 0
    terms = net.loss_terms(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, mask)
    terms.objective.backward()
    nll = terms.nll
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    return float(nll), grads


def test_bucketed_batch_shapes():
    batch = make_batch([s for s, _ in PAIRS], [t for _, t in PAIRS])
    padded = bucketed(batch, 8)
    assert padded.src.shape == (8, 8) and padded.tgt_in.shape == (8, 8)
    assert padded.n_tgt_tokens == batch.n_tgt_tokens
    assert int((padded.tgt_out != 0).sum()) == batch.n_tgt_tokens
    assert padded.src_lengths.tolist()[4:] == [1, 1, 1, 1]
    assert bucketed(batch, 0) is batch


@pytest.mark.parametrize("arch", ["attention", "cho", "lstm"])
def test_bucketed_loss_equals_plain(arch):
    """Padding rows and positions changes neither the loss nor the gradients (float32, within
    rounding): what ``--bucket`` trains on is the batch's own objective."""
    net = _network(arch)
    batch = make_batch([s for s, _ in PAIRS], [t for _, t in PAIRS])
    loss, grads = _loss_and_grads(net, batch)
    loss_b, grads_b = _loss_and_grads(net, bucketed(batch, 8))
    assert loss_b == pytest.approx(loss, rel=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def _compiles() -> bool:
    if os.environ.get("PHRASESCORE_NO_COMPILE"):
        return False
    try:
        fn = torch.compile(lambda x: torch.tanh(x) * 2)
        fn(torch.ones(2))
        return True
    except Exception:  # noqa: BLE001 - no compiler on this machine
        return False


@pytest.mark.parametrize("arch", ["attention", "cho"])
def test_compiled_steps_equal_eager(arch):
    """``train --compile``: the compiled steps (attention: the whole decoder step and the
    encoder's GRU step; cho: both GRUs' steps, eq. 5-8 and A.1.1) give the eager loss and
    gradients within float32 rounding, on bucketed batches. Compiling takes tens of seconds on
    a busy 2-core CPU: slow, but the real compiler."""
    if not _compiles():
        pytest.skip("torch.compile does not work on this machine")
    net = _network(arch)
    batch = bucketed(make_batch([s for s, _ in PAIRS], [t for _, t in PAIRS]), 8)
    loss, grads = _loss_and_grads(net, batch)
    net.compile_steps()
    assert net.compiled
    loss_c, grads_c = _loss_and_grads(net, batch)
    assert loss_c == pytest.approx(loss, rel=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("vocab", [17, 2000])
def test_chunked_output_equals_token_nll(vocab):
    """``train --chunked-output``: the loss, log Z and the gradients of the features, the
    weight and the bias equal :func:`token_nll` of the whole logits (float32, within rounding),
    with a self-normalisation term on log Z too; chunks of 3 rows (the last one short)."""
    from phrasescore.model.output_layer import chunked_output_nll, token_nll

    torch.manual_seed(3)
    layer = torch.nn.Linear(6, vocab)
    features = torch.randn(10, 6, requires_grad=True)
    gold = torch.randint(0, vocab, (10,))
    results = []
    for chunked in (False, True):
        layer.zero_grad()
        features.grad = None
        if chunked:
            nll, lz = chunked_output_nll(features, layer, gold, chunk_rows=3)
        else:
            nll, lz = token_nll(layer(features), gold)
        (nll + 0.1 * lz.square().sum()).backward()
        results.append(
            (nll.detach(), lz.detach(), features.grad, layer.weight.grad, layer.bias.grad)
        )
    for plain, chunked in zip(*results, strict=True):
        torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-6)


def test_chunked_output_in_training_loss():
    """The network's loss with ``chunked_output`` equals the plain one (attention, float32)."""
    net = _network("attention")
    batch = make_batch([s for s, _ in PAIRS], [t for _, t in PAIRS])
    loss, grads = _loss_and_grads(net, batch)
    net.chunked_output = True
    loss_c, grads_c = _loss_and_grads(net, batch)
    assert loss_c == pytest.approx(loss, rel=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-5, atol=1e-6, msg=name)
