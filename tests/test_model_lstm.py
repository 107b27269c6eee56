"""The deep LSTM of Sutskever et al. (2014): reversal, the network, its training schedule, and
every command on a trained model."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from phrasescore.bundle import load_model, save_model
from phrasescore.cli import cli
from phrasescore.engine.scoring import PairScorer
from phrasescore.model import build_network
from phrasescore.model.config import ModelConfig, TrainConfig, preset
from phrasescore.model.lstm import DeepLSTMEncoderDecoder, reverse_within
from phrasescore.training.loop import learning_rate_at
from phrasescore.training.trainer import Trainer

from .conftest import DATA, sample_pairs, train_tiny, write_lines

TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"
NBEST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
NBEST_SOURCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"


def train_arch(path, src, tgt, arch, resume=False, model_overrides=None, **overrides):
    """``phrasescore train --arch ARCH --preset tiny`` on SRC TGT, validated on themselves."""
    return train_tiny(
        path,
        src,
        tgt,
        valid=(src, tgt),
        resume=resume,
        arch=arch,
        model_overrides=model_overrides,
        **overrides,
    )


def overfit_20_pairs(folder, arch, steps):
    """The tiny ``arch`` model trained until it has (nearly) learnt 20 real pairs by heart."""
    src, tgt = sample_pairs(20)
    s, t = write_lines(folder / "a.en", src), write_lines(folder / "a.fr", tgt)
    path = folder / f"{arch}.safetensors"
    result = train_arch(
        path, s, t, arch, seed=5, learning_rate=1e-2, max_steps=steps, batch_tokens=2000,
        valid_every=steps, epochs=1000,
    )  # fmt: skip
    return str(path), result


def run_every_command(model_path, tmp_path):
    """rescore, nbest, translate and sample run unchanged on ``model_path``."""
    runner = CliRunner()
    out = tmp_path / "table.gz"
    result = runner.invoke(
        cli, ["-q", "rescore", str(TABLE), "-m", model_path, "-o", str(out), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    original = gzip.open(TABLE, "rt", encoding="utf-8").read().splitlines()
    rescored = gzip.open(out, "rt", encoding="utf-8").read().splitlines()
    assert len(rescored) == len(original)
    for before, after in zip(original, rescored, strict=True):
        old, new = before.split(" ||| ")[2].split(), after.split(" ||| ")[2].split()
        assert new[:-1] == old and 0.0 <= float(new[-1]) <= 1.0
    nbest_out = tmp_path / "out.nbest"
    args = ["-q", "nbest", str(NBEST), "--source", str(NBEST_SOURCE), "-m", model_path]
    result = runner.invoke(cli, [*args, "-o", str(nbest_out), "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = nbest_out.read_text(encoding="utf-8").splitlines()
    assert lines and all("RNNEncDec0= -" in line for line in lines)
    source = NBEST_SOURCE.read_text(encoding="utf-8").splitlines()[:3]
    result = runner.invoke(
        cli,
        ["-q", "translate", "-", "-m", model_path, "--beam", "2", "--no-progress"],
        input="\n".join(source) + "\n",
    )
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3
    result = runner.invoke(cli, ["-q", "sample", "a man", "-m", model_path, "-n", "5"])
    assert result.exit_code == 0, result.output


def padded_batches_score_as_alone(model_path):
    """``PairScorer`` gives each of 40 real pairs the same log p in padded batches as alone."""
    model = load_model(model_path)
    src, tgt = sample_pairs(40)
    together = PairScorer(model, batch_tokens=200).score_phrases(src, tgt).logprob
    alone = np.array(
        [
            PairScorer(model).score_phrases([s], [t]).logprob[0]
            for s, t in zip(src, tgt, strict=True)
        ]
    )
    assert (together < 0).all()
    # float32 sums over whole sentences (down to -1,300 nats for pairs the overfit model never
    # saw): batch-size-dependent kernels agree to ~1e-7 relative, not to a fixed 1e-4 nats
    np.testing.assert_allclose(together, alone, rtol=2e-6, atol=1e-4)


def save_load_identical(model_path, tmp_path):
    model = load_model(model_path)
    src, tgt = sample_pairs(30)
    before = PairScorer(model).score_phrases(src, tgt).logprob
    copy = str(tmp_path / "copy.safetensors")
    assert save_model(copy, model) == model.signature
    after = PairScorer(load_model(copy)).score_phrases(src, tgt).logprob
    assert (before == after).all()
    assert (before < 0).all()


# ---------------------------------------------------------------------------- network
def _network(reverse=True, layers=2, bound=0.08, dropout=0.0):
    torch.manual_seed(0)
    cfg = ModelConfig(
        arch="lstm",
        embedding_dim=8,
        hidden_dim=12,
        output_rank=5,
        layers=layers,
        dropout=dropout,
        reverse_source=reverse,
        init_uniform=bound,
        src_vocab_size=20,
        tgt_vocab_size=17,
    )
    return build_network(cfg)


def test_reverse_within_reverses_only_the_real_positions():
    x = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    assert reverse_within(x, torch.tensor([3, 2])).tolist() == [[3, 2, 1, 4], [6, 5, 0, 0]]
    feats = torch.arange(16.0).view(2, 4, 2)
    back = reverse_within(reverse_within(feats, torch.tensor([4, 1])), torch.tensor([4, 1]))
    assert torch.equal(back, feats)


def test_reversed_encoding_of_abc_equals_plain_encoding_of_cba():
    reversed_net = _network(reverse=True).eval()
    plain_net = _network(reverse=False).eval()
    plain_net.load_state_dict(reversed_net.state_dict())
    a, b, c, d, e, eos = 4, 5, 6, 7, 8, 3
    # "a b c" alone, and inside a padded batch beside "d e"
    rev = reversed_net.encode(torch.tensor([[a, b, c, eos]]), torch.tensor([4]))
    plain = plain_net.encode(torch.tensor([[c, b, a, eos]]), torch.tensor([4]))
    assert torch.allclose(rev["h"], plain["h"], atol=1e-6)
    assert torch.allclose(rev["c"], plain["c"], atol=1e-6)
    rev_batch = reversed_net.encode(
        torch.tensor([[a, b, c, eos], [d, e, eos, 0]]), torch.tensor([4, 3])
    )
    plain_batch = plain_net.encode(
        torch.tensor([[c, b, a, eos], [e, d, eos, 0]]), torch.tensor([4, 3])
    )
    for key in ("h", "c"):
        assert torch.allclose(rev_batch[key], plain_batch[key], atol=1e-6)
        assert torch.allclose(rev_batch[key][:1], rev[key], atol=1e-6)
    # and the reversal matters: the plain model reads "a b c" differently
    other = plain_net.encode(torch.tensor([[a, b, c, eos]]), torch.tensor([4]))
    assert not torch.allclose(other["h"], rev["h"], atol=1e-4)


def test_initialisation_is_uniform_and_encoder_initialises_the_decoder():
    net = _network()
    assert isinstance(net, DeepLSTMEncoderDecoder)
    for name, param in net.named_parameters():
        assert float(param.detach().abs().max()) <= 0.08, name
    assert net.encoder.num_layers == 2 and net.decoder.num_layers == 2
    enc = net.encode(torch.tensor([[4, 5, 3]]), torch.tensor([3]))
    assert enc["h"].shape == (1, 2, 12) and enc["c"].shape == (1, 2, 12)
    assert torch.equal(net.start(enc)["h"], enc["h"])
    assert torch.equal(net.summary_vector(enc), enc["h"][:, -1])


def test_gradients_reach_every_parameter():
    net = _network(dropout=0.1)
    src = torch.tensor([[4, 5, 6, 3], [7, 8, 3, 0]])
    tgt_in = torch.tensor([[2, 9, 10], [2, 11, 0]])
    tgt_out = torch.tensor([[9, 10, 3], [11, 3, 0]])
    net.loss(src, torch.tensor([4, 3]), tgt_in, tgt_out, tgt_out != 0).backward()
    for name, param in net.named_parameters():
        assert param.grad is not None, name
        assert float(param.grad.abs().sum()) > 0, name


def test_stepwise_decoding_and_padding_give_the_teacher_forced_scores():
    net = _network().eval()
    src = torch.tensor([[4, 5, 6, 3], [7, 8, 3, 0]])
    tgt_in = torch.tensor([[2, 9, 10], [2, 11, 0]])
    tgt_out = torch.tensor([[9, 10, 3], [11, 3, 0]])
    enc = net.encode(src, torch.tensor([4, 3]))
    lp = net.token_logprobs(enc, tgt_in, tgt_out, tgt_out != 0)
    with torch.no_grad():
        state, steps = net.start(enc), []
        for t in range(3):
            features, state = net.step(state, tgt_in[:, t])
            steps.append(torch.log_softmax(net.logits(features), -1).gather(1, tgt_out[:, t, None]))
    stepwise = torch.cat(steps, dim=1)
    assert torch.allclose(stepwise[tgt_out != 0], lp[tgt_out != 0], atol=1e-6)
    alone = net.token_logprobs(
        net.encode(src[1:, :3], torch.tensor([3])), tgt_in[1:, :2], tgt_out[1:, :2]
    )
    assert torch.allclose(alone[0], lp[1, :2], atol=1e-6)


def test_full_rank_output_when_rank_equals_hidden():
    cfg, _ = preset("paper", "lstm")
    assert (cfg.arch, cfg.layers, cfg.hidden_dim, cfg.embedding_dim) == ("lstm", 4, 1000, 1000)
    cfg = ModelConfig(arch="lstm", embedding_dim=4, hidden_dim=6, output_rank=6, layers=1,
                      src_vocab_size=9, tgt_vocab_size=9)  # fmt: skip
    net = build_network(cfg)
    assert isinstance(net.out_rank, torch.nn.Identity)
    assert net.scoring_flops(5, 5) > net.scoring_flops(5, 5, share=0.5) > 0


# ---------------------------------------------------------------------------- training
def test_presets_and_the_halving_schedule():
    mcfg, tcfg = preset("paper", "lstm")
    assert (mcfg.init_uniform, tcfg.optimizer, tcfg.learning_rate) == (0.08, "sgd", 0.7)
    assert (tcfg.batch_pairs, tcfg.clip_norm, tcfg.epochs) == (128, 5.0, 7.5)
    assert tcfg.loss_per_sentence and not preset("paper", "attention")[1].loss_per_sentence
    rates = [learning_rate_at(tcfg, e) for e in (0.0, 4.99, 5.0, 5.49, 5.5, 6.0, 7.49)]
    assert rates == pytest.approx([0.7, 0.7, 0.35, 0.35, 0.175, 0.0875, 0.7 / 2**5])
    assert learning_rate_at(TrainConfig(learning_rate=1e-3), 100.0) == 1e-3
    assert preset("default", "lstm")[0].layers == 2
    assert preset("default")[0].arch == "cho"
    with pytest.raises(KeyError):
        preset("paper", "transformer")


def test_sgd_schedule_resumes_exactly_and_stops_at_a_fractional_epoch(tmp_path):
    src, tgt = sample_pairs(60)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    common = dict(
        batch_tokens=300, valid_every=4, seed=9, optimizer="sgd", learning_rate=0.5,
        lr_halve_after_epochs=0.5, lr_halve_every_epochs=0.25, epochs=1.5, loss_per_sentence=True,
    )  # fmt: skip
    (tmp_path / "full").mkdir()
    (tmp_path / "parts").mkdir()
    full = tmp_path / "full" / "m.safetensors"
    part = tmp_path / "parts" / "m.safetensors"
    result = train_arch(full, s, t, "lstm", **common)
    assert result.stopped == "epochs"
    assert 1.4 < result.epochs_done <= 1.55
    train_arch(part, s, t, "lstm", max_steps=result.steps // 2, **common)
    train_arch(part, s, t, "lstm", resume=True, **common)
    a = Trainer.read_checkpoint(str(full) + ".checkpoint")
    b = Trainer.read_checkpoint(str(part) + ".checkpoint")
    assert a["meta"]["position"]["step"] == b["meta"]["position"]["step"] == result.steps
    assert a["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.5 / 2**4)
    for name, tensor in a["network"].items():
        assert torch.equal(tensor, b["network"][name]), name


def test_train_command_stores_arch_layers_and_reversal(tmp_path, corpus_files):
    out = tmp_path / "m.safetensors"
    args = ["-q", "train", *corpus_files, "-o", str(out), "--preset", "tiny", "--arch", "lstm"]
    args += ["--layers", "3", "--no-reverse", "--max-steps", "3", "--valid-every", "3"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    cfg = load_model(str(out)).config
    assert (cfg.arch, cfg.layers, cfg.reverse_source, cfg.init_uniform) == ("lstm", 3, False, 0.08)
    bad = CliRunner().invoke(cli, [*args[:8], "--layers", "3", "--max-steps", "1"])
    assert bad.exit_code == 1 and "--arch lstm" in bad.output


@pytest.fixture(scope="module")
def overfit_lstm(tmp_path_factory):
    return overfit_20_pairs(tmp_path_factory.mktemp("lstm"), "lstm", steps=150)


def test_tiny_lstm_overfits_20_real_pairs(overfit_lstm):
    _, result = overfit_lstm
    assert result.unigram_valid_ppl > 50
    assert result.best_valid_ppl < 1.5


def test_lstm_save_load_gives_identical_scores(overfit_lstm, tmp_path):
    save_load_identical(overfit_lstm[0], tmp_path)


def test_every_command_runs_on_an_lstm_model(overfit_lstm, tmp_path):
    run_every_command(overfit_lstm[0], tmp_path)
