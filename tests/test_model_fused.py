"""``recurrence="fused"``: the torch.nn.GRU encoders of cho and attention against a
written-out reference of cuDNN's GRU, padding, gradients, learning, model files, refusals, and
(with a GPU) the same on CUDA."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from phrasescore.bundle import FORMAT, FORMAT_VERSION, load_model, read_metadata
from phrasescore.engine.scoring import PairScorer
from phrasescore.errors import ModelFileError
from phrasescore.model import build_network
from phrasescore.model.checkpoint import save_network_file
from phrasescore.model.config import ModelConfig
from phrasescore.model.gru import run_fused_gru
from phrasescore.training.run_identity import identity_difference

from .conftest import run_cli, sample_pairs, train_tiny, write_lines
from .test_model_lstm import run_every_command, save_load_identical

SRC = torch.tensor([[4, 5, 6, 7, 3], [8, 9, 3, 0, 0], [10, 3, 0, 0, 0]])
SRC_LEN = torch.tensor([5, 3, 2])
TGT_IN = torch.tensor([[2, 9, 10, 11], [2, 12, 0, 0], [2, 13, 14, 0]])
HIDDEN = 12


def cudnn_gru_reference(x, length, w_ih, w_hh, b_ih, b_hh, reverse=False, h0=None):
    """cuDNN's GRU (torch.nn.GRU's documentation) written out for one row ``x`` [S, E] of
    ``length`` real positions, from ``h0`` (default 0): (states [S, H], 0 after ``length``; the
    last state)::

        r = σ(W_ir x + b_ir + W_hr h + b_hr),  z = σ(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = (1 - z) ⊙ n + z ⊙ h
    """
    hidden = w_hh.shape[1]
    h = x.new_zeros(hidden) if h0 is None else h0
    states = [x.new_zeros(hidden)] * x.shape[0]
    order = range(length - 1, -1, -1) if reverse else range(length)
    for t in order:
        gi, gh = w_ih @ x[t] + b_ih, w_hh @ h + b_hh
        r = torch.sigmoid(gi[:hidden] + gh[:hidden])
        z = torch.sigmoid(gi[hidden : 2 * hidden] + gh[hidden : 2 * hidden])
        n = torch.tanh(gi[2 * hidden :] + r * gh[2 * hidden :])
        h = (1 - z) * n + z * h
        states[t] = h
    return torch.stack(states), h


def _weights(gru, suffix=""):
    return [getattr(gru, f"{name}_l0{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]  # fmt: skip


def _network(arch, recurrence="fused", dtype=torch.float64):
    """A small network whose weights are N(0, 0.5²) (clearly non-linear gates), in ``dtype``."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch=arch, embedding_dim=8, hidden_dim=HIDDEN, maxout_units=6, output_rank=5,
        dropout=0.0, src_vocab_size=20, tgt_vocab_size=17, recurrence=recurrence,
    )  # fmt: skip
    net = build_network(cfg)
    for param in net.parameters():
        torch.nn.init.normal_(param, 0.0, 0.5)
    with torch.no_grad():
        net.src_embed.weight[0].zero_()
        net.tgt_embed.weight[0].zero_()
    return net.to(dtype).eval()


def _reference_encoding(net, src, lengths):
    """What the fused encoder of ``net`` must give, from :func:`cudnn_gru_reference` row by row:
    cho: {"c"}; attention: {"ann", "first_back"}."""
    x = net.src_embed(src)
    rows = []
    for b in range(src.shape[0]):
        n = int(lengths[b])
        fwd, last = cudnn_gru_reference(x[b], n, *_weights(net.encoder))
        if net.config.arch == "cho":
            rows.append({"c": torch.tanh(net.summary(last))})
            continue
        bwd, _ = cudnn_gru_reference(x[b], n, *_weights(net.encoder, "_reverse"), reverse=True)
        rows.append({"ann": torch.cat([fwd, bwd], 1), "first_back": bwd[0]})
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


