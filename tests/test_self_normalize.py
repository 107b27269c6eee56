"""Self-normalised output layer: ``train --self-normalize ALPHA`` (Devlin et
al. 2014, α (log Z)² per target token) and ``rescore/nbest --scoring self-normalized`` (log p ≈
the sum of the target words' logits, clamped at 0)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from phrasescore.bundle import TrainedModel, load_model
from phrasescore.engine.scoring import PairScorer
from phrasescore.jobs.rescore.rescore import RescoreOptions, rescore_table
from phrasescore.jobs.training.train import run_training
from phrasescore.model import build_network
from phrasescore.model.checkpoint import save_network_file
from phrasescore.model.config import preset
from phrasescore.moses.phrase_table import read_phrase_table
from phrasescore.runners.shards import Shard
from phrasescore.text.corpus import ParallelDataset
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import BOS_ID, EOS_ID, WordVocabulary
from phrasescore.training.validation import evaluate

from .conftest import DATA, TEXT, run_cli, train_tiny

REPO = Path(__file__).resolve().parent.parent
SAMPLE_TABLE = TEXT / "multi30k-phrase-table-sample.gz"  # 200 real lines, not training text
MOSES_INI = DATA / "moses" / "multi30k.moses.ini"
MOSES_TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"
NBEST_LIST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
NBEST_SRC = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"
ALPHA = 0.5


def one_line_error(proc) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phrasescore: error: "), proc.stderr
    return lines[0]


def table_pairs(path=SAMPLE_TABLE) -> tuple[list[str], list[str]]:
    entries = list(read_phrase_table(str(path)))
    return [e.source for e in entries], [e.target for e in entries]


@pytest.fixture(scope="module")
def sn_model_path(tmp_path_factory, corpus_files) -> str:
    """The ``tiny_model_path`` run (same data, seed, steps, learning rate) with α = 0.5."""
    path = tmp_path_factory.mktemp("sn") / "sn.safetensors"
    train_tiny(
        path,
        *corpus_files,
        max_steps=60,
        valid_every=30,
        learning_rate=3e-3,
        seed=3,
        model_overrides={"self_normalize": ALPHA},
    )
    return str(path)


def full_logits(model: TrainedModel, source: str, target: str) -> tuple[torch.Tensor, list[int]]:
    """The [T, V] logits (float64) of every target step of one pair and the reference ids,
    computed without the scoring engine: one pair, the whole vocabulary projection."""
    net = model.network.eval()
    src_ids = model.src_vocab.encode_batch([source.split()])[0] + [EOS_ID]
    tgt_ids = model.tgt_vocab.encode_batch([target.split()])[0]
    with torch.no_grad():
        enc = net.encode(torch.tensor([src_ids]), torch.tensor([len(src_ids)]))
        features = net.decode_features(enc, torch.tensor([[BOS_ID, *tgt_ids]]))
        logits = net.logits(features)[0].double()
    return logits, [*tgt_ids, EOS_ID]


def mean_abs_log_z(model: TrainedModel, sources, targets) -> float:
    values = []
    for source, target in zip(sources, targets, strict=True):
        logits, _ = full_logits(model, source, target)
        values.extend(torch.logsumexp(logits, 1).abs().tolist())
    return float(np.mean(values))


# ---------------------------------------------------------------------------- training
def test_alpha_is_recorded_in_the_model_file_and_shown_by_info(tmp_path, corpus_files):
    path = tmp_path / "m.safetensors"
    proc = run_cli(
        "train", *corpus_files, "-o", path, "--preset", "tiny", "--max-steps", "4",
        "--valid-every", "2", "--self-normalize", "0.25", "--threads", "1", "--arch", "lstm",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "mean |log Z|" in path.with_name("m.safetensors.log").read_text()
    model = load_model(str(path))
    assert model.config.self_normalize == 0.25
    assert "valid_mean_abs_log_z" in model.info
    info = run_cli("info", path)
    assert info.returncode == 0, info.stderr
    assert "self-normalization: alpha 0.25 (Devlin et al. 2014)" in info.stdout
    assert "'self_normalize': 0.25" in info.stdout


def test_a_model_file_without_the_field_loads_as_alpha_0(tiny_model_path, tmp_path):
    """Model files written before the option existed have no ``self_normalize``: alpha 0."""
    model = load_model(tiny_model_path)
    core = model.core()
    config = json.loads(core["config"])
    del config["self_normalize"]
    core["config"] = json.dumps(config, sort_keys=True)
    old = tmp_path / "old.safetensors"
    save_network_file(str(old), model.network, core, model.info, model.FORMAT, model.VERSION)
    loaded = load_model(str(old))
    assert loaded.config.self_normalize == 0.0
    assert "self-normalization: off" in run_cli("info", old).stdout
    error = one_line_error(
        run_cli("rescore", SAMPLE_TABLE, "-m", old, "-o", tmp_path / "o.gz", "--scoring",
                "self-normalized", "--no-progress")
    )  # fmt: skip
    assert "--self-normalize" in error


@pytest.mark.parametrize("arch", ["cho", "lstm", "attention"])
def test_the_objective_adds_alpha_log_z_squared_per_token(arch):
    """objective = NLL + α Σ_t (log Z_t)² over the real tokens (Devlin et al. 2014), the NLL
    unchanged by it, and the output biases start at -log V (log Z near 0)."""
    model = _random_model(arch, alpha=0.3, biases=False)
    net = model.network.train()
    sources, targets = table_pairs()
    src = [model.src_vocab.encode_batch([s.split()])[0] + [EOS_ID] for s in sources[:6]]
    tgt = [model.tgt_vocab.encode_batch([t.split()])[0] for t in targets[:6]]
    width, length = max(map(len, src)), max(map(len, tgt)) + 1
    src_t = torch.tensor([s + [0] * (width - len(s)) for s in src])
    tgt_in = torch.tensor([[BOS_ID, *t] + [0] * (length - 1 - len(t)) for t in tgt])
    tgt_out = torch.tensor([[*t, EOS_ID] + [0] * (length - 1 - len(t)) for t in tgt])
    lengths = torch.tensor([len(s) for s in src])
    mask = tgt_out != 0
    terms = net.loss_terms(src_t, lengths, tgt_in, tgt_out, mask)
    logits = net.logits(net.decode_features(net.encode(src_t, lengths), tgt_in)[mask]).float()
    log_z = torch.logsumexp(logits, 1)
    nll = -(torch.log_softmax(logits, 1).gather(1, tgt_out[mask][:, None])).sum()
    torch.testing.assert_close(terms.nll, nll.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        terms.objective, nll + 0.3 * log_z.square().sum(), rtol=1e-5, atol=1e-4
    )
    torch.testing.assert_close(terms.abs_log_z, log_z.abs().sum().detach(), rtol=1e-5, atol=1e-4)
    assert float(log_z.detach().abs().mean()) < 0.5  # biases -log V: log Z starts near 0, not log V
    terms.objective.backward()
    assert net.out_vocab.bias.grad is not None
    model.network.config.self_normalize = 0.0  # α = 0: the objective is the NLL alone
    plain = net.loss_terms(src_t, lengths, tgt_in, tgt_out, mask)
    assert plain.abs_log_z is None
    torch.testing.assert_close(plain.objective, nll, rtol=1e-5, atol=1e-4)


def test_negative_alpha_is_a_usage_error(tmp_path, corpus_files):
    proc = run_cli(
        "train", *corpus_files, "-o", tmp_path / "m.safetensors", "--self-normalize", "-1"
    )
    assert proc.returncode == 2 and "--self-normalize" in proc.stderr
    assert not (tmp_path / "m.safetensors").exists()


def test_the_penalty_makes_log_z_small_on_held_out_pairs(sn_model_path, tiny_model_path):
    """Same data, seed, steps and learning rate, α = 0.5 against α = 0: mean |log Z| over the
    200 held-out phrase-table pairs (not training text) falls below 1 and a fifth of the
    unpenalised model's, which stays above 3 (figures: docs/benchmarks.md, "Self-normalised
    output layer")."""
    sources, targets = table_pairs()
    with_penalty = mean_abs_log_z(load_model(sn_model_path), sources, targets)
    without = mean_abs_log_z(load_model(tiny_model_path), sources, targets)
    assert without > 3.0
    assert with_penalty < 1.0 and with_penalty < without / 5


