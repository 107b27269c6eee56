"""The Transformer (Vaswani et al. 2017): positions, masks, padding invariance, generation against
teacher forcing, its options, and every command on a trained model."""

from __future__ import annotations

import math

import pytest
import torch
from click.testing import CliRunner

from phrasescore.bundle import load_model
from phrasescore.cli import cli
from phrasescore.model import build_network
from phrasescore.model.config import ModelConfig, preset
from phrasescore.model.transformer import (
    TransformerEncoderDecoder,
    causal_mask,
    sinusoid_positions,
)

from .test_model_lstm import (
    overfit_20_pairs,
    padded_batches_score_as_alone,
    run_every_command,
    save_load_identical,
)

SRC = torch.tensor([[4, 5, 6, 7, 3], [8, 9, 3, 0, 0], [10, 3, 0, 0, 0]])
SRC_LEN = torch.tensor([5, 3, 2])
TGT_IN = torch.tensor([[2, 9, 10, 11], [2, 12, 0, 0], [2, 13, 14, 0]])
TGT_OUT = TGT_IN.roll(-1, dims=1).masked_fill(TGT_IN == 0, 0)
TGT_OUT[torch.arange(3), torch.tensor([3, 1, 2])] = 3


def _network(dropout=0.0, rank=16):
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch="transformer",
        embedding_dim=16,
        hidden_dim=16,
        output_rank=rank,
        layers=2,
        heads=4,
        feedforward_dim=24,
        dropout=dropout,
        src_vocab_size=20,
        tgt_vocab_size=17,
    )
    return build_network(cfg)


def test_sinusoid_positions_follow_section_3_5():
    table = sinusoid_positions(7, 6, torch.device("cpu"))
    for pos in (0, 3, 6):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert float(table[pos, 2 * i]) == pytest.approx(math.sin(angle), abs=1e-6)
            assert float(table[pos, 2 * i + 1]) == pytest.approx(math.cos(angle), abs=1e-6)
    assert causal_mask(3, torch.device("cpu")).tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]


def test_initialisation_and_gradients_reach_every_parameter():
    net = _network(dropout=0.1)
    assert isinstance(net, TransformerEncoderDecoder)
    with torch.no_grad():
        assert not net.src_embed.weight[0].any() and not net.tgt_embed.weight[0].any()
        assert float(net.src_embed.weight[1:].std()) == pytest.approx(16**-0.5, rel=0.25)
        assert torch.equal(net.encoder_norm.weight, torch.ones(16))
        assert not net.encoder[0].attention.query.bias.any()
        bound = (6 / (16 + 24)) ** 0.5  # Xavier-uniform of a 16 -> 24 layer
        weight = net.decoder[1].feedforward[0].weight
        assert bound * 0.8 < float(weight.abs().max()) <= bound
    net.loss(SRC, SRC_LEN, TGT_IN, TGT_OUT, TGT_OUT != 0).backward()
    for name, param in net.named_parameters():
        assert param.grad is not None, name
        assert float(param.grad.abs().sum()) > 0, name


def test_stepwise_decoding_and_padding_give_the_teacher_forced_scores():
    net = _network().eval()
    enc = net.encode(SRC, SRC_LEN)
    lp = net.token_logprobs(enc, TGT_IN, TGT_OUT, TGT_OUT != 0)
    assert (lp[TGT_OUT != 0] < 0).all()
    with torch.no_grad():
        state, steps = net.start(enc), []
        for t in range(TGT_IN.shape[1]):
            features, state = net.step(state, TGT_IN[:, t])
            logp = torch.log_softmax(net.logits(features), -1)
            steps.append(logp.gather(1, TGT_OUT[:, t, None]))
    stepwise = torch.cat(steps, dim=1)
    real = TGT_OUT != 0
    assert torch.allclose(stepwise[real], lp[real], atol=1e-5)
    # the second pair alone, unpadded, scores as inside the padded batch
    alone = net.token_logprobs(net.encode(SRC[1:2, :3], torch.tensor([3])), TGT_IN[1:2, :2],
                               TGT_OUT[1:2, :2])  # fmt: skip
    assert torch.allclose(alone[0], lp[1, :2], atol=1e-5)
    # joined encodings (padded with False) score as the padded batch
    joined = net.concat_encodings(
        [net.encode(SRC[:1], SRC_LEN[:1]), net.encode(SRC[1:2, :3], torch.tensor([3]))]
    )
    both = net.token_logprobs(joined, TGT_IN[:2], TGT_OUT[:2], TGT_OUT[:2] != 0)
    assert torch.allclose(both, lp[:2], atol=1e-5)


