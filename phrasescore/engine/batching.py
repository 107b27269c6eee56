"""The batch plan of the scoring engine, numpy over arrays: pairs as flat ids and
offsets (:class:`IdPairs`, two ragged arrays of phrases), their distinct sources, the batches of a bucket policy, and the
order in which results go back.

No Python step per pair or per token: a block of pairs arrives as four arrays, the distinct
sources are found by hashing each id sequence (a vectorised polynomial hash, every pair then
checked against its representative, so that a collision can only cost time, never a wrong
score), batches are cut from the sorted lengths by runs, and each batch's id matrix is one
gather from the flat ids.

Bucket policies, one per engine (:mod:`phrasescore.engine.scoring`):

* **exact** (:class:`ExactBuckets`, the CPU engine): every batch has targets of one exact length
  within a token budget, so no padding is ever computed (on the CPU a padded position costs as
  much as a real one). The batches, their order and the summation are those of the engine over
  id lists before it: the same scores to the bit.
* **fixed shapes** (:class:`FixedShapeBuckets`, the CUDA-graph engine and any device that is
  neither CPU nor CUDA): lengths rounded up to a few bucket widths, every batch padded to its
  bucket's width and its rows to a power of two, so that the shapes repeat and each is captured
  once in a CUDA graph. Scores equal the exact policy's within the engine's tolerance (float32
  sums over other batch shapes: < 1e-4 in log p, tests/test_device_engine.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from phrasescore.text.corpus import gather_sequences
from phrasescore.text.phrase_ids import PhraseArrays
from phrasescore.text.vocab import BOS_ID, EOS_ID

_HASH_WEIGHTS = np.random.default_rng(46).integers(1, 2**63, size=1024, dtype=np.uint64) | 1


@dataclass
class IdPairs:
    """(source, target) pairs: two :class:`~phrasescore.text.phrase_ids.PhraseArrays` of as
    many phrases, pair ``i`` the source ``src``'s phrase ``i`` and the target ``tgt``'s (no BOS
    or EOS)."""

    src: PhraseArrays
    tgt: PhraseArrays

    def __len__(self) -> int:
        return len(self.src.offsets) - 1

    @classmethod
    def from_lists(
        cls, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]]
    ) -> IdPairs:
        """Pairs given as id lists (what
        :meth:`~phrasescore.engine.scoring.BlockScorer.score_ids` takes)."""
        if len(src_ids) != len(tgt_ids):
            raise ValueError("src_ids and tgt_ids differ in length")
        return cls(PhraseArrays.from_lists(src_ids), PhraseArrays.from_lists(tgt_ids))

    @property
    def src_ids(self) -> np.ndarray:
        return self.src.ids

    @property
    def src_offsets(self) -> np.ndarray:
        return self.src.offsets

    @property
    def tgt_ids(self) -> np.ndarray:
        return self.tgt.ids

    @property
    def tgt_offsets(self) -> np.ndarray:
        return self.tgt.offsets

    def src_lengths(self) -> np.ndarray:
        return self.src.lengths()

    def tgt_lengths(self) -> np.ndarray:
        return self.tgt.lengths()

    def take(self, index: np.ndarray) -> IdPairs:
        """The pairs ``index`` (in that order)."""
        return IdPairs(self.src.take(index), self.tgt.take(index))


def id_matrix(flat: np.ndarray, offsets: np.ndarray, index: np.ndarray, width: int) -> np.ndarray:
    """Sequences ``index`` (each of at most ``width`` ids) as the rows of an int64
    ``[len(index), width]`` matrix, padded with 0 (PAD) after each sequence's end."""
    index = np.asarray(index, dtype=np.int64)
    starts = offsets[index]
    lengths = offsets[index + 1] - starts
    columns = np.arange(width, dtype=np.int64)
    if len(flat) and (lengths == width).all():  # one exact length: no padding
        return flat[starts[:, None] + columns[None, :]].astype(np.int64, copy=False)
    inside = columns[None, :] < lengths[:, None]
    positions = np.where(inside, starts[:, None] + columns[None, :], 0)
    out = flat[positions] if len(flat) else np.zeros(positions.shape, dtype=np.int64)
    out = out.astype(np.int64, copy=False)
    out[~inside] = 0
    return out


def source_matrix(
    flat: np.ndarray, offsets: np.ndarray, index: np.ndarray, length: int
) -> np.ndarray:
    """The encoder's input [len(index), length + 1] of sequences ``index``, all of ``length``
    ids: the ids, then EOS."""
    ids = np.empty((len(index), length + 1), dtype=np.int64)
    ids[:, :-1] = id_matrix(flat, offsets, index, length)
    ids[:, -1] = EOS_ID
    return ids


