"""Reading parallel text and phrase pairs, the encoded dataset, batching and collation."""

from __future__ import annotations

import gzip
from collections import Counter

import numpy as np
import pytest
import torch

from phrasescore.errors import InputError
from phrasescore.text.corpus import (
    ParallelDataset,
    TokenBudgetBatcher,
    collate,
    make_batch,
    read_parallel,
    read_phrase_pairs,
)
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, WordVocabulary

EN = TextNormalizer("en")
FR = TextNormalizer("fr")


def write(path, lines: list[str], compress: bool = False) -> str:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if compress:
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return str(path)


def test_read_parallel_real_files(data_dir):
    reader = read_parallel(
        str(data_dir / "text" / "multi30k-sample.tok.lc.en.gz"),
        str(data_dir / "text" / "multi30k-sample.tok.lc.fr.gz"),
        EN,
        FR,
        max_length=None,
    )
    pairs = list(reader)
    assert len(pairs) == 171
    assert pairs[0] == (
        "two young , white males are outside near many bushes .".split(),
        "deux jeunes hommes blancs sont dehors près de buissons .".split(),
    )
    assert reader.stats.lines == reader.stats.pairs == 171
    assert reader.stats.finished


def test_read_parallel_from_raw_text_tokenizes(data_dir):
    raw = read_parallel(
        str(data_dir / "text" / "multi30k-sample.raw.en.gz"),
        str(data_dir / "text" / "multi30k-sample.raw.fr.gz"),
        TextNormalizer("en", tokenize=True, lowercase=True),
        TextNormalizer("fr", tokenize=True, lowercase=True),
        max_length=None,
    )
    tokenized = read_parallel(
        str(data_dir / "text" / "multi30k-sample.tok.lc.en.gz"),
        str(data_dir / "text" / "multi30k-sample.tok.lc.fr.gz"),
        EN,
        FR,
        max_length=None,
    )
    assert list(raw) == list(tokenized)


def test_read_parallel_skips_empty_and_long_pairs_and_counts_them(tmp_path):
    src = write(tmp_path / "s", ["a b", "", "a b c d", "x", "  ", "p q"])
    tgt = write(tmp_path / "t", ["c d", "e", "f", "", "g", "r s t u"], compress=True)
    reader = read_parallel(src, tgt, EN, FR, max_length=3)
    assert list(reader) == [(["a", "b"], ["c", "d"])]
    stats = reader.stats
    assert (stats.lines, stats.pairs, stats.skipped_empty, stats.skipped_too_long) == (6, 1, 3, 2)


@pytest.mark.parametrize(("src_lines", "tgt_lines"), [(5, 3), (3, 5)])
def test_read_parallel_different_line_counts_name_both_files(tmp_path, src_lines, tgt_lines):
    src = write(tmp_path / "corpus.en", [f"s{i}" for i in range(src_lines)])
    tgt = write(tmp_path / "corpus.fr.gz", [f"t{i}" for i in range(tgt_lines)], compress=True)
    with pytest.raises(InputError) as caught:
        list(read_parallel(src, tgt, EN, FR, max_length=None))
    message = str(caught.value)
    assert f"{src} has {src_lines}" in message
    assert f"{tgt} has {tgt_lines}" in message


def test_read_phrase_pairs_real_table_yields_distinct_pairs(data_dir, tmp_path):
    table = data_dir / "text" / "multi30k-phrase-table-sample.gz"
    with gzip.open(table, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    doubled = write(tmp_path / "doubled.gz", lines[:50] + lines[10:20] + lines[50:], compress=True)
    reader = read_phrase_pairs(doubled, EN, FR, max_length=None)
    pairs = list(reader)
    assert len(pairs) == len(set(map(repr, pairs))) == 200
    assert reader.stats.duplicates == 10
    assert reader.stats.lines == 210
    assert pairs[0] == (["!", "&quot;"], ["!", "&quot;"])
    assert (["a", "&amp;", "amp", ";", "m", "&apos;s", "ryan"], ["a", "&amp;", "m", ","]) in pairs


def test_read_phrase_pairs_lowercasing_merges_pairs_and_max_length(tmp_path):
    table = write(
        tmp_path / "table",
        [
            "The house ||| la maison ||| 0.5 0.5 0.5 0.5",
            "the house ||| la maison ||| 0.5 0.5 0.5 0.5 ||| 0-0 1-1 ||| 1 1 1 ||| |||",
            "a b c d ||| w ||| 1 1 1 1",
            "x|||y|||1 1 1 1",
        ],
    )
    lower = TextNormalizer("en", lowercase=True)
    reader = read_phrase_pairs(table, lower, FR, max_length=3)
    assert list(reader) == [(["the", "house"], ["la", "maison"]), (["x"], ["y"])]
    assert (reader.stats.duplicates, reader.stats.skipped_too_long) == (1, 1)


def test_read_phrase_pairs_line_with_too_few_fields(tmp_path):
    table = write(tmp_path / "table.gz", ["a ||| b ||| 1 1 1 1", "a ||| c"], compress=True)
    with pytest.raises(InputError) as caught:
        list(read_phrase_pairs(table, EN, FR, max_length=None))
    assert caught.value.path == table and caught.value.line == 2
    assert "found 2" in str(caught.value)


@pytest.fixture
def dataset() -> ParallelDataset:
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 50, size=rng.integers(1, 12)).tolist() for _ in range(500)]
    tgt = [rng.integers(4, 50, size=rng.integers(1, 15)).tolist() for _ in range(500)]
    return ParallelDataset.from_id_lists(src, tgt)