def test_validation_perplexity_is_the_exact_one_without_the_penalty(sn_model_path):
    """``evaluate`` reports exp(mean NLL), which equals the exact scores of the engine; with
    α = 0.5 the penalty per token is ~0.5 x 0.2² = 0.02 nats, far above the 1e-4 tolerance."""
    model = load_model(sn_model_path)
    sources, targets = table_pairs()
    src_tok = [s.split() for s in sources]
    tgt_tok = [t.split() for t in targets]
    dataset = ParallelDataset.from_pairs(
        zip(src_tok, tgt_tok, strict=True), model.src_vocab, model.tgt_vocab
    )
    validation = evaluate(model.network, dataset, torch.device("cpu"), 2000)
    scored = PairScorer(model).score_tokens(src_tok, tgt_tok)
    exact = math.exp(-scored.logprob.sum() / scored.n_tokens.sum())
    assert validation.perplexity == pytest.approx(exact, rel=1e-4)
    assert validation.mean_abs_log_z == pytest.approx(
        mean_abs_log_z(model, sources, targets), rel=1e-4
    )
    # what the penalty would add is clearly more than the tolerance
    assert ALPHA * validation.mean_abs_log_z**2 > 1e-3


@pytest.mark.parametrize("arch", ["cho", "attention"])
def test_resume_with_the_penalty_is_exact(tmp_path, arch):
    """--phrase-table training with α, stopped and resumed: the weights of one run."""

    def train(path, steps, resume=False):
        return run_training(
            model_path=str(path), source=None, target=None, phrase_table=str(SAMPLE_TABLE),
            valid=None, preset="tiny", src_lang="en", tgt_lang="fr", tokenize=False,
            lowercase=False, device="cpu", amp=False, threads=None, resume=resume,
            overrides=dict(max_steps=steps, valid_every=4, seed=2), arch=arch,
            model_overrides={"self_normalize": 0.3},
        )  # fmt: skip

    train(tmp_path / "one.safetensors", 12)
    train(tmp_path / "two.safetensors", 6)
    train(tmp_path / "two.safetensors", 12, resume=True)
    one = torch.load(str(tmp_path / "one.safetensors.checkpoint"), weights_only=True)
    two = torch.load(str(tmp_path / "two.safetensors.checkpoint"), weights_only=True)
    assert json.loads(two["meta"])["model_config"]["self_normalize"] == 0.3
    for name, value in one["network"].items():
        assert torch.equal(two["network"][name], value), name


