"""Scoring by shared prefixes (engine/prefix_scoring.py): the trie holds each distinct (source,
prefix, word) once and every pair's path spells its target; groups cover every pair within the
budget; on a real 100-best list every architecture and direction gives the pair plan's log p
and per-token terms within 1e-5 while computing about half the positions; a list without
shared prefixes falls back to the pair plan; nbest's default and --no-shared-prefixes agree."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from phrasescore.bundle import TrainedModel
from phrasescore.engine.batching import (
    FixedShapeBuckets,
    IdPairs,
    distinct_sequences,
    sorted_runs,
)
from phrasescore.engine.graph_scoring import CudaGraphScorer
from phrasescore.engine.prefix_scoring import build_trie, source_groups
from phrasescore.engine.scoring import CpuScorer
from phrasescore.special_ids import EOS_ID

from .conftest import DATA, run_cli, untrained_model

NBEST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
SOURCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"


def list_pairs() -> tuple[list[str], list[str]]:
    """(source sentence, hypothesis) of every line of the real 5-sentence 100-best list."""
    sources = SOURCE.read_text(encoding="utf-8").splitlines()
    src, hyp = [], []
    for line in gzip.open(NBEST, "rt", encoding="utf-8"):
        fields = line.split(" ||| ")
        src.append(sources[int(fields[0])])
        hyp.append(fields[1].strip())
    return src, hyp


def list_model(arch: str, recurrence: str = "written", **overrides) -> TrainedModel:
    """A freshly initialised tiny network of ``arch`` with the list's vocabularies."""
    src, hyp = list_pairs()
    return untrained_model(src, hyp, arch, recurrence, seed=5, **overrides)


def test_the_trie_holds_each_distinct_prefix_once_and_each_path_spells_its_target():
    rng = np.random.default_rng(7)
    sources = rng.integers(0, 4, size=300)
    targets = [list(rng.integers(4, 8, size=rng.integers(0, 6))) for _ in range(300)]
    pairs = IdPairs.from_lists([[int(s) + 4] for s in sources], targets)
    trie = build_trie(sources, pairs, np.arange(300))
    prefixes = {
        (s, tuple(t[:d]), w)
        for s, t in zip(sources, targets, strict=True)
        for d, w in enumerate([*t, EOS_ID])
    }
    assert trie.nodes == len(prefixes)
    words = np.concatenate([level.word for level in trie.levels])
    for i, target in enumerate(targets):
        path = trie.paths[i]
        assert words[path[path >= 0]].tolist() == [*target, EOS_ID]
        assert (path[len(target) + 1 :] == -1).all()
    # pairs of one source with one first word share their first node, and only they
    first = {}
    for i, target in enumerate(targets):
        key = (sources[i], ([*target, EOS_ID])[0])
        assert first.setdefault(key, trie.paths[i, 0]) == trie.paths[i, 0]
    assert len(set(first.values())) == len(first)


def test_groups_cover_every_pair_once_within_the_budget():
    rng = np.random.default_rng(8)
    pair_source = np.sort(rng.integers(0, 40, size=2000))
    pair_source = np.concatenate([pair_source, np.full(900, 41)])  # 900 pairs: over the budget
    cost = rng.integers(2, 20, size=len(pair_source))
    groups = list(source_groups(pair_source, cost, 1000))
    every = np.concatenate(groups)
    assert sorted(every.tolist()) == list(range(len(pair_source)))
    for group in groups:
        sources = set(pair_source[group].tolist())
        assert int(cost[group].sum()) <= 1000 or sources == {41}
        if 41 in sources:  # the large source is cut, and alone in its groups
            assert sources == {41} and int(cost[group].sum()) <= 1000
    assert sum(41 in set(pair_source[g].tolist()) for g in groups) > 1


CASES = [  # (arch, recurrence, config overrides, include_eos)
    ("cho", "written", {}, True),
    ("cho", "fused", {}, True),
    ("attention", "written", {}, True),
    ("attention", "fused", {}, True),
    ("lstm", "written", {}, True),
    ("transformer", "written", {}, True),
    ("transformer", "written", {"reverse_target": True}, False),
    ("cho", "written", {"reverse_target": True}, True),
    ("attention", "written", {}, False),
    ("cho", "written", {"reverse_target": True}, False),
]


