"""The CSLM target language model (Schwenk 2007): training, files, scoring, and its two features."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from phrasescore.bundle import load_lm, load_model
from phrasescore.cli import cli
from phrasescore.engine.lm_scoring import LMScorer, perplexity
from phrasescore.errors import ModelFileError
from phrasescore.jobs.rescore.columns import LMPhraseColumn
from phrasescore.jobs.training.train_lm import run_lm_training
from phrasescore.model.cslm import FeedForwardLM, LMConfig
from phrasescore.moses.nbest import read_nbest
from phrasescore.moses.phrase_table import read_phrase_table
from phrasescore.text.vocab import BOS_ID, PAD_ID
from phrasescore.training.trainer import Trainer

from .conftest import DATA, sample_pairs, write_lines

NBEST = DATA / "moses" / "labelled-5best.nbest"
TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"


def train(tmp_path: Path, corpus: str, **overrides):
    path = str(tmp_path / "lm.safetensors")
    resume = overrides.pop("resume", False)
    order = overrides.pop("order", 6)
    settings = dict(learning_rate=1e-2, epochs=1000, batch_tokens=2000, seed=3)
    settings.update(overrides)
    result = run_lm_training(
        path,
        corpus,
        valid=corpus,
        preset="tiny",
        order=order,
        device="cpu",
        progress=False,
        resume=resume,
        overrides=settings,
    )
    return path, result


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    _, french = sample_pairs(20)
    return write_lines(tmp_path_factory.mktemp("lmcorpus") / "corpus.fr", french)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    return train(tmp_path_factory.mktemp("lm"), corpus, max_steps=200, valid_every=100)


def test_train_lm_overfits_a_tiny_corpus(trained, corpus):
    path, result = trained
    assert result.unigram_valid_ppl > 50
    assert result.best_valid_ppl < 1.5  # near-zero loss on its 20 training sentences
    lm = load_lm(path)
    sentences = [line.split() for line in open(corpus, encoding="utf-8")]
    assert perplexity(LMScorer(lm), sentences) == pytest.approx(result.best_valid_ppl, rel=1e-5)
    assert Path(path + ".checkpoint").exists() and Path(path + ".curve.png").exists()
    assert lm.describe()["valid_ppl"] == pytest.approx(result.best_valid_ppl)


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path, corpus):
    (tmp_path / "full").mkdir()
    (tmp_path / "parts").mkdir()
    common = dict(valid_every=4, batch_tokens=100, order=4)
    full, _ = train(tmp_path / "full", corpus, max_steps=10, **common)
    part, _ = train(tmp_path / "parts", corpus, max_steps=5, **common)
    train(tmp_path / "parts", corpus, max_steps=10, resume=True, **common)
    a = Trainer.read_checkpoint(full + ".checkpoint")
    b = Trainer.read_checkpoint(part + ".checkpoint")
    assert a["meta"]["position"]["step"] == b["meta"]["position"]["step"] == 10
    for name, tensor in a["network"].items():
        assert torch.equal(tensor, b["network"][name]), name


def test_model_files_are_not_mixed_up(trained, tiny_model_path):
    path, _ = trained
    with pytest.raises(ModelFileError, match="CSLM language model"):
        load_model(path)
    with pytest.raises(ModelFileError, match="encoder-decoder model"):
        load_lm(tiny_model_path)
    table = str(Path(__file__).parent / "data" / "moses" / "tiny.phrase-table")
    proc = subprocess.run(
        [sys.executable, "-m", "phrasescore", "rescore", table, "-m", path, "-o", "-"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "--lm" in proc.stderr and proc.stdout == ""
    info = subprocess.run(
        [sys.executable, "-m", "phrasescore", "info", path], capture_output=True, text=True
    )
    assert info.returncode == 0, info.stderr
    assert load_lm(path).signature in info.stdout


def test_sentence_and_phrase_contexts():
    config = LMConfig(order=4, embedding_dim=8, hidden_dims=[16], vocab_size=30)
    torch.manual_seed(0)
    lm_net = FeedForwardLM(config).eval()
    tgt_in = torch.tensor([[BOS_ID, 7, 8, 9]])
    windows = lm_net.windows(tgt_in)[0].tolist()
    assert windows == [[2, 2, 2], [2, 2, 7], [2, 7, 8], [7, 8, 9]]
    lm_net.train()
    config.truncate_context = 1.0
    truncated = lm_net.truncate(torch.full((500, 3), 9))
    for row in truncated.tolist():  # NULL on the left only, the last k words kept
        kept = sum(1 for x in row if x == 9)
        assert row == [PAD_ID] * (3 - kept) + [9] * kept and kept < 3


def test_scorer_modes(trained):
    lm = load_lm(trained[0])
    scorer = LMScorer(lm, chunk_rows=5)  # several chunks
    texts = ["un homme en vert", "un homme", "zzz inconnu"]
    sentences = scorer.score_sentences(texts)
    phrases = scorer.score_phrases(texts)
    assert list(sentences.n_tokens) == [5, 3, 3]  # words + </s>
    assert list(phrases.n_tokens) == [4, 2, 2]  # words only
    assert list(sentences.unknown) == [0, 0, 2]
    assert np.all(sentences.logprob < 0) and np.all(phrases.logprob < 0)
    assert not np.allclose(sentences.logprob, phrases.logprob)
    # batching does not change a score
    alone = [scorer.score_sentences([t]).logprob[0] for t in texts]
    assert np.allclose(alone, sentences.logprob, atol=1e-5)


def test_nbest_command_with_lm_alone_adds_the_cslm_feature(trained, tmp_path):
    """``nbest LIST --source SRC --lm LM`` (no -m): CSLM0 alone, as Cho et al. used the CSLM."""
    source = write_lines(tmp_path / "source.en", sample_pairs(1)[0])  # a stand-in source
    out = tmp_path / "out.nbest"
    args = ["-q", "nbest", str(NBEST), "--source", source, "--lm", trained[0], "-o", str(out)]
    result = CliRunner().invoke(cli, args + ["--no-progress"])
    assert result.exit_code == 0, result.output
    original = NBEST.read_bytes().decode("utf-8").splitlines(keepends=True)
    written = out.read_bytes().decode("utf-8").splitlines(keepends=True)
    assert len(original) == len(written)
    scorer = LMScorer(load_lm(trained[0]))
    for before, after in zip(original, written, strict=True):
        found = re.findall(r" CSLM0= (\S+)", after)
        assert len(found) == 1 and "RNNEncDec0" not in after
        assert after.replace(f" CSLM0= {found[0]}", "", 1) == before
        hypothesis = before.split("|||")[1]
        expected = scorer.score_sentences([hypothesis]).logprob[0]
        assert float(found[0]) == pytest.approx(expected, rel=1e-5, abs=1e-4)
    # re-ranking with the CSLM weight alone
    counts: dict[str, int] = {}
    for name, values in next(read_nbest(str(NBEST))).parsed_features():
        counts[name] = counts.get(name, 0) + len(values)
    lines = [f"{name}= " + " ".join(["0.1"] * n) for name, n in counts.items() if "_" not in name]
    weights = write_lines(tmp_path / "w", [*lines, "CSLM0= 1.0"])
    ranked = tmp_path / "ranked.nbest"
    result = CliRunner().invoke(
        cli, args[:-1] + [str(ranked), "--no-progress", "--weights", weights]
    )
    assert result.exit_code == 0, result.output
    assert len(ranked.read_text(encoding="utf-8").splitlines()) == len(original)
    # neither a model nor a language model
    result = CliRunner().invoke(cli, ["nbest", str(NBEST), "--source", source])
    assert result.exit_code == 1 and "--model" in result.output


def test_phrase_column_is_a_probability(trained):
    column = LMPhraseColumn(load_lm(trained[0]))
    entries = list(read_phrase_table(str(TABLE)))[:50]
    values = [
        float(v) for v in column.values([e.source for e in entries], [e.target for e in entries])
    ]
    assert all(0.0 < v <= 1.0 for v in values)
    logp = column.logprobs([e.target for e in entries])
    assert np.allclose(np.log(values), np.maximum(logp, -100.0))
    assert column.name.startswith("cslm:") and math.isfinite(sum(values))


def test_nbest_command_adds_both_features_every_other_byte_unchanged(
    trained, tiny_model_path, tmp_path
):
    source = write_lines(tmp_path / "source.en", sample_pairs(1)[0])  # a stand-in source
    out = tmp_path / "out.nbest"
    args = ["-q", "nbest", str(NBEST), "--source", source, "-m", tiny_model_path]
    result = CliRunner().invoke(cli, args + ["--lm", trained[0], "-o", str(out)])
    assert result.exit_code == 0, result.output
    original = NBEST.read_text(encoding="utf-8").splitlines(keepends=True)
    written = out.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(original) == len(written)
    for before, after in zip(original, written, strict=True):
        match = re.search(r" CSLM0= (\S+) RNNEncDec0= (\S+)", after)
        assert match and float(match.group(1)) < 0
        assert after.replace(match.group(0), "", 1) == before
    weights = write_lines(tmp_path / "w", ["RNNEncDec0= 1.0"])
    result = CliRunner().invoke(cli, args + ["--lm", trained[0], "--weights", weights])
    assert result.exit_code == 1 and "CSLM0" in result.output


def test_rescore_command_adds_a_probability_column(trained, tiny_model_path, tmp_path):
    out = tmp_path / "pt.gz"
    args = ["-q", "rescore", str(TABLE), "--lm", trained[0], "--no-progress"]
    result = CliRunner().invoke(cli, args + ["-o", str(out)])
    assert result.exit_code == 0, result.output
    both = tmp_path / "both.gz"
    result = CliRunner().invoke(cli, args + ["-m", tiny_model_path, "-o", str(both)])
    assert result.exit_code == 0, result.output
    original = list(read_phrase_table(str(TABLE)))
    lm_only = list(read_phrase_table(str(out)))
    with_model = list(read_phrase_table(str(both)))
    assert len(original) == len(lm_only) == len(with_model)
    for a, b, c in zip(original, lm_only, with_model, strict=True):
        assert b.scores[:-1] == a.scores and b.tail == a.tail
        assert 0.0 < float(b.scores[-1]) <= 1.0
        assert c.scores[:-2] == a.scores and c.scores[-1] == b.scores[-1]  # the LM column last


def test_bench_lm_kneser_ney_baseline_is_a_distribution():
    import importlib.machinery
    import importlib.util

    path = str(Path(__file__).parent.parent / "tools" / "bench-lm")
    loader = importlib.machinery.SourceFileLoader("bench_lm", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("bench_lm", loader))
    loader.exec_module(module)
    sentences = [[4, 5, 6, 7], [4, 5, 8], [6, 5, 4, 7, 7], [9, 4, 5, 6]]
    vocabulary = [1, 3, 4, 5, 6, 7, 8, 9]
    model = module.ModifiedKneserNey(sentences, 4, vocabulary)
    for history in [(BOS_ID,), (BOS_ID, 4), (4, 5, 6), (9, 9, 9), ()]:
        total = math.fsum(model.prob(history, w) for w in vocabulary)
        assert total == pytest.approx(1.0, abs=1e-9), history
    # a history shorter than order - 1 (the start of a sentence) is used whole
    assert model.prob((BOS_ID, 4), 5) == model._prob((BOS_ID, 4), 5) > model._prob((4,), 5)


def test_rescore_gives_a_long_phrase_the_floor_value_in_the_lm_column_too(trained, tmp_path):
    from phrasescore.jobs.rescore.rescore import RescoreOptions, rescore_table

    table = write_lines(
        tmp_path / "pt", ["a ||| un chat ||| 0.5", f"a ||| {' '.join(['le'] * 20)} ||| 0.5"]
    )
    out = tmp_path / "out"
    options = RescoreOptions(max_phrase_length=10)
    result = rescore_table(table, [], str(out), options, progress=False, lm_paths=[trained[0]])
    assert result.too_long == 1
    values = [e.scores[-1] for e in read_phrase_table(str(out))]
    assert float(values[0]) > 3.8e-44 and values[1] == "3.720075976020836e-44"
