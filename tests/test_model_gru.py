"""The GRU equations and the Cho encoder-decoder network (no files involved)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from phrasescore.model import build_network
from phrasescore.model.config import ModelConfig
from phrasescore.model.gru import (
    gru_decoder_step,
    gru_encoder_step,
    run_gru_decoder,
    run_gru_encoder,
)


def reference_gru(x, h, W_r, W_z, W, U_r, U_z, U):
    """Cho et al. 2014 eq. 5-8, one unit at a time with Python floats."""
    hidden = len(h)

    def sigmoid(v):
        return 1.0 / (1.0 + math.exp(-v))

    def dot(row, vec):
        return sum(a * b for a, b in zip(row, vec, strict=True))

    r = [sigmoid(dot(W_r[j], x) + dot(U_r[j], h)) for j in range(hidden)]
    z = [sigmoid(dot(W_z[j], x) + dot(U_z[j], h)) for j in range(hidden)]
    rh = [r[k] * h[k] for k in range(hidden)]
    cand = [math.tanh(dot(W[j], x) + dot(U[j], rh)) for j in range(hidden)]
    return [z[j] * h[j] + (1 - z[j]) * cand[j] for j in range(hidden)]


def test_gru_encoder_step_matches_equations_5_to_8():
    g = torch.Generator().manual_seed(0)
    n_in, hid, batch = 5, 4, 3
    mats = {k: torch.randn(hid, n_in, generator=g, dtype=torch.float64) for k in ("Wr", "Wz", "W")}
    rec = {k: torch.randn(hid, hid, generator=g, dtype=torch.float64) for k in ("Ur", "Uz", "U")}
    x = torch.randn(batch, n_in, generator=g, dtype=torch.float64)
    h = torch.randn(batch, hid, generator=g, dtype=torch.float64)
    x_proj = torch.cat([x @ mats["Wr"].T, x @ mats["Wz"].T, x @ mats["W"].T], dim=1)
    u_rz = torch.cat([rec["Ur"].T, rec["Uz"].T], dim=1)
    got = gru_encoder_step(x_proj, h, u_rz, rec["U"].T)
    for b in range(batch):
        want = reference_gru(
            x[b].tolist(),
            h[b].tolist(),
            *(mats[k].tolist() for k in ("Wr", "Wz", "W")),
            *(rec[k].tolist() for k in ("Ur", "Uz", "U")),
        )
        assert got[b].tolist() == pytest.approx(want, abs=1e-12)


def _decoder_inputs(seed: int, hid: int, batch: int, steps: int | None = None):
    """Random float64 decoder inputs: x_proj [B, 3H] (or [B, T, 3H]), h [B, H], u [H, 3H] and
    ctx [B, 3H]."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, 3 * hid) if steps is None else (batch, steps, 3 * hid)
    x_proj = torch.randn(*shape, generator=g, dtype=torch.float64)
    h = torch.randn(batch, hid, generator=g, dtype=torch.float64)
    u = torch.randn(hid, 3 * hid, generator=g, dtype=torch.float64)
    ctx = torch.randn(batch, 3 * hid, generator=g, dtype=torch.float64)
    return x_proj, h, u, ctx


def test_gru_decoder_step_puts_context_in_gates_and_candidate():
    hid = 3
    x_proj, h, u, ctx = _decoder_inputs(1, hid, 2)
    got = gru_decoder_step(x_proj, h, u, ctx)
    hh = h @ u + ctx
    r = torch.sigmoid(x_proj[:, :hid] + hh[:, :hid])
    z = torch.sigmoid(x_proj[:, hid : 2 * hid] + hh[:, hid : 2 * hid])
    cand = torch.tanh(x_proj[:, 2 * hid :] + r * hh[:, 2 * hid :])
    assert torch.allclose(got, z * h + (1 - z) * cand)


def test_the_decoder_step_is_pytorchs_gru_cell_of_its_two_products():
    """The decoder's step has the equations of PyTorch's fused GRU cell (what it runs on CUDA),
    whose CPU reference is ``torch.gru_cell``: gates in the order reset, update, candidate, the
    reset gate on the recurrent product's candidate part. A row's C c enters ``torch.gru_cell``
    as its recurrent bias, W e as an input through the identity."""
    hid, batch = 5, 3
    x_proj, h, u, ctx = _decoder_inputs(3, hid, batch)
    got = gru_decoder_step(x_proj, h, u, ctx)
    identity = torch.eye(3 * hid, dtype=torch.float64)
    for b in range(batch):
        want = torch.gru_cell(x_proj[b : b + 1], h[b : b + 1], identity, u.T, None, ctx[b])
        torch.testing.assert_close(got[b : b + 1], want, rtol=0, atol=1e-12)