# ---------------------------------------------------------------------------- equality
@pytest.mark.parametrize("arch", ["cho", "attention"])
def test_fused_encoder_equals_the_written_out_cudnn_gru_and_ignores_padding(arch):
    net = _network(arch)
    assert isinstance(net.encoder, torch.nn.GRU) and not hasattr(net, "enc_input")
    with torch.no_grad():
        enc = net.encode(SRC, SRC_LEN)
        expected = _reference_encoding(net, SRC, SRC_LEN)
        for key, value in expected.items():
            torch.testing.assert_close(enc[key], value, rtol=1e-9, atol=1e-9)
        # each sentence alone (no padding at all) gives its row of the padded batch
        for b in range(SRC.shape[0]):
            n = int(SRC_LEN[b])
            alone = net.encode(SRC[b : b + 1, :n], SRC_LEN[b : b + 1])
            for key in expected:
                row = enc[key][b : b + 1]
                torch.testing.assert_close(alone[key], row[:, :n] if row.dim() == 3 else row)
        if arch == "attention":
            assert float(enc["ann"][1, 3:].abs().max()) == 0.0  # padded annotations are 0
            assert enc["mask"].tolist()[2] == [True, True, False, False, False]


@pytest.mark.parametrize("arch", ["cho", "attention"])
def test_fused_scores_do_not_depend_on_padding_in_float32(arch):
    net = _network(arch, dtype=torch.float32)
    tgt_out = torch.tensor([[9, 10, 11, 3], [12, 3, 0, 0], [13, 14, 3, 0]])
    with torch.no_grad():
        batch = net.token_logprobs(net.encode(SRC, SRC_LEN), TGT_IN, tgt_out, tgt_out != 0)
        for b in range(SRC.shape[0]):
            n, m = int(SRC_LEN[b]), int((tgt_out[b] != 0).sum())
            enc = net.encode(SRC[b : b + 1, :n], SRC_LEN[b : b + 1])
            alone = net.token_logprobs(enc, TGT_IN[b : b + 1, :m], tgt_out[b : b + 1, :m])
            torch.testing.assert_close(alone[0], batch[b, :m], rtol=1e-5, atol=1e-5)


def test_fused_and_written_are_different_functions_of_the_same_weights():
    """The written GRU with the fused one's weights (b_h = 0) differs: reset gate before U
    (Cho et al. eq. 8) against after it (cuDNN); the two agree only where r = 1."""
    fused, written = _network("cho"), _network("cho", "written")
    w_ih, w_hh, b_ih, _ = _weights(fused.encoder)
    with torch.no_grad():
        fused.encoder.bias_hh_l0.zero_()
        shared = dict(fused.named_parameters())
        for name, param in written.named_parameters():
            if name in shared:
                param.copy_(shared[name])
        written.enc_input.weight.copy_(w_ih)
        written.enc_input.bias.copy_(b_ih)
        written.enc_u_rz.copy_(w_hh[: 2 * HIDDEN].T)
        written.enc_u_h.copy_(w_hh[2 * HIDDEN :].T)
        gap = (fused.encode(SRC, SRC_LEN)["c"] - written.encode(SRC, SRC_LEN)["c"]).abs().max()
        assert float(gap) > 1e-3
        # with every reset gate open (r = 1: a huge b_r) the two formulations coincide
        fused.encoder.bias_ih_l0[:HIDDEN].fill_(1e3)
        written.enc_input.bias[:HIDDEN].fill_(1e3)
        torch.testing.assert_close(
            fused.encode(SRC, SRC_LEN)["c"], written.encode(SRC, SRC_LEN)["c"]
        )


def test_fused_cho_decoder_is_a_gru_over_the_previous_word_and_c():
    """cho's fused decoder: the cuDNN GRU over [e(y_{t-1}); c] from h'_0 = tanh(V' c), then
    the unchanged output layer; one step at a time (generation) gives the same features."""
    net = _network("cho")
    assert isinstance(net.decoder, torch.nn.GRU) and not hasattr(net, "dec_u")
    with torch.no_grad():
        enc = net.encode(SRC, SRC_LEN)
        features = net.decode_features(enc, TGT_IN)
        c = enc["c"]
        steps = TGT_IN.shape[1]
        for b in range(SRC.shape[0]):
            prev_emb = net.tgt_embed(TGT_IN[b])
            x = torch.cat([prev_emb, c[b].expand(steps, -1)], dim=1)
            h0 = torch.tanh(net.dec_init(c[b]))
            states, _ = cudnn_gru_reference(x, steps, *_weights(net.decoder), h0=h0)
            expected = net._output_features(states, prev_emb, net.out_context(c[b]))
            torch.testing.assert_close(features[b], expected, rtol=1e-9, atol=1e-9)
        state = net.start(enc)
        for t in range(steps):
            step_features, state = net.step(state, TGT_IN[:, t])
            torch.testing.assert_close(step_features, features[:, t], rtol=1e-9, atol=1e-9)


