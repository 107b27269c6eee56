"""Beam search and sampling (phrasescore.engine.search), on a toy architecture and a tiny trained model."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from phrasescore.bundle import load_model
from phrasescore.engine.scoring import PairScorer
from phrasescore.engine.search import (
    Hypothesis,
    SearchOptions,
    beam_search,
    emittable_tokens,
    greedy_decode,
    length_penalty,
    merge_candidates,
    sample,
)
from phrasescore.errors import InputError
from phrasescore.model.base import EncoderDecoder
from phrasescore.model.config import ModelConfig
from phrasescore.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

from .conftest import sample_pairs

A, B, C, D = 4, 5, 6, 7  # the toy's words


class ToyMarkov(EncoderDecoder):
    """A first-order Markov model behind the architecture interface.

    p(y_t | y_{t-1}, x) is a fixed table row chosen by the previous word, plus a bias that depends
    on the source's first word (so sources of one batch want different outputs). The state holds
    a per-source tensor of another shape ([B, S, 1], like attention memory) that must follow its
    hypotheses when the beam is reordered: ``step`` checks it.
    """

    def __init__(self, table: Tensor, source_bias: Tensor):
        super().__init__()
        vocab = table.shape[0]
        self.config = ModelConfig(src_vocab_size=source_bias.shape[0], tgt_vocab_size=vocab)
        self.register_buffer("table", table.log())
        self.register_buffer("source_bias", source_bias)

    def encode(self, src: Tensor, src_lengths: Tensor) -> dict[str, Tensor]:
        first = src[:, 0]
        memory = first.float()[:, None, None].expand(-1, src.shape[1], 1).clone()
        return {"first": first, "memory": memory}

    def start(self, enc):
        return {"first": enc["first"], "memory": enc["memory"]}

    def step(self, state, prev):
        assert torch.equal(state["memory"][:, 0, 0].long(), state["first"])
        features = self.table[prev] + self.source_bias[state["first"]]
        return features, state

    def logits(self, features):
        return features


def toy_model(vocab: int = 8) -> ToyMarkov:
    """After BOS: A 0.5, B 0.4 (then A -> anything, flat; B -> EOS 0.99)."""
    table = torch.full((vocab, vocab), 1e-9)
    table[BOS_ID, A], table[BOS_ID, B], table[BOS_ID, EOS_ID] = 0.5, 0.4, 0.1
    table[A, [A, B, C, D, EOS_ID]] = 0.2
    table[B, EOS_ID], table[B, C] = 0.99, 0.01
    table[C, EOS_ID], table[D, EOS_ID] = 1.0, 1.0
    table[[PAD_ID, UNK_ID, EOS_ID], EOS_ID] = 1.0
    table = table / table.sum(dim=1, keepdim=True)
    bias = torch.zeros(vocab, vocab)
    bias[D, D] = 30.0  # a source starting with D makes D the best word everywhere
    return ToyMarkov(table, bias)


def test_beam_finds_what_greedy_misses():
    net = toy_model()
    greedy = beam_search(net, [[A]], SearchOptions(beam=1, nbest=1, length_penalty=0))[0]
    assert greedy[0].ids[0] == A  # argmax first word, then a flat distribution
    best = beam_search(net, [[A]], SearchOptions(beam=2, nbest=2, length_penalty=0))[0]
    assert best[0].ids == (B,)
    assert best[0].logprob == pytest.approx(math.log(0.4 * 0.99), abs=1e-5)
    assert best[0].logprob >= best[1].logprob


def test_reordering_follows_every_state_tensor_and_sources_stay_apart():
    net = toy_model()
    options = SearchOptions(beam=3, nbest=3, max_length=4, length_penalty=0)
    together = beam_search(net, [[A, B], [D], [C, C, C]], options)
    alone = [beam_search(net, [src], options)[0] for src in ([A, B], [D], [C, C, C])]
    assert [[h.ids for h in hyps] for hyps in together] == [[h.ids for h in a] for a in alone]
    assert together[1][0].ids[0] == D  # the source-dependent bias
    assert together[0][0].ids == (B,)


def test_max_length_forces_end_of_sequence():
    net = toy_model()
    for limit in (0, 1, 2):
        hyps = beam_search(
            net, [[D]], SearchOptions(beam=2, nbest=2, max_length=limit, length_penalty=0)
        )[0]
        assert hyps and all(len(h.ids) <= limit for h in hyps)
        assert hyps[0].ids == (D,) * min(limit, 1)
    hyps = beam_search(net, [[A]], SearchOptions(beam=1, max_length=0))[0]
    assert hyps[0].ids == () and hyps[0].logprob == pytest.approx(math.log(0.1), abs=1e-5)


def test_beam_larger_than_the_vocabulary_is_an_error():
    net = toy_model()
    limit = emittable_tokens(8, forbid_unk=False)
    assert limit == 6  # 8 ids less PAD and BOS
    hyps = beam_search(net, [[A]], SearchOptions(beam=limit, nbest=limit, max_length=3))[0]
    assert len(hyps) == limit and len({h.ids for h in hyps}) == limit
    with pytest.raises(InputError, match="larger than the target vocabulary"):
        beam_search(net, [[A]], SearchOptions(beam=limit + 1))
    with pytest.raises(InputError, match="larger than the target vocabulary"):
        beam_search(net, [[A]], SearchOptions(beam=limit, forbid_unk=True))
    with pytest.raises(InputError, match="larger than the beam"):
        beam_search(net, [[A]], SearchOptions(beam=2, nbest=3))


def test_length_penalty_changes_the_ranking_only():
    assert length_penalty(7, 0.0) == 1.0
    assert length_penalty(1, 1.0) == 1.0
    net = toy_model()
    raw = beam_search(net, [[A]], SearchOptions(beam=4, nbest=4, length_penalty=0.0))[0]
    norm = beam_search(net, [[A]], SearchOptions(beam=4, nbest=4, length_penalty=2.0))[0]
    assert all(h.score == h.logprob for h in raw)
    for h in norm:
        assert h.score == pytest.approx(h.logprob / length_penalty(len(h.ids) + 1, 2.0))
    assert [h.score for h in norm] == sorted((h.score for h in norm), reverse=True)


# ---------------------------------------------------------------------------- a trained model
@pytest.fixture(scope="module")
def trained(tiny_model_path):
    model = load_model(tiny_model_path)
    src, _ = sample_pairs(8)
    ids = model.src_vocab.encode_batch([s.split() for s in src])
    return model, ids


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_1_is_greedy_decoding(trained, alpha):
    model, ids = trained
    greedy = greedy_decode(model.network, ids, max_length=12)
    options = SearchOptions(beam=1, max_length=12, length_penalty=alpha)
    beam = beam_search(model.network, ids, options)
    for g, (b,) in zip(greedy, beam, strict=True):
        assert b.ids == g.ids
        assert b.logprob == pytest.approx(g.logprob, rel=1e-6, abs=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_scores_are_the_teacher_forced_logprob(trained, alpha):
    model, ids = trained
    found = beam_search(model.network, ids, SearchOptions(beam=4, nbest=4, length_penalty=alpha))
    scorer = PairScorer(model)
    src = [s for s, hyps in zip(ids, found, strict=True) for _ in hyps]
    tgt = [list(h.ids) for hyps in found for h in hyps]
    expected, _ = scorer.score_ids(src, tgt)
    got = [h.logprob for hyps in found for h in hyps]
    assert len(got) == 4 * len(ids)
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-4
    for hyps in found:
        assert len({h.ids for h in hyps}) == len(hyps)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert all(BOS_ID not in h.ids and PAD_ID not in h.ids for h in hyps)


def test_batched_search_equals_one_source_at_a_time(trained):
    model, ids = trained
    options = SearchOptions(beam=3, nbest=3, length_penalty=0.6)
    together = beam_search(model.network, ids, options)
    for src, hyps in zip(ids, together, strict=True):
        (alone,) = beam_search(model.network, [src], options)
        assert [h.ids for h in alone] == [h.ids for h in hyps]
        assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(alone, hyps, strict=True))


def test_forbid_unk(trained):
    model, ids = trained
    found = beam_search(model.network, ids, SearchOptions(beam=5, nbest=5, forbid_unk=True))
    assert all(UNK_ID not in h.ids for hyps in found for h in hyps)


def test_sampling_is_deterministic_and_scored_by_the_model(trained):
    model, ids = trained
    first = sample(model.network, ids[0], n=40, top=6, seed=7)
    again = sample(model.network, ids[0], n=40, top=6, seed=7)
    other = sample(model.network, ids[0], n=40, top=6, seed=8)
    assert first == again
    assert first != other
    assert 1 <= len(first) <= 6 and len({h.ids for h in first}) == len(first)
    assert [h.logprob for h in first] == sorted((h.logprob for h in first), reverse=True)
    expected, _ = PairScorer(model).score_ids([ids[0]] * len(first), [list(h.ids) for h in first])
    assert max(abs(h.logprob - e) for h, e in zip(first, expected, strict=True)) < 1e-4
    no_unk = sample(model.network, ids[0], n=40, top=40, seed=7, forbid_unk=True)
    assert all(UNK_ID not in h.ids and EOS_ID not in h.ids for h in no_unk)


def test_merge_candidates_keeps_distinct_best():
    a = [Hypothesis((4,), -1.0, -0.5), Hypothesis((5,), -3.0, -3.0)]
    b = [Hypothesis((4,), -1.0, -1.0), Hypothesis((6,), -2.0, -2.0)]
    merged = merge_candidates(a, b, top=2)
    assert [h.ids for h in merged] == [(4,), (6,)]


def test_a_search_step_waits_for_the_device_once(trained):
    """Batched beam search on a GPU: per step one read of a device value (which sources are
    done, the step's ``nonzero``), none for the length limit; per search, the longest limit and
    the encoder's look at the padding."""
    from .conftest import HostReads

    model, ids = trained
    with HostReads() as reads:
        found = beam_search(model.network, ids, SearchOptions(beam=3, nbest=2, max_length=6))
    assert len(found) == len(ids)
    per_step = {k: n for k, n in reads.seen.items() if k.startswith("aten.nonzero_numpy")}
    once = {k: n for k, n in reads.seen.items() if k not in per_step}
    assert len(per_step) == 1 and 1 <= sum(per_step.values()) <= 7  # <= max_length + 1 steps
    assert sum(once.values()) <= 2, once