def test_the_decoder_loop_is_its_step_repeated():
    """``run_gru_decoder`` (each step's bias built before the loop) gives the states of
    :func:`gru_decoder_step` applied step by step."""
    hid, batch, steps = 4, 3, 6
    x_proj, h, u, ctx = _decoder_inputs(4, hid, batch, steps)
    states = run_gru_decoder(x_proj, h, u, ctx)
    assert states.shape == (batch, steps, hid)
    for t in range(steps):
        h = gru_decoder_step(x_proj[:, t], h, u, ctx)
        torch.testing.assert_close(states[:, t], h, rtol=0, atol=1e-12)


def test_padding_leaves_encoder_state_unchanged():
    g = torch.Generator().manual_seed(2)
    hid = 4
    x_proj = torch.randn(2, 5, 3 * hid, generator=g)
    u_rz, u_h = torch.randn(hid, 2 * hid, generator=g), torch.randn(hid, hid, generator=g)
    h0 = torch.zeros(2, hid)
    _, last_padded = run_gru_encoder(x_proj, h0, u_rz, u_h, torch.tensor([3, 5]))
    _, last_short = run_gru_encoder(x_proj[:1, :3], h0[:1], u_rz, u_h, None)
    assert torch.allclose(last_padded[0], last_short[0])


def _tiny_network(dropout=0.0):
    torch.manual_seed(0)
    cfg = ModelConfig(
        embedding_dim=8,
        hidden_dim=12,
        maxout_units=6,
        output_rank=5,
        dropout=dropout,
        src_vocab_size=20,
        tgt_vocab_size=17,
    )
    return build_network(cfg)


def test_initialisation_follows_the_paper():
    net = _tiny_network()
    u = net.enc_u_h.detach()
    assert torch.allclose(u @ u.T, torch.eye(u.shape[0]), atol=1e-5)  # orthogonal
    assert net.out_hidden.bias.abs().max() == 0
    assert 0.005 < float(net.dec_input.weight.detach().std()) < 0.02  # N(0, 0.01^2)


def test_gradients_reach_every_parameter():
    net = _tiny_network()
    src = torch.tensor([[4, 5, 6, 3], [7, 8, 3, 0]])
    src_len = torch.tensor([4, 3])
    tgt_in = torch.tensor([[2, 9, 10], [2, 11, 0]])
    tgt_out = torch.tensor([[9, 10, 3], [11, 3, 0]])
    loss = net.loss(src, src_len, tgt_in, tgt_out, tgt_out != 0)
    loss.backward()
    for name, param in net.named_parameters():
        assert param.grad is not None, name
        assert float(param.grad.abs().sum()) > 0, name


def test_token_logprobs_equal_log_softmax_and_stepwise_decoding():
    net = _tiny_network().eval()
    src = torch.tensor([[4, 5, 6, 3]])
    enc = net.encode(src, torch.tensor([4]))
    tgt_in = torch.tensor([[2, 9, 10]])
    tgt_out = torch.tensor([[9, 10, 3]])
    lp = net.token_logprobs(enc, tgt_in, tgt_out, chunk_rows=2)
    full = torch.log_softmax(net.logits(net.decode_features(enc, tgt_in)), dim=-1)
    want = full.gather(2, tgt_out[..., None]).squeeze(-1)
    assert torch.allclose(lp, want, atol=1e-6)
    state = net.start(enc)
    steps = []
    for t in range(3):
        features, state = net.step(state, tgt_in[:, t])
        steps.append(torch.log_softmax(net.logits(features), -1)[0, tgt_out[0, t]])
    assert torch.allclose(torch.stack(steps), want[0], atol=1e-6)