def test_dataset_from_pairs_encodes_in_blocks(data_dir):
    pairs = list(
        read_parallel(
            str(data_dir / "text" / "multi30k-sample.tok.lc.en.gz"),
            str(data_dir / "text" / "multi30k-sample.tok.lc.fr.gz"),
            EN,
            FR,
            max_length=None,
        )
    )
    src_vocab = WordVocabulary.build((s for s, _ in pairs), 300)
    tgt_vocab = WordVocabulary.build((t for _, t in pairs), 300)
    dataset = ParallelDataset.from_pairs(iter(pairs), src_vocab, tgt_vocab, block_size=16)
    assert len(dataset) == 171
    for i in (0, 15, 16, 170):
        assert dataset.src(i).dtype == np.int32
        assert dataset.src(i).tolist() == src_vocab.encode(pairs[i][0])
        assert dataset.tgt(i).tolist() == tgt_vocab.encode(pairs[i][1])
    assert dataset.src_lengths.tolist() == [len(s) for s, _ in pairs]
    assert dataset.n_tgt_tokens == sum(len(t) for _, t in pairs)
    src_unknown, tgt_unknown = dataset.unknown_counts()
    assert src_unknown == sum(src_vocab.count_unknown(s) for s, _ in pairs) > 0
    assert tgt_unknown == sum(tgt_vocab.count_unknown(t) for _, t in pairs) > 0
    empty = ParallelDataset.from_pairs([], src_vocab, tgt_vocab)
    assert len(empty) == 0


def test_split_off_is_deterministic_and_disjoint(dataset):
    rest, held = dataset.split_off(50, seed=3)
    assert (len(rest), len(held)) == (450, 50)
    again_rest, again_held = dataset.split_off(50, seed=3)
    assert np.array_equal(held.src_ids, again_held.src_ids)
    assert np.array_equal(rest.tgt_offsets, again_rest.tgt_offsets)

    def pairs_of(d: ParallelDataset) -> list[tuple]:
        return [(tuple(d.src(i).tolist()), tuple(d.tgt(i).tolist())) for i in range(len(d))]

    assert Counter(pairs_of(rest)) + Counter(pairs_of(held)) == Counter(pairs_of(dataset))
    _, other_held = dataset.split_off(50, seed=4)
    assert not np.array_equal(held.src_offsets, other_held.src_offsets)
    with pytest.raises(InputError):
        dataset.split_off(500, seed=0)


def test_subset_keeps_the_given_order(dataset):
    part = dataset.subset([7, 3, 7])
    assert [part.src(i).tolist() for i in range(3)] == [
        dataset.src(7).tolist(),
        dataset.src(3).tolist(),
        dataset.src(7).tolist(),
    ]


def padded_cost(dataset: ParallelDataset, indices: np.ndarray) -> int:
    longest = max(int(dataset.src_lengths[indices].max()), int(dataset.tgt_lengths[indices].max()))
    return (longest + 1) * len(indices)