def test_fused_cho_counts_c_per_target_token():
    """The fused decoder multiplies C c at every target token (its input is [e(y); c]), the
    written one once per pair: 3H² multiply-adds per token but the first."""
    fused, written = _network("cho"), _network("cho", "written")
    extra = fused.scoring_flops(5, 10) - written.scoring_flops(5, 10)
    assert extra == pytest.approx(2 * 3 * HIDDEN * HIDDEN * (10 - 1))


# ---------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("bidirectional", [False, True])
def test_fused_gradients_equal_the_reference_gradients(bidirectional):
    torch.manual_seed(1)
    gru = torch.nn.GRU(5, 4, batch_first=True, bidirectional=bidirectional).double()
    x = torch.randn(3, 6, 5, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 2, 4])
    out_weight = torch.randn(3, 6, 8 if bidirectional else 4, dtype=torch.float64)
    last_weight = torch.randn(2 if bidirectional else 1, 3, 4, dtype=torch.float64)

    outputs, last = run_fused_gru(gru, x, lengths)
    ((outputs * out_weight).sum() + (last * last_weight).sum()).backward()
    fused = [x.grad.clone()] + [p.grad.clone() for p in gru.parameters()]

    x.grad = None
    gru.zero_grad()
    directions = [("", False)] + ([("_reverse", True)] if bidirectional else [])
    total = x.new_zeros(())
    for d, (suffix, reverse) in enumerate(directions):
        for b in range(3):
            states, h = cudnn_gru_reference(
                x[b], int(lengths[b]), *_weights(gru, suffix), reverse=reverse
            )
            total = total + (states * out_weight[b, :, 4 * d : 4 * d + 4]).sum()
            total = total + (h * last_weight[d, b]).sum()
    total.backward()
    reference = [x.grad] + [p.grad for p in gru.parameters()]
    assert len(fused) == len(reference) == (9 if bidirectional else 5)
    for got, want in zip(fused, reference, strict=True):
        assert float(want.abs().max()) > 0
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


# ---------------------------------------------------------------------------- learning, files
class _TrainedModels(dict):
    """{(arch, recurrence): (path, TrainResult)}, each model trained when a test first asks for
    it: a test pays only for the models it reads (under ``pytest -n 2`` the module's tests are
    spread over both processes, each with its own copy of the module's fixture)."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder
        src, tgt = sample_pairs()
        self.s, self.t = write_lines(folder / "s.en", src), write_lines(folder / "s.fr", tgt)

    def __missing__(self, key):
        arch, recurrence = key
        path = self.folder / f"{arch}-{recurrence}.safetensors"
        result = train_tiny(
            path, self.s, self.t, valid=(self.s, self.t), arch=arch,
            model_overrides={"recurrence": recurrence}, max_steps=60, valid_every=20,
            learning_rate=1e-2, seed=3,
        )  # fmt: skip
        self[key] = (str(path), result)
        return self[key]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny cho and attention models, fused and written, 60 updates on the 171 sample
    pairs (validated on them): {(arch, recurrence): (path, TrainResult)}, trained on demand."""
    return _TrainedModels(tmp_path_factory.mktemp("fused"))


@pytest.mark.parametrize("arch", ["cho", "attention"])
def test_fused_model_learns_like_the_written_one(trained, arch):
    path, fused = trained[arch, "fused"]
    _, written = trained[arch, "written"]
    assert fused.unigram_valid_ppl > 100
    # margins around the perplexities in docs/benchmarks.md, "Fused recurrences"
    assert fused.best_valid_ppl < fused.unigram_valid_ppl / 2.5
    assert fused.best_valid_ppl < 1.3 * written.best_valid_ppl
    model = load_model(path)
    assert model.config.recurrence == "fused"
    assert isinstance(model.network.encoder, torch.nn.GRU)
    assert load_model(trained[arch, "written"][0]).config.recurrence == "written"


@pytest.mark.parametrize("arch", ["cho", "attention"])
def test_fused_model_file_round_trip_and_every_command(trained, tmp_path, arch):
    path, _ = trained[arch, "fused"]
    save_load_identical(path, tmp_path)
    run_every_command(path, tmp_path)