def test_fan_in_init_gives_unit_embeddings_and_cho_keeps_the_paper_scale():
    """``init="fan_in"`` uses PyTorch's scales (unit embeddings, zero PAD, output weights within
    1/sqrt(rank), an orthogonal U) and the default keeps the paper's N(0, 0.01²): with Adam the
    paper's scale holds phrase-table training at the unigram perplexity for its first updates
    (docs/benchmarks.md, "Which model to train for the column (history)")."""
    sizes = dict(src_vocab_size=300, tgt_vocab_size=400)
    torch.manual_seed(0)
    cho = build_network(ModelConfig(**sizes))
    torch.manual_seed(0)
    fan_in = build_network(ModelConfig(init="fan_in", **sizes))
    assert float(cho.src_embed.weight[1:].detach().std()) == pytest.approx(0.01, rel=0.05)
    assert float(cho.out_vocab.bias.detach().abs().max()) == 0.0
    assert float(fan_in.src_embed.weight[1:].detach().std()) == pytest.approx(1.0, rel=0.05)
    assert float(fan_in.tgt_embed.weight[0].detach().abs().max()) == 0.0  # PAD stays zero
    bound = 1.0 / math.sqrt(fan_in.config.output_rank)
    assert float(fan_in.out_vocab.weight.detach().abs().max()) <= bound
    assert float(fan_in.out_vocab.weight.detach().std()) == pytest.approx(
        bound / math.sqrt(3), rel=0.05
    )
    hid = fan_in.config.hidden_dim
    block = fan_in.dec_u.detach()[:, :hid]
    assert torch.allclose(block.T @ block, torch.eye(hid), atol=1e-4)  # still orthogonal
    with pytest.raises(ValueError, match="unknown init"):
        build_network(ModelConfig(init="xavier", **sizes))


def _as_on_a_gpu(kernel):
    """The GPU's output-layer kernel run on the CPU: compiled by torch.compile where it compiles
    here, else its own code run eagerly (the same operations, uncompiled)."""
    if os.environ.get("PHRASESCORE_NO_COMPILE"):
        return kernel
    try:
        compiled = torch.compile(kernel, dynamic=True)
        compiled(*_KERNEL_PROBE[kernel.__name__]())
        return compiled
    except Exception:  # noqa: BLE001 - no compiler on this machine
        return kernel


_KERNEL_PROBE = {
    "_lse_gather": lambda: (torch.randn(3, 1100), torch.tensor([0, 1, 2])),
    "_log_z_rows": lambda: (torch.randn(3, 1100),),
    "_exact_log_z_rows": lambda: (torch.randn(3, 1100),),
}


def test_the_cpu_scores_with_the_eager_log_softmax_and_the_gpus_kernel_agrees():
    """On the CPU the output layer is PyTorch's log-softmax (nothing compiled); the GPU's one-pass
    log-sum-exp and gather (its kernel, compiled where it compiles) gives the same log p within
    1e-5, fp32 and bf16 logits, over several row chunks."""
    from phrasescore.model import output_layer
    from phrasescore.model.output_layer import FUSED_MIN_VOCAB, _eager_lse_gather, target_logprobs

    torch.manual_seed(0)
    vocab = FUSED_MIN_VOCAB
    weight = torch.randn(vocab, 8)
    rows, gold = torch.randn(37, 8), torch.randint(0, vocab, (37,))
    kernel = _as_on_a_gpu(output_layer._lse_gather)
    compiled_before = dict(output_layer._compiled)
    for dtype in (torch.float32, torch.bfloat16):
        w, x = weight.to(dtype), rows.to(dtype)
        got = target_logprobs(lambda f, w=w: f @ w.T, x, gold, vocab, chunk_rows=16)
        want = _eager_lse_gather(x @ w.T, gold)
        assert got.dtype == torch.float32
        assert torch.equal(got, want)  # the CPU's own path: the eager log-softmax
        on_gpu = torch.cat([kernel(x[i : i + 16] @ w.T, gold[i : i + 16]) for i in (0, 16, 32)])
        assert torch.allclose(on_gpu, want, atol=1e-5), (dtype, (on_gpu - want).abs().max())
    assert output_layer._compiled == compiled_before  # the CPU compiled nothing


def test_fused_output_layer_rows_whose_maximum_is_far_outside_the_shift_columns(monkeypatch):
    """The GPU's log-sum-exp is shifted by the maximum of the first SHIFT_COLUMNS logits; a row
    with a logit 200 above them overflows fp32's exp and is computed again the usual way (the
    GPU's kernel run here in place of the CPU's log-softmax)."""
    from phrasescore.model import output_layer
    from phrasescore.model.output_layer import (
        FUSED_MIN_VOCAB,
        SHIFT_COLUMNS,
        _eager_lse_gather,
        fused_logsumexp_gather,
    )

    kernel = _as_on_a_gpu(output_layer._lse_gather)
    monkeypatch.setattr(output_layer, "_run_kernel", lambda _kernel, _vocab, *args: kernel(*args))
    torch.manual_seed(1)
    logits = torch.randn(6, FUSED_MIN_VOCAB + 100)
    logits[1, SHIFT_COLUMNS + 7] = 200.0  # far above the head: exp would overflow
    logits[4, -1] = 60.0  # above the head, within exp's range: no second pass needed
    gold = torch.tensor([3, SHIFT_COLUMNS + 7, 0, 9, 2, 5])
    assert not torch.isfinite(kernel(logits, gold)).all()
    got = fused_logsumexp_gather(logits, gold)
    want = _eager_lse_gather(logits, gold)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert got[1] == pytest.approx(0.0, abs=1e-5) and got[4] < -55.0