def test_a_word_is_scored_without_reading_the_words_after_it():
    net = _network().eval()
    enc = net.encode(SRC, SRC_LEN)
    changed = TGT_IN.clone()
    changed[0, 3] = 15
    a = net.token_logprobs(enc, TGT_IN, TGT_OUT)
    b = net.token_logprobs(enc, changed, TGT_OUT)
    assert torch.equal(a[0, :3], b[0, :3]) and not torch.equal(a[0, 3], b[0, 3])
    # and the source matters
    other = net.encode(SRC.flip(0), SRC_LEN.flip(0))
    assert not torch.allclose(net.token_logprobs(other, TGT_IN, TGT_OUT), a)


def test_low_rank_output_and_flops():
    net = _network(rank=8)
    assert isinstance(net.out_rank, torch.nn.Linear) and net.out_vocab.in_features == 8
    assert isinstance(_network().out_rank, torch.nn.Identity)
    assert net.scoring_flops(5, 6) > net.scoring_flops(5, 6, share=0.5) > 0
    assert net.summary_vector(net.encode(SRC, SRC_LEN)).shape == (3, 16)


def test_presets():
    mcfg, tcfg = preset("default", "transformer")
    assert (mcfg.hidden_dim, mcfg.embedding_dim, mcfg.layers, mcfg.heads) == (256, 256, 3, 4)
    assert (mcfg.feedforward_dim, mcfg.output_rank, mcfg.dropout) == (1024, 256, 0.3)
    assert (tcfg.optimizer, tcfg.learning_rate, tcfg.lr_plateau_factor) == ("adam", 1e-3, 0.5)
    with pytest.raises(KeyError):
        preset("paper", "transformer")


def test_train_command_stores_the_sizes_and_refuses_what_the_transformer_has_not(
    tmp_path, corpus_files
):
    out = tmp_path / "m.safetensors"
    base = ["-q", "train", *corpus_files, "-o", str(out), "--arch", "transformer"]
    run = ["--preset", "tiny", "--max-steps", "2", "--valid-every", "2"]
    sizes = ["--layers", "2", "--heads", "4", "--hidden-dim", "24", "--feedforward-dim", "40"]
    result = CliRunner().invoke(cli, [*base, *run, *sizes, "--output-rank", "24"])
    assert result.exit_code == 0, result.output
    cfg = load_model(str(out)).config
    assert (cfg.arch, cfg.layers, cfg.heads, cfg.hidden_dim) == ("transformer", 2, 4, 24)
    assert (cfg.embedding_dim, cfg.feedforward_dim, cfg.output_rank) == (24, 40, 24)
    refused = {
        (
            "--preset",
            "paper",
        ): "--arch transformer has no preset 'paper' (its presets: default, tiny)",
        ("--heads", "5"): "--heads 5 does not divide --hidden-dim 32",
        ("--maxout-units", "8"): "--maxout-units is an option of --arch cho and attention",
        ("--embedding-dim", "8"): "--embedding-dim is an option of --arch cho and lstm and",
        ("--init", "paper"): "--init is an option of",
        ("--recurrence", "fused"): "--arch transformer has no recurrence",
        ("--output-rank", "40"): "larger than the 32 units the output layer reads (--hidden-dim)",
    }
    for flags, message in refused.items():
        bad = tmp_path / "bad.safetensors"
        args = ["-q", "train", *corpus_files, "-o", str(bad), "--arch", "transformer"]
        result = CliRunner().invoke(cli, [*args, "--preset", "tiny", *flags, "--max-steps", "1"])
        assert result.exit_code == 1 and message in result.output, (flags, result.output)
        assert "Traceback" not in result.output and not bad.exists()
    heads = CliRunner().invoke(cli, [*base, *run, "--arch", "lstm", "--heads", "2", "-o", "x"])
    assert heads.exit_code == 1 and "--heads is an option of --arch transformer" in heads.output


@pytest.fixture(scope="module")
def overfit_transformer(tmp_path_factory):
    return overfit_20_pairs(tmp_path_factory.mktemp("transformer"), "transformer", steps=150)


def test_tiny_transformer_overfits_20_real_pairs(overfit_transformer):
    _, result = overfit_transformer
    assert result.unigram_valid_ppl > 50
    assert result.best_valid_ppl < 1.5


def test_pair_scorer_gives_the_same_scores_alone_and_in_padded_batches(overfit_transformer):
    padded_batches_score_as_alone(overfit_transformer[0])


def test_transformer_save_load_gives_identical_scores(overfit_transformer, tmp_path):
    save_load_identical(overfit_transformer[0], tmp_path)


def test_every_command_runs_on_a_transformer_model(overfit_transformer, tmp_path):
    run_every_command(overfit_transformer[0], tmp_path)