# ---------------------------------------------------------------------------- scoring
def _random_model(arch: str, alpha: float = 0.1, biases: bool = True) -> TrainedModel:
    """A random network of the tiny preset with α recorded, on the sample table's words; with
    ``biases`` the output biases alternate +1.3 / -0.7 so that some pairs' logit sums are above 0
    and none is near 0 (13 a = 7 b has no solution with fewer than 20 tokens); else as
    initialised."""
    sources, targets = table_pairs()
    mcfg, _ = preset("tiny", arch)
    src_vocab = WordVocabulary.build(s.split() for s in sources)
    tgt_vocab = WordVocabulary.build(t.split() for t in targets)
    mcfg.src_vocab_size, mcfg.tgt_vocab_size = len(src_vocab), len(tgt_vocab)
    mcfg.self_normalize = alpha
    torch.manual_seed(4)
    network = build_network(mcfg).eval()
    if biases:
        with torch.no_grad():
            odd = torch.arange(mcfg.tgt_vocab_size) % 2 == 1
            network.out_vocab.bias.copy_(torch.where(odd, -0.7, 1.3))
    return TrainedModel(
        network, src_vocab, tgt_vocab, TextNormalizer("en"), TextNormalizer("fr"), {}
    )


@pytest.mark.parametrize("arch", ["cho", "lstm", "attention"])
def test_self_normalized_scores_are_exact_log_p_plus_log_z_clamped_at_0(arch):
    model = _random_model(arch)
    sources, targets = table_pairs()
    exact = PairScorer(model).score_phrases(sources, targets, per_token=True)
    approx_scorer = PairScorer(model, scoring="self-normalized")
    approx = approx_scorer.score_phrases(sources, targets, per_token=True)
    sums = []
    for i, (source, target) in enumerate(zip(sources, targets, strict=True)):
        logits, gold = full_logits(model, source, target)
        log_z = torch.logsumexp(logits, 1).numpy()
        target_logits = logits[torch.arange(len(gold)), gold].numpy()
        # the engine's exact log p + log Z from the full logits = the target logit alone
        np.testing.assert_allclose(
            approx.token_logprobs[i], exact.token_logprobs[i] + log_z, rtol=1e-6, atol=1e-5
        )
        np.testing.assert_allclose(approx.token_logprobs[i], target_logits, rtol=1e-6, atol=1e-5)
        sums.append(float((exact.token_logprobs[i] + log_z).sum()))
    sums = np.array(sums)
    assert np.abs(sums).min() > 1e-3  # no pair at the clamp's edge
    np.testing.assert_allclose(approx.logprob, np.minimum(sums, 0.0), rtol=1e-6, atol=1e-5)
    assert (approx.logprob <= 0.0).all()
    clamped = int((approx.logprob == 0.0).sum())
    assert approx_scorer.clamped == clamped == int((sums > 0).sum())
    assert 0 < clamped < len(sums)  # the test sees both kinds of pair
    assert np.abs(approx.logprob - exact.logprob).max() > 0.1  # not the exact scores


