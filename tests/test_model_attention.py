"""RNNsearch (Bahdanau et al. 2015): masking, padding invariance, the network, and every command
on a trained model."""

from __future__ import annotations

import pytest
import torch

from phrasescore.model import build_network
from phrasescore.model.attention import AttentionEncoderDecoder
from phrasescore.model.config import ModelConfig, preset

from .test_model_lstm import (
    overfit_20_pairs,
    padded_batches_score_as_alone,
    run_every_command,
    save_load_identical,
)

SRC = torch.tensor([[4, 5, 6, 7, 3], [8, 9, 3, 0, 0], [10, 3, 0, 0, 0]])
SRC_LEN = torch.tensor([5, 3, 2])
TGT_IN = torch.tensor([[2, 9, 10, 11], [2, 12, 0, 0], [2, 13, 14, 0]])
TGT_OUT = torch.tensor([[9, 10, 11, 3], [12, 3, 0, 0], [13, 14, 3, 0]])


def _network(dropout=0.0, sharpen=True, hidden=12):
    """A small network; ``sharpen`` draws every weight matrix from N(0, 0.5²) instead of the
    paper's init (where v_a = 0 gives uniform attention and tiny weights give nearly uniform
    outputs), so that attention and scores depend clearly on the source."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch="attention",
        embedding_dim=8,
        hidden_dim=hidden,
        maxout_units=6,
        output_rank=5,
        dropout=dropout,
        src_vocab_size=20,
        tgt_vocab_size=17,
    )
    net = build_network(cfg)
    if sharpen:
        for param in net.parameters():
            if param.dim() == 2:
                torch.nn.init.normal_(param, 0.0, 0.5)
        with torch.no_grad():
            net.src_embed.weight[0].zero_()
            net.tgt_embed.weight[0].zero_()
    return net


def test_initialisation_follows_appendix_b():
    net = _network(sharpen=False)
    assert isinstance(net, AttentionEncoderDecoder)
    assert float(net.att_v.weight.detach().abs().max()) == 0.0  # v_a = 0
    assert 0.0005 < float(net.att_annotation.weight.detach().std()) < 0.002  # N(0, 0.001²)
    assert 0.005 < float(net.dec_input.weight.detach().std()) < 0.02  # N(0, 0.01²)
    u = net.dec_u_h.detach()
    assert torch.allclose(u @ u.T, torch.eye(u.shape[0]), atol=1e-5)  # orthogonal
    # uniform attention over the real positions at the start
    alpha = net.attention_weights(net.encode(SRC, SRC_LEN), TGT_IN)
    assert torch.allclose(alpha[1, :, :3], torch.full((4, 3), 1 / 3))


def test_attention_weights_sum_to_one_over_real_positions_and_are_zero_on_padding():
    net = _network().eval()
    enc = net.encode(SRC, SRC_LEN)
    assert enc["mask"].tolist() == [[True] * 5, [True] * 3 + [False] * 2, [True] * 2 + [False] * 3]
    alpha = net.attention_weights(enc, TGT_IN)
    assert alpha.shape == (3, 4, 5)
    assert torch.allclose(alpha.sum(dim=2), torch.ones(3, 4), atol=1e-6)
    assert alpha[1, :, 3:].abs().max() == 0 and alpha[2, :, 2:].abs().max() == 0
    spread = alpha[0].detach()
    assert float(spread.max() - spread.min()) > 0.05  # not uniform: the test sees real weights


def test_a_pair_scores_the_same_alone_and_in_a_padded_batch():
    net = _network().eval()
    batch = net.token_logprobs(net.encode(SRC, SRC_LEN), TGT_IN, TGT_OUT, TGT_OUT != 0)
    for row in range(3):
        n_src, n_tgt = int(SRC_LEN[row]), int((TGT_OUT[row] != 0).sum())
        enc = net.encode(SRC[row : row + 1, :n_src], SRC_LEN[row : row + 1])
        alone = net.token_logprobs(
            enc, TGT_IN[row : row + 1, :n_tgt], TGT_OUT[row : row + 1, :n_tgt]
        )
        assert float((alone[0] - batch[row, :n_tgt]).abs().max()) < 1e-5
    # encodings concatenated across length batches (as PairScorer does) are padded the same way
    parts = [net.encode(SRC[r : r + 1, : int(SRC_LEN[r])], SRC_LEN[r : r + 1]) for r in range(3)]
    merged = net.concat_encodings(parts)
    again = net.token_logprobs(merged, TGT_IN, TGT_OUT, TGT_OUT != 0)
    assert float((again - batch).abs().max()) < 1e-5


def test_concat_encodings_never_pads_per_source_vectors():
    # first_back is [B, H]; with H = 3 it must not be taken for a [B, S] tensor when S = 3
    net = _network(hidden=3).eval()
    long = net.encode(torch.tensor([[4, 5, 6, 7, 3]]), torch.tensor([5]))
    short = net.encode(torch.tensor([[8, 9, 3]]), torch.tensor([3]))
    merged = net.concat_encodings([long, short])
    assert merged["first_back"].shape == (2, 3)
    assert merged["ann"].shape == (2, 5, 6) and merged["mask"].tolist()[1] == [1, 1, 1, 0, 0]


def test_gradients_reach_every_parameter():
    net = _network(dropout=0.1)
    net.loss(SRC, SRC_LEN, TGT_IN, TGT_OUT, TGT_OUT != 0).backward()
    for name, param in net.named_parameters():
        assert param.grad is not None, name
        assert float(param.grad.abs().sum()) > 0, name


def test_stepwise_decoding_gives_the_teacher_forced_scores():
    net = _network().eval()
    enc = net.encode(SRC, SRC_LEN)
    lp = net.token_logprobs(enc, TGT_IN, TGT_OUT, TGT_OUT != 0)
    with torch.no_grad():
        state, steps = net.start(enc), []
        for t in range(TGT_IN.shape[1]):
            features, state = net.step(state, TGT_IN[:, t])
            steps.append(torch.log_softmax(net.logits(features), -1).gather(1, TGT_OUT[:, t, None]))
    stepwise = torch.cat(steps, dim=1)
    mask = TGT_OUT != 0
    assert torch.allclose(stepwise[mask], lp[mask], atol=1e-6)


def test_default_preset_starts_adam_at_2e_3_and_another_optimizer_at_its_own_rate():
    """The attention default trains at 2e-3 (docs/benchmarks.md); cho and lstm keep
    Adam's 1e-3; --optimizer without --lr takes that optimiser's own default."""
    from phrasescore.jobs.training.train import _configure

    def rate(**overrides) -> float:
        return _configure("default", "attention", overrides, None, False)[1].learning_rate

    assert preset("default", "attention")[1].learning_rate == 2e-3
    assert preset("default", "cho")[1].learning_rate == preset("default", "lstm")[1].learning_rate
    assert preset("default", "cho")[1].learning_rate == 1e-3
    assert rate() == rate(optimizer="adam") == 2e-3  # the preset's optimiser: its rate
    assert rate(optimizer="sgd") == 0.7 and rate(optimizer="adadelta") == 1.0
    assert rate(optimizer="adam", learning_rate=5e-4) == 5e-4


def test_paper_preset_and_flops():
    mcfg, tcfg = preset("paper", "attention")
    assert (mcfg.hidden_dim, mcfg.embedding_dim, mcfg.maxout_units) == (1000, 620, 500)
    assert (tcfg.optimizer, tcfg.batch_pairs) == ("adadelta", 80)
    net = _network()
    assert net.scoring_flops(10, 10) > net.scoring_flops(5, 10) > net.scoring_flops(5, 10, 0.1)


@pytest.fixture(scope="module")
def overfit_attention(tmp_path_factory):
    return overfit_20_pairs(tmp_path_factory.mktemp("attention"), "attention", steps=200)


def test_tiny_attention_model_overfits_20_real_pairs(overfit_attention):
    _, result = overfit_attention
    assert result.unigram_valid_ppl > 50
    assert result.best_valid_ppl < 1.5


def test_pair_scorer_gives_the_same_scores_alone_and_in_padded_batches(overfit_attention):
    padded_batches_score_as_alone(overfit_attention[0])


def test_attention_save_load_gives_identical_scores(overfit_attention, tmp_path):
    save_load_identical(overfit_attention[0], tmp_path)


def test_every_command_runs_on_an_attention_model(overfit_attention, tmp_path):
    run_every_command(overfit_attention[0], tmp_path)