def test_the_gpus_log_z_kernel_is_finite_without_a_second_look():
    """On a GPU the training loss's log Z is shifted by each row's maximum
    (``_exact_log_z_rows``, compiled from 1,024 words): finite where the head shift
    (``_log_z_rows``) overflows (a logit 200 above the head), and logsumexp's value, in fp32 and
    bf16."""
    from phrasescore.model import output_layer
    from phrasescore.model.output_layer import FUSED_MIN_VOCAB, SHIFT_COLUMNS

    torch.manual_seed(2)
    logits = torch.randn(6, FUSED_MIN_VOCAB + 100)
    logits[1, SHIFT_COLUMNS + 7] = 200.0
    assert not torch.isfinite(_as_on_a_gpu(output_layer._log_z_rows)(logits)).all()
    exact = _as_on_a_gpu(output_layer._exact_log_z_rows)
    for dtype in (torch.float32, torch.bfloat16):
        x = logits.to(dtype)
        got = exact(x)
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        torch.testing.assert_close(got, torch.logsumexp(x.float(), 1), rtol=1e-6, atol=1e-5)


def test_token_nll_gives_cross_entropys_loss_and_gradient_also_through_log_z():
    """The training loss (output_layer.token_nll, its own backward) against PyTorch's cross_entropy and
    logsumexp: the summed NLL, log Z and the gradient of NLL / N + α Σ (log Z)² (Devlin et al.'s
    self-normalisation), on real-sized logits."""
    from phrasescore.model.output_layer import token_nll

    torch.manual_seed(0)
    logits = (3 * torch.randn(50, 1200, dtype=torch.float64)).requires_grad_()
    gold = torch.randint(0, 1200, (50,))
    nll, log_z = token_nll(logits, gold)
    (nll / 50 + 0.1 * log_z.square().sum()).backward()
    ours = logits.grad.clone()
    logits.grad = None
    want_nll = torch.nn.functional.cross_entropy(logits, gold, reduction="sum")
    want_log_z = torch.logsumexp(logits, 1)
    (want_nll / 50 + 0.1 * want_log_z.square().sum()).backward()
    assert float(nll) == pytest.approx(float(want_nll), rel=1e-12)
    assert torch.allclose(log_z, want_log_z)
    assert torch.allclose(ours, logits.grad, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda x: token_nll(x, gold[:4] % 7)[0],
        torch.randn(4, 7, dtype=torch.float64).requires_grad_(),
    )


@pytest.mark.parametrize("vocab", [1201, 1200])
def test_the_vocabulary_projection_padded_for_cublas_gives_the_same_logits_and_gradients(vocab):
    """vocabulary_logits with the alignment CUDA gets (forced here on the CPU): a vocabulary of
    1,201 words runs on W and b padded to 1,208 rows and returns the first 1,201 columns, the
    same logits and the same gradients for the features, W and b as the plain layer (float64);
    1,200 words need no padding; on the CPU by default it is the layer itself, bit for bit."""
    from phrasescore.model.output_layer import vocabulary_logits

    torch.manual_seed(0)
    layer = torch.nn.Linear(24, vocab).double()
    features = torch.randn(3, 5, 24, dtype=torch.float64, requires_grad=True)
    gold = torch.randint(0, vocab, (15,))
    grads = []
    for align in (1, 8):
        logits = vocabulary_logits(layer, features, align)
        assert logits.shape == (3, 5, vocab)
        padded = -(-vocab // 8) * 8 if align == 8 else vocab
        assert logits.stride(1) == padded  # the rows of the padded product, viewed
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), gold)
        params = (features, layer.weight, layer.bias)
        grads.append((logits.detach(), *torch.autograd.grad(loss, params)))
    for plain, padded in zip(*grads, strict=True):
        assert plain.shape == padded.shape
        torch.testing.assert_close(padded, plain, rtol=1e-12, atol=1e-12)
    on_cpu = vocabulary_logits(layer, features)
    assert torch.equal(on_cpu, layer(features)) and on_cpu.is_contiguous()