def test_self_normalized_refused_for_a_model_trained_without_it(tiny_model_path, tmp_path):
    out = tmp_path / "out.gz"
    error = one_line_error(
        run_cli("rescore", SAMPLE_TABLE, "-m", tiny_model_path, "-o", out, "--scoring",
                "self-normalized", "--no-progress")
    )  # fmt: skip
    assert tiny_model_path in error and "--self-normalize" in error
    assert list(tmp_path.iterdir()) == []
    error = one_line_error(
        run_cli("nbest", NBEST_LIST, "--source", NBEST_SRC, "-m", tiny_model_path, "-o", out,
                "--scoring", "self-normalized", "--no-progress")
    )  # fmt: skip
    assert "--self-normalize" in error
    assert list(tmp_path.iterdir()) == []


def test_rescore_records_the_mode_and_gives_the_same_bytes_twice(sn_model_path, tmp_path):
    outputs = {}
    for name, mode in (("a", "self-normalized"), ("b", "self-normalized"), ("exact", "exact")):
        out = tmp_path / f"{name}.gz"
        ini_out = tmp_path / f"{name}.ini"
        proc = run_cli(
            "rescore", MOSES_TABLE, "-m", sn_model_path, "-o", out, "--scoring", mode,
            "--moses-ini", MOSES_INI, "--ini-table", "phrase-table.gz", "--ini-out", ini_out,
            "--dtype", "float32", "--no-progress", "--threads", "1",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert f"{mode} scoring" in proc.stderr
        outputs[name] = (out.read_bytes(), ini_out.read_text())
    assert outputs["a"][0] == outputs["b"][0]  # the same table bytes twice
    assert outputs["a"][1] == outputs["b"][1].replace("b.gz", "a.gz")  # the ini names its table
    assert outputs["a"][0] != outputs["exact"][0]
    signature = load_model(sn_model_path).signature
    assert f"phrasescore:{signature}+self-normalized" in outputs["a"][1]
    assert "+self-normalized" not in outputs["exact"][1]
    values = [float(e.scores[-1]) for e in read_phrase_table(str(tmp_path / "a.gz"))]
    assert all(0.0 < v <= 1.0 for v in values)


def test_the_shard_manifest_records_the_mode_and_merge_refuses_mixed_modes(sn_model_path, tmp_path):
    parts = []
    for k, mode in ((1, "self-normalized"), (2, "exact")):
        part = tmp_path / f"part.{k}.gz"
        options = RescoreOptions(dtype="float32", chunk_lines=50, scoring=mode)
        rescore_table(
            str(SAMPLE_TABLE), [sn_model_path], str(part), options, progress=False,
            shard=Shard(k, 2),
        )  # fmt: skip
        parts.append(part)
    manifest = json.loads((tmp_path / "part.1.gz.manifest.json").read_text())
    assert manifest["job"]["options"]["scoring"] == "self-normalized"
    assert manifest["job"]["columns"][0].endswith("+self-normalized")
    error = one_line_error(run_cli("merge-shards", *parts, "-o", tmp_path / "merged.gz"))
    assert "other models or flags" in error
    assert not (tmp_path / "merged.gz").exists()


def test_nbest_self_normalized_feature(sn_model_path, tmp_path):
    out = tmp_path / "out.gz"
    proc = run_cli(
        "nbest", NBEST_LIST, "--source", NBEST_SRC, "-m", sn_model_path, "-o", out,
        "--scoring", "self-normalized", "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "self-normalized scoring" in proc.stderr
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    values = [float(line.split("RNNEncDec0= ")[1].split()[0]) for line in lines]
    assert len(values) > 300 and max(values) <= 0.0
    exact = run_cli(
        "nbest", NBEST_LIST, "--source", NBEST_SRC, "-m", sn_model_path, "-o", tmp_path / "e.gz",
        "--no-progress",
    )  # fmt: skip
    assert exact.returncode == 0 and (tmp_path / "e.gz").read_bytes() != out.read_bytes()


# ---------------------------------------------------------------------------- torchrun
SN_TRAIN_SCRIPT = """
import sys
from tests.conftest import train_tiny
path, src, tgt = sys.argv[1:4]
train_tiny(path, src, tgt, max_steps=8, valid_every=4, optimizer="sgd", learning_rate=0.5,
           seed=5, model_overrides={"self_normalize": 0.5})
"""


def test_ddp_training_with_the_penalty_equals_one_process(tmp_path, corpus_files, monkeypatch):
    """The penalty is part of the objective DDP averages: 2 gloo ranks give the weights and
    perplexities of one process on the same global batches (tolerances of
    tests/test_distributed.py: float32 summation order only)."""
    import phrasescore.training.trainer as train

    from .test_distributed import _GlobalBatches, torchrun

    script = tmp_path / "train_script.py"
    script.write_text(SN_TRAIN_SCRIPT)
    ddp_path = tmp_path / "ddp.safetensors"
    result = torchrun(script, ddp_path, *corpus_files)
    assert result.returncode == 0, result.stderr
    ddp = torch.load(str(ddp_path) + ".checkpoint", weights_only=True)

    real = train.TokenBudgetBatcher
    monkeypatch.setattr(train, "TokenBudgetBatcher", lambda *a, **k: _GlobalBatches(real(*a, **k)))
    one_path = tmp_path / "one.safetensors"
    train_tiny(
        one_path, *corpus_files, max_steps=8, valid_every=4, optimizer="sgd", learning_rate=0.5,
        seed=5, model_overrides={"self_normalize": 0.5},
    )  # fmt: skip
    one = torch.load(str(one_path) + ".checkpoint", weights_only=True)
    for name, value in one["network"].items():
        torch.testing.assert_close(ddp["network"][name], value, atol=1e-5, rtol=1e-4)
    ddp_hist = json.loads(ddp["meta"])["position"]["history"]
    one_hist = json.loads(one["meta"])["position"]["history"]
    assert len(ddp_hist) == len(one_hist) == 2
    for a, b in zip(ddp_hist, one_hist, strict=True):
        assert a["valid_ppl"] == pytest.approx(b["valid_ppl"], rel=1e-5)
        assert a["valid_abs_log_z"] == pytest.approx(b["valid_abs_log_z"], rel=1e-5)
    assert load_model(str(ddp_path)).config.self_normalize == 0.5
