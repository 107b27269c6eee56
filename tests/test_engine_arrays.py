"""The engine over arrays. Phrase ids from the cache equal encode_phrases'; the batch
plan's pieces (distinct sources, id matrices, exact buckets) equal plain Python loops over lists; scores
of the fixed-shape plan equal the exact plan's within the engine's tolerance; every scorer
implements the protocol."""

from __future__ import annotations

import gzip
from itertools import islice

import numpy as np
import pytest

from phrasescore.engine.batching import (
    ExactBuckets,
    FixedShapeBuckets,
    IdPairs,
    distinct_sequences,
    id_matrix,
)
from phrasescore.engine.constant_scoring import ConstantScorer
from phrasescore.engine.graph_scoring import CudaGraphScorer
from phrasescore.engine.protocol import IdScorer, Scorer, build_scorer, engine_for
from phrasescore.engine.scoring import CpuScorer, EnsembleScorer, phrase_tokens
from phrasescore.text.phrase_ids import PhraseIds

from .conftest import DATA

TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"


@pytest.fixture
def tiny_model(tiny_model_path):
    from phrasescore.bundle import load_model

    return load_model(tiny_model_path)


def table_pairs(lines: int = 300) -> tuple[list[str], list[str]]:
    src, tgt = [], []
    for line in islice(gzip.open(TABLE, "rt", encoding="utf-8"), lines):
        fields = line.split(" ||| ")
        src.append(fields[0])
        tgt.append(fields[1])
    return src, tgt


def test_distinct_sequences_are_those_of_a_dict_of_tuples():
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, 5, size=rng.integers(0, 4))) for _ in range(500)]
    pairs = IdPairs.from_lists(seqs, seqs)
    first, which = distinct_sequences(pairs.src_ids, pairs.src_offsets)
    index: dict[tuple, int] = {}
    expected = [index.setdefault(tuple(s), len(index)) for s in seqs]
    assert which.tolist() == expected
    assert [tuple(seqs[i]) for i in first] == list(index)


def test_id_matrix_pads_after_each_sequence():
    pairs = IdPairs.from_lists([[5, 6, 7], [8], []], [[1], [1], [1]])
    m = id_matrix(pairs.src_ids, pairs.src_offsets, np.array([2, 0, 1]), 3)
    assert m.tolist() == [[0, 0, 0], [5, 6, 7], [8, 0, 0]]