def teacher_forcing(
    flat: np.ndarray, offsets: np.ndarray, index: np.ndarray, width: int, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The decoder's input and output ids [len(index), width + 1] of target sequences ``index``
    (of ``lengths`` ids, at most ``width``): ``BOS y_1 .. y_n PAD..`` and ``y_1 .. y_n EOS PAD..``."""
    body = id_matrix(flat, offsets, index, width)
    rows = len(index)
    tgt_in = np.empty((rows, width + 1), dtype=np.int64)
    tgt_in[:, 0] = BOS_ID
    tgt_in[:, 1:] = body
    tgt_out = np.zeros((rows, width + 1), dtype=np.int64)
    tgt_out[:, :-1] = body
    tgt_out[np.arange(rows), lengths] = EOS_ID
    return tgt_in, tgt_out


def sequence_hashes(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each sequence (its ids and its length)."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    total = int(offsets[-1])
    position = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    if total and position.max() < len(_HASH_WEIGHTS):
        weights = _HASH_WEIGHTS[position]
    else:
        weights = _HASH_WEIGHTS[position % len(_HASH_WEIGHTS)] ^ (
            (position // len(_HASH_WEIGHTS)).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        )
    terms = (flat.astype(np.uint64) + np.uint64(1)) * weights
    hashes = lengths.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
    nonempty = np.flatnonzero(lengths)
    if len(nonempty):
        hashes[nonempty] += np.add.reduceat(terms, offsets[:-1][nonempty])
    return hashes[:n]


def same_sequences(flat: np.ndarray, offsets: np.ndarray, b: np.ndarray) -> bool:
    """Whether sequence ``i`` equals sequence ``b[i]`` for every ``i``."""
    if not np.array_equal(np.diff(offsets), offsets[b + 1] - offsets[b]):
        return False
    ids_b, _ = gather_sequences(flat, offsets, b)
    return bool(np.array_equal(flat[: offsets[-1]], ids_b))


def distinct_sequences(flat: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct id sequences, in the order of their first appearance: ``(first, which)``,
    ``first[k]`` the index of distinct sequence ``k``'s first appearance, ``which[i]`` the
    distinct sequence of sequence ``i`` (what a dict of tuples gives, without the tuples)."""
    n = len(offsets) - 1
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    hashes = sequence_hashes(flat, offsets)
    perm = np.argsort(hashes)  # any sort: each group's first index is its least one
    change = np.empty(n, dtype=bool)
    change[0] = True
    sorted_hashes = hashes[perm]
    np.not_equal(sorted_hashes[1:], sorted_hashes[:-1], out=change[1:])
    starts = np.flatnonzero(change)
    first = np.minimum.reduceat(perm, starts)
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = np.cumsum(change) - 1
    if not same_sequences(flat, offsets, first[inverse]):
        return _distinct_by_tuples(flat, offsets)  # a hash collision: the slow and sure way
    order = np.argsort(first)  # distinct values: any sort is stable
    rank = np.empty(len(first), dtype=np.int64)
    rank[order] = np.arange(len(first))
    return first[order], rank[inverse]


def sorted_runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of values sorted already (runs, no sort)."""
    if not len(values):
        return values, np.zeros(0, dtype=np.int64)
    change = np.empty(len(values), dtype=bool)
    change[0] = True
    np.not_equal(values[1:], values[:-1], out=change[1:])
    return values[change], np.cumsum(change) - 1


def _distinct_by_tuples(flat, offsets) -> tuple[np.ndarray, np.ndarray]:
    index: dict[tuple[int, ...], int] = {}
    which = np.empty(len(offsets) - 1, dtype=np.int64)
    first = []
    ids = flat.tolist()
    bounds = offsets.tolist()
    for i in range(len(bounds) - 1):
        key = tuple(ids[bounds[i] : bounds[i + 1]])
        k = index.setdefault(key, len(index))
        if k == len(first):
            first.append(i)
        which[i] = k
    return np.array(first, dtype=np.int64), which


# ---------------------------------------------------------------------------- bucket policies
@dataclass(frozen=True)
class BatchRows:
    """One batch of a bucket policy: rows ``index`` (into the block's pairs or sources), padded
    to ``width`` tokens (a training batch of tensors is :class:`phrasescore.text.corpus.Batch`)."""

    index: np.ndarray
    width: int
    real: int | None = None
    """The first ``real`` rows of ``index`` are the batch's; the rest repeat its last row, to
    fill a fixed row count (:class:`FixedShapeBuckets`). None: every row is its own."""

    @property
    def own_rows(self) -> int:
        """The rows that are the batch's own (the first of ``index``)."""
        return len(self.index) if self.real is None else self.real


def equal_runs(sorted_lengths: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(start, end, length) of the runs of equal values of ``sorted_lengths``."""
    if not len(sorted_lengths):
        return
    change = np.flatnonzero(np.diff(sorted_lengths)) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [len(sorted_lengths)]))
    yield from zip(starts.tolist(), ends.tolist(), sorted_lengths[starts].tolist(), strict=True)


class ExactBuckets:
    """Batches of one exact length within ``batch_tokens`` (rows x (length + extra)): the
    CPU's policy (module docstring)."""

    pads_sources = False
    """Sources are never padded to a bucket width (their encodings are joined as they are)."""

    def __init__(self, batch_tokens: int = 8192):
        self.batch_tokens = batch_tokens

    def source_rows(self, length: int) -> int:
        """The most sources of ``length`` ids (+ EOS) an encoder batch holds."""
        return max(1, self.batch_tokens // (length + 1))

    def batches(self, lengths: np.ndarray, order: np.ndarray, extra: int) -> list[BatchRows]:
        """The batches of the rows ``order`` (sorted by ``lengths``, not decreasing), as the
        engine cut them over id lists: from each start, up to ``batch_tokens // (length +
        extra)`` rows of that length."""
        out = []
        for start, end, length in equal_runs(lengths[order]):
            rows = max(1, self.batch_tokens // (length + extra))
            for s in range(start, end, rows):
                out.append(BatchRows(order[s : min(end, s + rows)], length))
        return out


MIN_ROWS = 16
"""The smallest row count of a fixed-shape batch."""


def power_of_two_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def fixed_rows(n: int, cap: int) -> int:
    """The row count a fixed-shape batch of ``n`` rows is padded to: the next power of two from
    :data:`MIN_ROWS`, at most ``cap`` (a power of two >= ``n``)."""
    return min(cap, max(MIN_ROWS, 1 << max(0, int(n - 1).bit_length())))


def fill_rows(index: np.ndarray, rows: int) -> np.ndarray:
    """``index`` followed by its last entry repeated up to ``rows`` entries."""
    if rows <= len(index):
        return index
    return np.concatenate([index, np.full(rows - len(index), index[-1], dtype=index.dtype)])


class FixedShapeBuckets:
    """The fixed-shape policy: batches of a few shapes only, so that each shape's work is
    captured once (a CUDA graph) and replayed. Widths are the bucket bounds themselves (a length
    above the last: itself), row counts powers of two (:func:`fixed_rows`, at most
    ``batch_pairs`` and ``batch_tokens // (width + extra)``); a batch's last row is repeated to
    fill its row count (:attr:`BatchRows.real`). The sources' positional outputs (attention's
    annotations) are padded to a bucket width too (:attr:`pads_sources`)."""

    pads_sources = True

    def __init__(
        self,
        batch_pairs: int = 32768,
        batch_tokens: int = 1 << 19,
        bounds: Sequence[int] = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256),
    ):
        self.batch_pairs = batch_pairs
        self.batch_tokens = batch_tokens
        self.bounds = np.array(sorted(bounds), dtype=np.int64)

    def width(self, length: np.ndarray) -> np.ndarray:
        """The bucket width of each length (a length above the last bound: itself)."""
        at = np.searchsorted(self.bounds, length)
        inside = at < len(self.bounds)
        return np.where(inside, self.bounds[np.minimum(at, len(self.bounds) - 1)], length)

    def row_cap(self, width: int, extra: int) -> int:
        """The most rows of a batch of ``width`` (+ ``extra``) positions, a power of two."""
        return power_of_two_floor(min(self.batch_pairs, self.batch_tokens // (width + extra)))

    def source_rows(self, length: int) -> int:
        """The most sources of ``length`` ids (+ EOS) an encoder batch holds."""
        return self.row_cap(length, 1)

    def batches(self, lengths: np.ndarray, order: np.ndarray, extra: int) -> list[BatchRows]:
        widths = self.width(lengths[order])
        out = []
        for start, end, width in equal_runs(widths):
            cap = self.row_cap(width, extra)
            for s in range(start, end, cap):
                own = order[s : min(end, s + cap)]
                index = fill_rows(own, fixed_rows(len(own), cap))
                out.append(BatchRows(index, width, len(own)))
        return out