@pytest.mark.parametrize("shuffle", [True, False])
def test_batcher_covers_each_pair_once_within_budget(dataset, shuffle):
    batcher = TokenBudgetBatcher(dataset, max_tokens=120, shuffle=shuffle, seed=1, max_pairs=16)
    batches = batcher.batches(epoch=0)
    every = np.concatenate(batches)
    assert sorted(every.tolist()) == list(range(len(dataset)))
    assert all(padded_cost(dataset, b) <= 120 and len(b) <= 16 for b in batches)
    # budget is used: batches are not needlessly small
    assert np.mean([len(b) for b in batches]) > 5


def test_batcher_is_deterministic_per_epoch_and_varies_across_epochs(dataset):
    first = TokenBudgetBatcher(dataset, max_tokens=200, shuffle=True, seed=7)
    second = TokenBudgetBatcher(dataset, max_tokens=200, shuffle=True, seed=7)
    epoch0 = first.batches(0)
    assert [b.tolist() for b in epoch0] == [b.tolist() for b in second.batches(0)]
    assert [b.tolist() for b in epoch0] != [b.tolist() for b in first.batches(1)]
    other_seed = TokenBudgetBatcher(dataset, max_tokens=200, shuffle=True, seed=8).batches(0)
    assert [b.tolist() for b in epoch0] != [b.tolist() for b in other_seed]


def test_batcher_without_shuffle_is_sorted_and_fixed(dataset):
    batcher = TokenBudgetBatcher(dataset, max_tokens=200, shuffle=False, seed=0)
    batches = batcher.batches(0)
    assert [b.tolist() for b in batches] == [b.tolist() for b in batcher.batches(5)]
    tgt_lengths = dataset.tgt_lengths[np.concatenate(batches)]
    assert np.all(np.diff(tgt_lengths) >= 0)


def test_batcher_gives_an_overlong_pair_its_own_batch():
    dataset = ParallelDataset.from_id_lists([[5] * 30, [5], [5]], [[6], [6], [6]])
    batches = TokenBudgetBatcher(dataset, max_tokens=10, shuffle=False, seed=0).batches(0)
    assert sorted(b.tolist() for b in batches) == [[0], [1, 2]]


def test_collate_pads_and_adds_bos_eos(dataset):
    indices = np.array([4, 0, 9])
    batch = collate(dataset, indices)
    assert len(batch) == 3
    src_lengths = [len(dataset.src(i)) + 1 for i in indices]
    tgt_lengths = [len(dataset.tgt(i)) + 1 for i in indices]
    assert batch.src.dtype == torch.long and batch.src.shape == (3, max(src_lengths))
    assert batch.tgt_in.shape == batch.tgt_out.shape == (3, max(tgt_lengths))
    assert batch.src_lengths.tolist() == src_lengths
    assert batch.tgt_lengths.tolist() == tgt_lengths
    assert batch.n_tgt_tokens == sum(tgt_lengths)
    for row, i in enumerate(indices):
        src, tgt = dataset.src(i).tolist(), dataset.tgt(i).tolist()
        n, m = len(src), len(tgt)
        assert batch.src[row, : n + 1].tolist() == src + [EOS_ID]
        assert batch.tgt_in[row, : m + 1].tolist() == [BOS_ID] + tgt
        assert batch.tgt_out[row, : m + 1].tolist() == tgt + [EOS_ID]
        assert set(batch.src[row, n + 1 :].tolist()) <= {PAD_ID}
        assert set(batch.tgt_in[row, m + 1 :].tolist()) <= {PAD_ID}
        assert set(batch.tgt_out[row, m + 1 :].tolist()) <= {PAD_ID}


def test_make_batch_equals_collate(dataset):
    indices = [3, 1, 2]
    from_lists = make_batch(
        [dataset.src(i).tolist() for i in indices],
        [dataset.tgt(i).tolist() for i in indices],
        device="cpu",
    )
    from_dataset = collate(dataset, indices)
    for name in ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths"):
        assert torch.equal(getattr(from_lists, name), getattr(from_dataset, name)), name
    assert from_lists.n_tgt_tokens == from_dataset.n_tgt_tokens


def test_make_batch_small_example():
    batch = make_batch([[7, 8], [UNK_ID]], [[9], [10, 11, 12]])
    assert batch.src.tolist() == [[7, 8, EOS_ID], [UNK_ID, EOS_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 9, PAD_ID, PAD_ID], [BOS_ID, 10, 11, 12]]
    assert batch.tgt_out.tolist() == [[9, EOS_ID, PAD_ID, PAD_ID], [10, 11, 12, EOS_ID]]
    assert batch.n_tgt_tokens == 6
    with pytest.raises(ValueError):
        make_batch([], [])