def test_exact_buckets_equal_a_loop_over_runs_of_one_length():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 9, size=2000)
    order = np.argsort(lengths, kind="stable")
    got = [b.index.tolist() for b in ExactBuckets(64).batches(lengths, order, 1)]
    expected, start = [], 0
    while start < len(order):  # each batch: one length, at most 64 // (length + 1) rows
        length = int(lengths[order[start]])
        rows = max(1, 64 // (length + 1))
        end, limit = start + 1, min(len(order), start + rows)
        while end < limit and lengths[order[end]] == length:
            end += 1
        expected.append(order[start:end].tolist())
        start = end
    assert got == expected


@pytest.mark.parametrize("lowercase", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_phrase_ids_equal_the_tokens_through_the_vocabulary(tiny_model, lowercase, reverse):
    model = tiny_model
    src, tgt = table_pairs()
    src += ["a\tb", "UPPER Case", "", "été  x", "<unk> x"]
    tgt += ["c  d", "ÉTÉ", "", "x\ty", "<unk>"]
    saved = (model.src_text.lowercase, model.tgt_text.lowercase, model.config.reverse_target)
    model.src_text.lowercase = model.tgt_text.lowercase = lowercase
    model.config.reverse_target = reverse
    try:
        # the reference: the tokeniser's tokens through the vocabulary, one phrase at a time
        expected = ConstantScorer(model).encoder.encode_tokens(
            [phrase_tokens(model.src_text, s) for s in src],
            [phrase_tokens(model.tgt_text, t) for t in tgt],
        )
        src_ids = PhraseIds(model.src_vocab, model.src_text)
        tgt_ids = PhraseIds(
            model.tgt_vocab, model.tgt_text, model.config.target_order if reverse else None
        )
        s = src_ids.encode_list([x.encode() for x in src])
        t = tgt_ids.encode_list([x.encode() for x in tgt])
        # the one-pass path alone (no phrase of the fallback's kind): the same ids
        plain = [x.encode() for x in tgt[:-5]]
        one_pass = tgt_ids.encode(b"".join(p + b"\n" for p in plain))
        assert one_pass.offsets.tolist() == t.offsets[: len(plain) + 1].tolist()
        assert one_pass.ids.tolist() == t.ids[: one_pass.offsets[-1]].tolist()
        pairs = IdPairs(s, t)
        expected_pairs = IdPairs.from_lists(expected.src_ids, expected.tgt_ids)
        for a, b in zip(
            (pairs.src_ids, pairs.src_offsets, pairs.tgt_ids, pairs.tgt_offsets),
            (expected_pairs.src_ids, expected_pairs.src_offsets, expected_pairs.tgt_ids,
             expected_pairs.tgt_offsets),
            strict=True,
        ):  # fmt: skip
            assert a.tolist() == b.tolist()
        assert s.unknown.tolist() == expected.src_unknown.tolist()
        assert t.unknown.tolist() == expected.tgt_unknown.tolist()
    finally:
        model.src_text.lowercase, model.tgt_text.lowercase, model.config.reverse_target = saved


@pytest.mark.parametrize("include_eos", [True, False])
def test_fixed_shape_plan_scores_as_exact_lengths(tiny_model, include_eos):
    """The plan of a device that is neither CPU nor CUDA (fixed shapes, no graphs) run on the
    CPU: the scores of the table's pairs equal the exact plan's within 1e-4 in log p (the
    engine's documented tolerance for other batch shapes)."""
    src, tgt = table_pairs()
    exact = build_scorer(tiny_model, include_eos=include_eos)
    assert isinstance(exact.buckets, ExactBuckets)
    assert engine_for("mps") is CudaGraphScorer
    padded = CudaGraphScorer(
        tiny_model, "cpu", include_eos=include_eos, buckets=FixedShapeBuckets(batch_pairs=64)
    )
    assert not padded.captured.enabled
    a = exact.score_phrases(src, tgt, per_token=True)
    b = padded.score_phrases(src, tgt, per_token=True)
    assert np.abs(a.logprob - b.logprob).max() < 1e-4
    for x, y in zip(a.token_logprobs, b.token_logprobs, strict=True):
        assert x.shape == y.shape
        assert np.abs(x - y).max() < 1e-4


def test_phrases_score_as_their_tokens_a_line_break_inside_one_included(tiny_model):
    """score_phrases encodes each side in one pass (PhraseIds); the scores, token counts and
    unknown-word counts are those of the tokens' path, also for phrases the one pass cannot
    take (a tab, a run of spaces, an empty phrase, a line break inside a phrase)."""
    src, tgt = table_pairs(40)
    src += ["a\tb", "", "x  y"]
    tgt += ["c  d", "", "x\ny"]
    scorer = build_scorer(tiny_model)
    got = scorer.score_phrases(src, tgt, per_token=True)
    expected = scorer.score_tokens(
        [phrase_tokens(tiny_model.src_text, s) for s in src],
        [phrase_tokens(tiny_model.tgt_text, t) for t in tgt],
        per_token=True,
    )
    assert got.logprob.tobytes() == expected.logprob.tobytes()
    for field in ("n_tokens", "src_unknown", "tgt_unknown"):
        assert getattr(got, field).tolist() == getattr(expected, field).tolist(), field
    assert got.src_unknown.sum() > 0
    # without the line break: the one pass (another block: its batches' floats may differ)
    ok = scorer.score_phrases(src[:-1], tgt[:-1]).logprob
    np.testing.assert_allclose(ok, got.logprob[:-1], rtol=0, atol=1e-5)


def test_score_arrays_equal_score_ids(tiny_model):
    src, tgt = table_pairs()
    scorer = build_scorer(tiny_model)
    enc = scorer.encode_phrases(src, tgt)
    by_lists, _ = scorer.score_ids(enc.src_ids, enc.tgt_ids)
    by_arrays, _ = scorer.score_arrays(IdPairs.from_lists(enc.src_ids, enc.tgt_ids))
    assert by_lists.tolist() == by_arrays.tolist()


def test_every_scorer_implements_the_protocol(tiny_model):
    pair = build_scorer(tiny_model)
    assert isinstance(pair, CpuScorer)
    assert isinstance(pair, IdScorer)
    assert isinstance(ConstantScorer(tiny_model), IdScorer)
    assert isinstance(EnsembleScorer([pair, build_scorer(tiny_model)]), Scorer)
    constant = ConstantScorer(tiny_model, -2.0)
    src, tgt = table_pairs(10)
    assert constant.score_phrases(src, tgt).logprob.tolist() == [-2.0] * 10