@pytest.mark.parametrize(("arch", "recurrence", "overrides", "include_eos"), CASES)
def test_prefixes_score_as_pairs_on_a_real_nbest_list(arch, recurrence, overrides, include_eos):
    model = list_model(arch, recurrence, **overrides)
    src, hyp = list_pairs()
    expected = CpuScorer(model, include_eos=include_eos).score_phrases(src, hyp, per_token=True)
    scorer = CpuScorer(model, include_eos=include_eos, shared_prefixes=True, batch_tokens=2000)
    ids = scorer.encoder.encode_arrays(src, hyp)
    _, pair_source = distinct_sequences(ids.src_ids, ids.src_offsets)
    order = np.argsort(pair_source, kind="stable")
    roots = sorted_runs(pair_source[order])[1]
    positions = int(ids.tgt_lengths().sum()) + len(hyp)
    assert build_trie(roots, ids, order).nodes < 0.6 * positions  # ~half the work
    # the pair plan's teacher-forced decoder never runs: every value comes from the tries
    scorer.network.decode_features = None
    got = scorer.score_phrases(src, hyp, per_token=True)
    assert np.abs(got.logprob - expected.logprob).max() < 1e-5
    assert (got.logprob < 0).all()
    assert got.n_tokens.tolist() == expected.n_tokens.tolist()
    for a, b in zip(got.token_logprobs, expected.token_logprobs, strict=True):
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-5
    assert scorer.score_phrases(src, hyp).logprob.tobytes() == got.logprob.tobytes()


@pytest.mark.parametrize("arch", ["cho", "attention", "lstm", "transformer"])
def test_the_gpu_engine_by_prefixes_scores_as_the_cpu_engine(arch):
    """``nbest --shared-prefixes --device cuda``'s path, run on the CPU: the fixed-shape engine
    (its sources padded to a bucket width) scoring by tries gives the CPU engine's values."""
    model = list_model(arch)
    src, hyp = list_pairs()
    expected = CpuScorer(model).score_phrases(src, hyp, per_token=True)
    buckets = FixedShapeBuckets(batch_pairs=64, batch_tokens=2048)
    engine = CudaGraphScorer(model, device="cpu", shared_prefixes=True, buckets=buckets)
    engine.network.decode_features = None  # every value from the tries
    got = engine.score_phrases(src, hyp, per_token=True)
    assert np.abs(got.logprob - expected.logprob).max() < 1e-5
    for a, b in zip(got.token_logprobs, expected.token_logprobs, strict=True):
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-5


def test_self_normalized_prefixes_clamp_as_pairs():
    model = list_model("cho", self_normalize=0.5)
    src, hyp = list_pairs()
    expected = CpuScorer(model, scoring="self-normalized")
    scorer = CpuScorer(model, scoring="self-normalized", shared_prefixes=True)
    a = expected.score_phrases(src, hyp).logprob
    b = scorer.score_phrases(src, hyp).logprob
    assert np.abs(a - b).max() < 1e-5
    assert scorer.clamped == expected.clamped


def test_a_block_without_shared_prefixes_is_scored_by_pairs():
    """The inverse direction's pairs (each hypothesis a source of its own): nothing is shared,
    and the pair plan scores them, to the bit."""
    model = list_model("attention")
    src, hyp = list_pairs()
    expected = CpuScorer(model).score_phrases(hyp, src).logprob
    got = CpuScorer(model, shared_prefixes=True).score_phrases(hyp, src).logprob
    assert got.tobytes() == expected.tobytes()


def test_nbest_default_and_no_shared_prefixes_agree(tmp_path, tiny_model_path, tiny_r2l_model_path):
    outputs = {}
    for flag in ("--shared-prefixes", "--no-shared-prefixes"):
        out = tmp_path / f"{flag}.nbest"
        proc = run_cli(
            "nbest", str(NBEST), "--source", str(SOURCE), "-m", f"L2R={tiny_model_path}",
            "-m", f"R2L={tiny_r2l_model_path}", "-o", str(out), "--no-progress", flag,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert ("by shared prefixes" in proc.stderr) == (flag == "--shared-prefixes")
        outputs[flag] = out.read_text(encoding="utf-8").splitlines()
    with_prefixes, without = outputs.values()
    assert len(with_prefixes) == len(without) == len(list_pairs()[0])
    for a, b in zip(with_prefixes, without, strict=True):
        (head_a, values_a, tail_a), (head_b, values_b, tail_b) = _split(a), _split(b)
        assert head_a == head_b and tail_a == tail_b  # every other byte unchanged
        assert np.abs(values_a - values_b).max() < 1e-3


def _split(line: str) -> tuple[str, np.ndarray, str]:
    """(id and hypothesis, the L2R and R2L values, the rest) of an n-best line."""
    fields = line.split(" ||| ")
    values = [float(v) for v in fields[2].split("L2R=")[1].replace("R2L=", "").split()]
    return " ||| ".join(fields[:2]), np.array(values), " ||| ".join(fields[3:])
