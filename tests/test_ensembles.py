"""Ensembles as one re-ranking feature: ``nbest -m A -m B`` and ``ab --rerank
NAME=A,B`` average the models' next-token probabilities (:class:`EnsembleScorer`)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from phrasescore.bundle import load_model
from phrasescore.cli import cli
from phrasescore.engine.scoring import EnsembleScorer, PairScorer
from phrasescore.moses.nbest import read_nbest

from .conftest import sample_pairs
from .test_nbest import MULTI30K_LIST, MULTI30K_SRC, check_one_feature_added, text_bytes


@pytest.fixture(scope="module")
def scorers(tiny_model_path, tiny_second_seed_model_path) -> tuple[PairScorer, PairScorer]:
    return PairScorer(load_model(tiny_model_path)), PairScorer(
        load_model(tiny_second_seed_model_path)
    )


def test_the_ensemble_averages_next_token_probabilities(scorers):
    src, tgt = sample_pairs(25)
    first, second = (s.score_phrases(src, tgt, per_token=True) for s in scorers)
    assert np.abs(first.logprob - second.logprob).max() > 0.1  # two different models
    ensemble = EnsembleScorer(scorers).score_phrases(src, tgt, per_token=True)
    for i in range(len(src)):
        a, b = first.token_logprobs[i], second.token_logprobs[i]
        expected = np.log((np.exp(a) + np.exp(b)) / 2)  # per token, end of sentence included
        np.testing.assert_allclose(ensemble.token_logprobs[i], expected, rtol=1e-9, atol=1e-9)
        assert ensemble.logprob[i] == pytest.approx(expected.sum(), rel=1e-9)
    # log of an average: at least the average of the logs (Jensen), at most the larger, per token
    for i in range(len(src)):
        a, b = first.token_logprobs[i], second.token_logprobs[i]
        assert ensemble.logprob[i] >= (a + b).sum() / 2 - 1e-9
        assert ensemble.logprob[i] <= np.maximum(a, b).sum() + 1e-9
    np.testing.assert_array_equal(ensemble.n_tokens, first.n_tokens)


def test_an_ensemble_of_one_model_twice_is_that_model(scorers):
    src, tgt = sample_pairs(25)
    alone = scorers[0].score_phrases(src, tgt)
    twice = EnsembleScorer([scorers[0], scorers[0]]).score_phrases(src, tgt)
    np.testing.assert_allclose(twice.logprob, alone.logprob, rtol=1e-9, atol=1e-9)


def test_nbest_with_two_models_adds_one_feature_their_ensemble(
    tmp_path, tiny_model_path, tiny_second_seed_model_path, scorers
):
    out = tmp_path / "ensemble.nbest"
    args = ["nbest", str(MULTI30K_LIST), "--source", str(MULTI30K_SRC), "--no-progress"]
    result = CliRunner().invoke(
        cli, [*args, "-m", tiny_model_path, "-m", tiny_second_seed_model_path, "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    sources = MULTI30K_SRC.read_text(encoding="utf-8").splitlines()
    entries = list(read_nbest(str(MULTI30K_LIST)))
    expected = EnsembleScorer(scorers).score_phrases(
        [sources[e.id] for e in entries], [e.hypothesis for e in entries]
    )
    check_one_feature_added(text_bytes(MULTI30K_LIST), out.read_bytes(), list(expected.logprob))
    # the same models in one run more: the same bytes
    again = tmp_path / "again.nbest"
    CliRunner().invoke(
        cli, [*args, "-m", tiny_model_path, "-m", tiny_second_seed_model_path, "-o", str(again)]
    )
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize(
    "other, what",
    [("tiny_inverse_model_path", "target vocabulary"), ("tiny_r2l_model_path", "direction")],
)
def test_models_that_cannot_be_averaged_are_refused_by_name(
    tmp_path, tiny_model_path, other, what, request
):
    other_path = request.getfixturevalue(other)
    out = tmp_path / "refused.nbest"
    result = CliRunner().invoke(
        cli,
        ["-q", "nbest", str(MULTI30K_LIST), "--source", str(MULTI30K_SRC)]
        + ["-m", tiny_model_path, "-m", other_path, "-o", str(out)],
    )
    assert result.exit_code == 1
    assert f"the {what}" in result.output and other_path in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()
