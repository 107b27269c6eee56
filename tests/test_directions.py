"""Re-ranking models of the other directions: right to left (``train
--reverse-target``) and target->source (``nbest --inverse``, ``ab --rerank-inverse``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from phrasescore.bundle import load_model
from phrasescore.cli import cli
from phrasescore.engine.scoring import PairScorer
from phrasescore.engine.search import SearchOptions, beam_search
from phrasescore.model.config import ModelConfig
from phrasescore.moses.nbest import read_nbest

from .conftest import DATA, sample_pairs

NBEST = DATA / "nbest"
MULTI30K_LIST = NBEST / "multi30k.test2016.ids0-4.100best.nbest.gz"
MULTI30K_SRC = NBEST / "multi30k.test2016.head5.tok.lc.en"


def invoke(*args: str):
    return CliRunner().invoke(cli, ["-q", *args])


@pytest.fixture(scope="module")
def inverse_model_path(tiny_inverse_model_path) -> str:
    return tiny_inverse_model_path


def test_target_order_turns_words_round_only_for_a_right_to_left_model():
    words = ["un", "chien", "court"]
    assert ModelConfig().target_order(words) == words
    r2l = ModelConfig(reverse_target=True)
    assert r2l.target_order(words) == ["court", "chien", "un"]
    assert r2l.target_order(r2l.target_order(words)) == words
    # model files written before the field load as left to right
    old = ModelConfig().to_dict()
    del old["reverse_target"]
    assert ModelConfig.from_dict(old).reverse_target is False


def test_right_to_left_model_scores_the_reversed_target(tiny_r2l_model_path):
    """log p_R2L(y | x) is the network's log p of y's words last to first: the same network
    read left to right on the reversed targets gives the same numbers."""
    model = load_model(tiny_r2l_model_path)
    assert model.config.reverse_target
    src, tgt = sample_pairs(30)
    r2l = PairScorer(model).score_phrases(src, tgt)
    model.network.config.reverse_target = False  # the same weights, read left to right
    reversed_targets = [" ".join(t.split()[::-1]) for t in tgt]
    as_l2r = PairScorer(model).score_phrases(src, reversed_targets)
    natural = PairScorer(model).score_phrases(src, tgt)
    np.testing.assert_allclose(r2l.logprob, as_l2r.logprob, rtol=1e-6, atol=1e-5)
    # and the order matters: a palindrome-free sample scores differently read the other way
    assert np.abs(r2l.logprob - natural.logprob).max() > 1e-2


def test_right_to_left_model_learns_the_reversed_data(tiny_r2l_model_path, corpus_files):
    """Trained on reversed targets, it scores the training pairs better in its own order than
    the same weights do reading them left to right."""
    model = load_model(tiny_r2l_model_path)
    src, tgt = sample_pairs(60)
    own = PairScorer(model).score_phrases(src, tgt).logprob.sum()
    model.network.config.reverse_target = False
    other = PairScorer(model).score_phrases(src, tgt).logprob.sum()
    assert own > other + 50.0


def test_right_to_left_translation_comes_out_in_natural_order(tiny_r2l_model_path, tmp_path):
    model = load_model(tiny_r2l_model_path)
    src, _ = sample_pairs(4)
    ids = model.src_vocab.encode_batch([s.split() for s in src])
    hyps = beam_search(model.network, ids, SearchOptions(beam=3, max_length=12))
    expected = [" ".join(model.tgt_vocab.decode(h[0].ids)[::-1]) for h in hyps]
    source = tmp_path / "src.en"
    source.write_text("".join(s + "\n" for s in src), encoding="utf-8")
    out = tmp_path / "out.fr"
    args = ["translate", str(source), "-m", tiny_r2l_model_path, "--beam", "3", "-o", str(out)]
    result = invoke(*args, "--max-length", "12")
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").splitlines() == expected
    # and its n-best feature is its own score of the hypothesis as written (natural order)
    assert model.target_words(hyps[0][0].ids) == expected[0].split()


def test_align_refuses_a_right_to_left_model(tiny_r2l_model_path, tmp_path):
    src = tmp_path / "a.en"
    src.write_text("a dog\n", encoding="utf-8")
    result = invoke(
        "align", str(src), str(src), "-m", tiny_r2l_model_path, "-o", str(tmp_path / "x")
    )
    assert result.exit_code == 1
    assert "error:" in result.output and "Traceback" not in result.output


def _feature_values(path, name):
    pattern = re.compile(rf" {name}= (\S+)")
    return [float(pattern.search(e.features + " ").group(1)) for e in read_nbest(str(path))]


def test_nbest_inverse_adds_log_p_of_the_source_given_each_hypothesis(
    tmp_path, inverse_model_path, tiny_r2l_model_path
):
    out = tmp_path / "inv.nbest"
    args = ["nbest", str(MULTI30K_LIST), "--source", str(MULTI30K_SRC)]
    result = invoke(*args, "-m", inverse_model_path, "--inverse", "--name", "Inv", "-o", str(out))
    assert result.exit_code == 0, result.output
    entries = list(read_nbest(str(MULTI30K_LIST)))
    sources = MULTI30K_SRC.read_text(encoding="utf-8").splitlines()
    scorer = PairScorer(load_model(inverse_model_path))
    hyps = [e.hypothesis for e in entries]
    expected = scorer.score_phrases(hyps, [sources[e.id] for e in entries]).logprob
    got = _feature_values(out, "Inv")
    assert len(got) == len(entries)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    # one source per id: the hypotheses of an id differ in log p(source | hypothesis)
    assert len({round(v, 3) for v in got[:100]}) > 10
    # a second feature from a right-to-left model, chained as ab does: both kept, in order
    out2 = tmp_path / "inv+r2l.nbest"
    result = invoke("nbest", str(out), "--source", str(MULTI30K_SRC), "-m", tiny_r2l_model_path,
                    "--name", "R2L", "-o", str(out2))  # fmt: skip
    assert result.exit_code == 0, result.output
    r2l = PairScorer(load_model(tiny_r2l_model_path))
    want = r2l.score_phrases([sources[e.id] for e in entries], hyps).logprob
    np.testing.assert_allclose(_feature_values(out2, "R2L"), want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(_feature_values(out2, "Inv"), got, rtol=0, atol=0)
    first = next(read_nbest(str(out2))).features
    assert first.index("Inv=") < first.index("R2L=")


def test_nbest_inverse_needs_a_model(tmp_path):
    args = ["nbest", str(MULTI30K_LIST), "--source", str(MULTI30K_SRC), "--inverse"]
    result = invoke(*args, "--lm", str(tmp_path / "none.safetensors"))
    assert result.exit_code != 0
    assert "--inverse needs -m MODEL" in result.output