def _rewrite_config(model, path, change):
    """``model`` saved at ``path`` with its configuration JSON edited by ``change``."""
    core = model.core()
    config = json.loads(core["config"])
    change(config)
    core["config"] = json.dumps(config, sort_keys=True)
    save_network_file(path, model.network, core, model.info, FORMAT, FORMAT_VERSION)


def test_files_without_the_field_load_as_written_and_unknown_values_are_refused(trained, tmp_path):
    model = load_model(trained["cho", "written"][0])
    old = str(tmp_path / "old.safetensors")
    _rewrite_config(model, old, lambda config: config.pop("recurrence"))
    assert "recurrence" not in json.loads(read_metadata(old)["config"])
    loaded = load_model(old)
    assert loaded.config.recurrence == "written"
    pairs = sample_pairs(10)
    np.testing.assert_array_equal(
        PairScorer(loaded).score_phrases(*pairs).logprob,
        PairScorer(model).score_phrases(*pairs).logprob,
    )
    for value in ("cudnn", "fused"):  # unknown; fused with the written encoder's weights
        bad = str(tmp_path / f"{value}.safetensors")
        _rewrite_config(model, bad, lambda config, v=value: config.update(recurrence=v))
        with pytest.raises(ModelFileError) as error:
            load_model(bad)
        assert len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--arch", "attention", "--preset", "paper"], "refused with --preset paper"),
        (["--arch", "cho", "--preset", "paper"], "refused with --preset paper"),
        (["--arch", "lstm"], "torch.nn.LSTM already"),
    ],
)
def test_train_refuses_fused_in_one_line(tmp_path, corpus_files, flags, message):
    out = tmp_path / "m.safetensors"
    result = run_cli("train", *corpus_files, "-o", out, "--recurrence", "fused", *flags)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "--recurrence fused" in lines[0]
    assert not out.exists()


def test_resume_recipe_without_the_flag_means_written():
    saved = {"files": {}, "flags": {"--arch": "attention"}, "settings": {}}
    written = {"files": {}, "flags": {"--arch": "attention", "--recurrence": "written"}}
    fused = {"files": {}, "flags": {"--arch": "attention", "--recurrence": "fused"}}
    assert identity_difference(saved, {**written, "settings": {}}, "m.checkpoint") is None
    line = identity_difference(saved, {**fused, "settings": {}}, "m.checkpoint")
    assert line == (
        "--resume: m.checkpoint was trained with --recurrence written, this run has "
        "--recurrence fused"
    )


# ---------------------------------------------------------------------------- CUDA
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@CUDA
@pytest.mark.parametrize("arch", ["cho", "attention"])
def test_cuda_fused_encoder_equals_the_cpu_and_the_reference(arch, monkeypatch):
    # cuDNN's RNNs may use TF32 products on Ampere and later (PyTorch's default for cuDNN):
    # ~1e-3 relative, not fp32's ~1e-7; the comparison is of fp32
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    net = _network(arch, dtype=torch.float32)
    with torch.no_grad():
        on_cpu = net.encode(SRC, SRC_LEN)
        gpu = net.to("cuda")
        on_gpu = gpu.encode(SRC.cuda(), SRC_LEN.cuda())
        expected = _reference_encoding(net.cpu().double(), SRC, SRC_LEN)
    for key, value in expected.items():
        torch.testing.assert_close(on_gpu[key].cpu(), on_cpu[key], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(on_gpu[key].cpu().double(), value, rtol=1e-5, atol=1e-5)


@CUDA
@pytest.mark.parametrize("arch", ["cho", "attention"])
def test_cuda_fused_training_learns_and_scores_as_on_the_cpu(tmp_path, arch):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    src, tgt = sample_pairs(20)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    paths = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    for path in paths:
        result = train_tiny(
            path, s, t, valid=(s, t), arch=arch, model_overrides={"recurrence": "fused"},
            device="cuda", amp=True, max_steps=200, batch_tokens=2000, valid_every=200,
            epochs=1000, seed=5, learning_rate=1e-2,
        )  # fmt: skip
        assert result.best_valid_ppl < 5.0 < 50 < result.unigram_valid_ppl
    assert paths[0].read_bytes() == paths[1].read_bytes()  # deterministic cuDNN GRU
    pairs = sample_pairs(20)
    on_cpu = PairScorer(load_model(str(paths[0]))).score_phrases(*pairs).logprob
    model = load_model(str(paths[0]), "cuda")
    on_gpu = PairScorer(model, "cuda").score_phrases(*pairs).logprob
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-4, atol=1e-4)
