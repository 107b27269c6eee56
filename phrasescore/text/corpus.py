"""Training data: reading parallel text or phrase pairs, holding it encoded, batching it.

* :func:`read_parallel` streams the sentence pairs of two line-aligned files;
  :func:`read_phrase_pairs` streams the *distinct* phrase pairs of a Moses phrase table, each
  once whatever its frequency -- the training data of Cho et al. (2014, §3.1), where
  the table's φ columns already carry frequency and the network learns what is a plausible
  translation. Both skip pairs with an empty side or with more than ``max_length`` tokens on
  either side and count what they skipped in ``reader.stats``.
* :class:`ParallelDataset` holds encoded pairs compactly: flat ``int32`` id arrays with ``int64``
  offsets per side (about 4 bytes per token and side plus 16 bytes per pair).
* :class:`TokenBudgetBatcher` groups pairs of similar lengths into batches bounded by a padded
  token count (batches of similar lengths: Sutskever et al. 2014, §3.4), deterministic
  for a (seed, epoch) so that training can resume inside an epoch.
* :func:`collate` / :func:`make_batch` build padded tensors. Following Cho et al. (2014, §2:
  source x and target y, each ending with an end-of-sequence symbol) the source is
  ``ids + [EOS]``; the decoder reads ``[BOS] + ids`` and predicts ``ids + [EOS]``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from phrasescore.errors import InputError
from phrasescore.files.kinds import display_name
from phrasescore.files.reading import iter_lines
from phrasescore.moses.phrase_table import read_phrase_table
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocabulary

logger = logging.getLogger(__name__)

TokenPair = tuple[list[str], list[str]]


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


@dataclass
class CorpusStats:
    """What a reader saw; complete once the reader is exhausted (``finished``)."""

    lines: int = 0
    """Line pairs (parallel text) or phrase-table lines read."""
    pairs: int = 0
    """Pairs yielded."""
    skipped_empty: int = 0
    """Pairs skipped because a side has no tokens."""
    skipped_too_long: int = 0
    """Pairs skipped because a side has more than ``max_length`` tokens."""
    duplicates: int = 0
    """Phrase pairs skipped because the same pair was yielded before (phrase tables only)."""
    finished: bool = False


class PairReader(Iterator[TokenPair]):
    """An iterator of (source tokens, target tokens) with the counts of what it skipped.

    ``reader = read_parallel(...); for src, tgt in reader: ...; reader.stats.skipped_too_long``.
    Reading is lazy: files are opened on the first ``next()``; errors surface while iterating.
    """

    def __init__(self, produce: Callable[[CorpusStats], Iterator[TokenPair]]):
        self.stats = CorpusStats()
        self._pairs = produce(self.stats)

    def __iter__(self) -> PairReader:
        return self

    def __next__(self) -> TokenPair:
        return next(self._pairs)


def _too_long(tokens: list[str], max_length: int | None) -> bool:
    return max_length is not None and len(tokens) > max_length


def _log_stats(what: str, stats: CorpusStats, max_length: int | None) -> None:
    logger.info(
        "%s: %d lines read, %d pairs kept; skipped %d with an empty side, "
        "%d longer than %s tokens, %d duplicates",
        what,
        stats.lines,
        stats.pairs,
        stats.skipped_empty,
        stats.skipped_too_long,
        max_length if max_length is not None else "(no limit)",
        stats.duplicates,
    )


def read_parallel(
    src_path: str,
    tgt_path: str,
    src_normalizer: TextNormalizer,
    tgt_normalizer: TextNormalizer,
    max_length: int | None,
) -> PairReader:
    """Stream the token pairs of two line-aligned files (plain or gzip; one may be ``-``).

    Pairs with an empty side, or with more than ``max_length`` tokens on a side, are skipped and
    counted. Files with different numbers of lines are an :class:`InputError` naming both files
    and both line counts; it is raised when the shorter file ends, after the pairs before it
    were yielded.
    """
    if src_path == "-" and tgt_path == "-":
        raise InputError("the source and target sides cannot both be read from standard input")

    def produce(stats: CorpusStats) -> Iterator[TokenPair]:
        src_lines = iter_lines(src_path)
        tgt_lines = iter_lines(tgt_path)
        for src_line in src_lines:
            tgt_line = next(tgt_lines, None)
            if tgt_line is None:
                src_count = stats.lines + 1 + sum(1 for _ in src_lines)
                raise _length_mismatch(src_path, src_count, tgt_path, stats.lines)
            stats.lines += 1
            src_tokens = src_normalizer(src_line)
            tgt_tokens = tgt_normalizer(tgt_line)
            if not src_tokens or not tgt_tokens:
                stats.skipped_empty += 1
            elif _too_long(src_tokens, max_length) or _too_long(tgt_tokens, max_length):
                stats.skipped_too_long += 1
            else:
                stats.pairs += 1
                yield src_tokens, tgt_tokens
        tgt_rest = sum(1 for _ in tgt_lines)
        if tgt_rest:
            raise _length_mismatch(src_path, stats.lines, tgt_path, stats.lines + tgt_rest)
        stats.finished = True
        _log_stats(f"{display_name(src_path)} / {display_name(tgt_path)}", stats, max_length)

    return PairReader(produce)


def _length_mismatch(src_path: str, src_count: int, tgt_path: str, tgt_count: int) -> InputError:
    return InputError(
        "parallel files must have the same number of lines: "
        f"{display_name(src_path)} has {src_count}, {display_name(tgt_path)} has {tgt_count}"
    )


def phrase_pair_key(src_tokens: Sequence[str], tgt_tokens: Sequence[str]) -> int:
    """A 64-bit hash (BLAKE2b) of a token pair, for telling distinct pairs apart.

    With n distinct pairs the chance that two share a key is about n² / 2^65 (3% for 10^9).
    """
    text = " ".join(src_tokens) + "\t" + " ".join(tgt_tokens)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def read_phrase_pairs(
    table_path: str,
    src_normalizer: TextNormalizer,
    tgt_normalizer: TextNormalizer,
    max_length: int | None,
    inverse: bool = False,
) -> PairReader:
    """Stream each distinct (source, target) phrase pair of a Moses phrase table once; with
    ``inverse``, each as (target, source): the pairs of a model of p(source | target), the
    neural counterpart of the table's inverse phi(f|e) (``rescore --inverse-model``).

    Lines are split by :func:`phrasescore.moses.phrase_table.read_phrase_table` (the one
    phrase-table parser; structure checked, scores not parsed): a line with fewer than 3 fields,
    an empty phrase or a different number of scores is an :class:`InputError` with file and
    line. The phrases are Moses-tokenised already, so they go through
    :meth:`TextNormalizer.normalize_tokenized` (split, lowercase if asked), never the tokenizer.
    Pairs are distinct after normalisation (lowercasing can merge pairs); the set of 64-bit keys
    (:func:`phrase_pair_key`) costs about 70 bytes per distinct pair.
    """

    def produce(stats: CorpusStats) -> Iterator[TokenPair]:
        name = display_name(table_path)
        seen: set[int] = set()
        for entry in read_phrase_table(table_path, validate=False):
            stats.lines += 1
            source, target = (
                (entry.target, entry.source) if inverse else (entry.source, entry.target)
            )
            src_tokens = src_normalizer.normalize_tokenized(source)
            tgt_tokens = tgt_normalizer.normalize_tokenized(target)
            if not src_tokens or not tgt_tokens:
                stats.skipped_empty += 1
                continue
            if _too_long(src_tokens, max_length) or _too_long(tgt_tokens, max_length):
                stats.skipped_too_long += 1
                continue
            key = phrase_pair_key(src_tokens, tgt_tokens)
            if key in seen:
                stats.duplicates += 1
                continue
            seen.add(key)
            stats.pairs += 1
            yield src_tokens, tgt_tokens
        stats.finished = True
        _log_stats(name, stats, max_length)

    return PairReader(produce)


# --------------------------------------------------------------------------------------------
# Encoded pairs
# --------------------------------------------------------------------------------------------


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """The int64 offsets ``[n + 1]`` of sequences of ``lengths`` laid end to end."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def flatten_ids(id_lists: Sequence[Sequence[int]], dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, int64 lengths) of a list of id lists."""
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    flat = np.fromiter(chain.from_iterable(id_lists), dtype=dtype, count=int(lengths.sum()))
    return flat, lengths


def gather_sequences(
    flat: np.ndarray, offsets: np.ndarray, index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sequences ``index`` of a flat/offsets store, laid end to end in that order: (flat ids,
    offsets)."""
    index = np.asarray(index, dtype=np.int64)
    starts = offsets[index]
    lengths = offsets[index + 1] - starts
    new_offsets = offsets_from_lengths(lengths)
    positions = np.arange(new_offsets[-1], dtype=np.int64)
    positions += np.repeat(starts - new_offsets[:-1], lengths)
    return flat[positions], new_offsets


class ParallelDataset:
    """Encoded (source ids, target ids) pairs, stored as flat arrays with offsets.

    ``src(i)`` / ``tgt(i)`` are ``int32`` views of pair ``i`` (no EOS); ``src_lengths`` /
    ``tgt_lengths`` hold the lengths of all pairs.
    """

    ENCODE_BLOCK = 8192

    def __init__(
        self,
        src_ids: np.ndarray,
        src_offsets: np.ndarray,
        tgt_ids: np.ndarray,
        tgt_offsets: np.ndarray,
    ):
        if len(src_offsets) != len(tgt_offsets) or len(src_offsets) == 0:
            raise ValueError("source and target offsets must have the same length, at least 1")
        self.src_ids = np.asarray(src_ids, dtype=np.int32)
        self.tgt_ids = np.asarray(tgt_ids, dtype=np.int32)
        self.src_offsets = np.asarray(src_offsets, dtype=np.int64)
        self.tgt_offsets = np.asarray(tgt_offsets, dtype=np.int64)
        self.src_lengths = np.diff(self.src_offsets)
        self.tgt_lengths = np.diff(self.tgt_offsets)

    @classmethod
    def from_id_lists(
        cls, src_id_lists: Sequence[Sequence[int]], tgt_id_lists: Sequence[Sequence[int]]
    ) -> ParallelDataset:
        """A dataset of already encoded pairs."""
        if len(src_id_lists) != len(tgt_id_lists):
            raise ValueError("as many source as target id lists are needed")
        src_flat, src_lengths = flatten_ids(src_id_lists)
        tgt_flat, tgt_lengths = flatten_ids(tgt_id_lists)
        return cls(
            src_flat,
            offsets_from_lengths(src_lengths),
            tgt_flat,
            offsets_from_lengths(tgt_lengths),
        )

    @classmethod
    def from_pairs(
        cls,
        pairs: Iterable[TokenPair],
        src_vocab: Vocabulary,
        tgt_vocab: Vocabulary,
        block_size: int = ENCODE_BLOCK,
    ) -> ParallelDataset:
        """Encode a stream of token pairs, ``block_size`` pairs at a time (``encode_batch``)."""
        src_blocks: list[tuple[np.ndarray, np.ndarray]] = []
        tgt_blocks: list[tuple[np.ndarray, np.ndarray]] = []
        src_buffer: list[list[str]] = []
        tgt_buffer: list[list[str]] = []

        def flush() -> None:
            if src_buffer:
                src_blocks.append(flatten_ids(src_vocab.encode_batch(src_buffer)))
                tgt_blocks.append(flatten_ids(tgt_vocab.encode_batch(tgt_buffer)))
                src_buffer.clear()
                tgt_buffer.clear()

        for src_tokens, tgt_tokens in pairs:
            src_buffer.append(src_tokens)
            tgt_buffer.append(tgt_tokens)
            if len(src_buffer) >= block_size:
                flush()
        flush()
        return cls(*_join_blocks(src_blocks), *_join_blocks(tgt_blocks))

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def src(self, index: int) -> np.ndarray:
        """Source ids of pair ``index`` (no EOS)."""
        return self.src_ids[self.src_offsets[index] : self.src_offsets[index + 1]]

    def tgt(self, index: int) -> np.ndarray:
        """Target ids of pair ``index`` (no EOS)."""
        return self.tgt_ids[self.tgt_offsets[index] : self.tgt_offsets[index + 1]]

    @property
    def n_src_tokens(self) -> int:
        return int(self.src_offsets[-1])

    @property
    def n_tgt_tokens(self) -> int:
        return int(self.tgt_offsets[-1])

    def subset(self, indices: Sequence[int] | np.ndarray) -> ParallelDataset:
        """A new dataset of the pairs ``indices``, in that order (copied)."""
        index_array = np.asarray(indices, dtype=np.int64)
        src_flat, src_offsets = gather_sequences(self.src_ids, self.src_offsets, index_array)
        tgt_flat, tgt_offsets = gather_sequences(self.tgt_ids, self.tgt_offsets, index_array)
        return ParallelDataset(src_flat, src_offsets, tgt_flat, tgt_offsets)

    def split_off(self, n: int, seed: int) -> tuple[ParallelDataset, ParallelDataset]:
        """(the rest, ``n`` held-out pairs): a random slice chosen by ``seed``, same every time.

        Both parts keep the original order of their pairs. Holding out every pair is an
        :class:`InputError` (nothing would be left to train on).
        """
        if n < 0:
            raise ValueError(f"cannot hold out a negative number of pairs ({n})")
        if n >= len(self) and n > 0:
            raise InputError(
                f"cannot hold out {n} pairs for validation from {len(self)}: "
                "at least one pair must remain for training"
            )
        order = np.random.default_rng(seed).permutation(len(self))
        held_out = np.sort(order[:n])
        rest = np.sort(order[n:])
        return self.subset(rest), self.subset(held_out)

    def unknown_counts(self) -> tuple[int, int]:
        """How many source and target ids are :data:`UNK_ID`."""
        return (
            int(np.count_nonzero(self.src_ids == UNK_ID)),
            int(np.count_nonzero(self.tgt_ids == UNK_ID)),
        )

    def __repr__(self) -> str:
        return (
            f"ParallelDataset({len(self)} pairs, {self.n_src_tokens} source and "
            f"{self.n_tgt_tokens} target ids)"
        )


def _join_blocks(blocks: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not blocks:
        return np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
    flat = np.concatenate([ids for ids, _ in blocks])
    lengths = np.concatenate([lengths for _, lengths in blocks])
    return flat, offsets_from_lengths(lengths)


# --------------------------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------------------------


class TokenBudgetBatcher:
    """Batches of pairs of similar lengths, each within a padded-token budget.

    The cost of a batch is ``n * max(longest source, longest target)`` counting the EOS of each
    side (the padded size of the larger of the ``src`` and ``tgt_out`` tensors); it stays within
    ``max_tokens`` (a single pair longer than the budget gets a batch of its own) and a batch
    holds at most ``max_pairs`` pairs.

    With ``shuffle``, :meth:`batches` shuffles all pairs with a generator seeded by
    ``(seed, epoch)``, sorts pools of about ``POOL_BATCHES`` batches by (target length, source
    length), cuts them into batches and shuffles the order of the batches: the same (seed,
    epoch) gives the same batches, so training can resume at batch k of epoch e. Without
    ``shuffle`` the pairs are sorted by length once and the batches come in that fixed order
    (validation).
    """

    POOL_BATCHES = 100

    def __init__(
        self,
        dataset: ParallelDataset,
        max_tokens: int,
        shuffle: bool,
        seed: int,
        max_pairs: int | None = None,
    ):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_pairs is not None and max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
        self.dataset = dataset
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.max_pairs = max_pairs
        self._src_lengths = dataset.src_lengths + 1
        self._tgt_lengths = dataset.tgt_lengths + 1
        self._padded_lengths = np.maximum(self._src_lengths, self._tgt_lengths)
        mean_length = float(self._padded_lengths.mean()) if len(dataset) else 1.0
        pairs_per_batch = max(1, int(max_tokens / mean_length))
        if max_pairs is not None:
            pairs_per_batch = min(pairs_per_batch, max_pairs)
        self.pool_size = self.POOL_BATCHES * pairs_per_batch

    def batches(self, epoch: int) -> list[np.ndarray]:
        """The batches (arrays of pair indices) of ``epoch``; every pair is in exactly one."""
        n = len(self.dataset)
        if n == 0:
            return []
        if not self.shuffle:
            return self._cut(self._sorted(np.arange(n, dtype=np.int64)))
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(n)
        batches: list[np.ndarray] = []
        for start in range(0, n, self.pool_size):
            batches.extend(self._cut(self._sorted(order[start : start + self.pool_size])))
        return [batches[i] for i in rng.permutation(len(batches))]

    def _sorted(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` sorted by (target length, source length), ties kept in their order."""
        keys = (
            np.arange(len(indices)),
            self._src_lengths[indices],
            self._tgt_lengths[indices],
        )
        return indices[np.lexsort(keys)]

    def _cut(self, indices: np.ndarray) -> list[np.ndarray]:
        """Greedy cut of ordered ``indices`` into batches within the budget."""
        max_pairs = self.max_pairs if self.max_pairs is not None else len(indices)
        max_tokens = self.max_tokens
        cuts = [0]
        start = 0
        longest = 0
        for position, length in enumerate(self._padded_lengths[indices].tolist()):
            new_longest = longest if longest >= length else length
            count = position - start + 1
            if count > 1 and (count > max_pairs or new_longest * count > max_tokens):
                cuts.append(position)
                start = position
                longest = length
            else:
                longest = new_longest
        cuts.append(len(indices))
        return [indices[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


@dataclass
class Batch:
    """Padded tensors of B pairs (``torch.long``, PAD = 0, padding on the right).

    ``src`` [B, S] = ids + EOS; ``tgt_in`` [B, T] = BOS + ids (decoder input); ``tgt_out``
    [B, T] = ids + EOS (what is predicted); lengths include the EOS (resp. BOS). All tensors are
    on one device (``pack_padded_sequence`` wants ``src_lengths.cpu()``). Pairs keep the order
    they were given in (not sorted by length).
    """

    src: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_lengths: torch.Tensor
    n_tgt_tokens: int
    tgt_positions: torch.Tensor | None = None
    """The flat positions (row-major) of ``tgt_out``'s real tokens, made where the batch was
    made (:meth:`with_positions`): on a device, selecting by them waits for nothing, where a
    boolean mask's selection makes the host wait for the mask. None: not made."""

    def with_positions(self) -> Batch:
        """This batch with :attr:`tgt_positions` (of a batch still on the host)."""
        positions = torch.nonzero(self.tgt_out.reshape(-1) != PAD_ID).squeeze(1)
        return dataclasses.replace(self, tgt_positions=positions)

    def __len__(self) -> int:
        return int(self.src.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on ``device`` (``non_blocking``: asynchronous copies from pinned
        memory, :meth:`pin_memory`)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """The same batch in page-locked host memory, from which copies to a GPU run while the
        host goes on."""
        return self._map(lambda t: t.pin_memory())

    def _map(self, fn) -> Batch:
        return Batch(
            src=fn(self.src),
            src_lengths=fn(self.src_lengths),
            tgt_in=fn(self.tgt_in),
            tgt_out=fn(self.tgt_out),
            tgt_lengths=fn(self.tgt_lengths),
            n_tgt_tokens=self.n_tgt_tokens,
            tgt_positions=None if self.tgt_positions is None else fn(self.tgt_positions),
        )


def _pad(flat: np.ndarray, lengths: np.ndarray, first: int | None, last: int | None) -> np.ndarray:
    """[B, W] int64 rows: ``first`` (if any) + ids + ``last`` (if any), PAD after; W is the
    longest row's length."""
    rows = len(lengths)
    shift = 1 if first is not None else 0
    width = int(lengths.max()) + shift + (1 if last is not None else 0)
    padded = np.full((rows, width), PAD_ID, dtype=np.int64)
    columns = np.arange(width)
    token_mask = (columns >= shift) & (columns < lengths[:, None] + shift)
    padded[token_mask] = flat
    if first is not None:
        padded[:, 0] = first
    if last is not None:
        padded[np.arange(rows), lengths + shift] = last
    return padded


def pad_ids(
    id_lists: Sequence[Sequence[int]], first: int | None = None, last: int | None = None
) -> np.ndarray:
    """The one padding rule: [B, W] int64 rows ``first + ids + last`` (each if given), PAD
    after, e.g. ``pad_ids(sources, last=EOS_ID)`` for an encoder, ``first=BOS_ID`` for a
    decoder's input. Batches (:func:`make_batch`), search and alignment all pad with it."""
    if not id_lists:
        raise ValueError("nothing to pad")
    flat, lengths = flatten_ids(id_lists)
    return _pad(flat, lengths, first, last)


def _batch_from_flat(
    src_flat: np.ndarray,
    src_lengths: np.ndarray,
    tgt_flat: np.ndarray,
    tgt_lengths: np.ndarray,
    device: torch.device | str | None,
) -> Batch:
    if len(src_lengths) == 0:
        raise ValueError("a batch needs at least one pair")
    tgt_lengths_eos = tgt_lengths + 1
    batch = Batch(
        src=torch.from_numpy(_pad(src_flat, src_lengths, first=None, last=EOS_ID)),
        src_lengths=torch.from_numpy(src_lengths + 1),
        tgt_in=torch.from_numpy(_pad(tgt_flat, tgt_lengths, first=BOS_ID, last=None)),
        tgt_out=torch.from_numpy(_pad(tgt_flat, tgt_lengths, first=None, last=EOS_ID)),
        tgt_lengths=torch.from_numpy(tgt_lengths_eos),
        n_tgt_tokens=int(tgt_lengths_eos.sum()),
    )
    return batch.to(device) if device is not None else batch


def collate(
    dataset: ParallelDataset,
    indices: Sequence[int] | np.ndarray,
    device: torch.device | str | None = None,
) -> Batch:
    """The :class:`Batch` of the pairs ``indices`` of ``dataset``, in that order."""
    index_array = np.asarray(indices, dtype=np.int64)
    src_flat, src_offsets = gather_sequences(dataset.src_ids, dataset.src_offsets, index_array)
    tgt_flat, tgt_offsets = gather_sequences(dataset.tgt_ids, dataset.tgt_offsets, index_array)
    return _batch_from_flat(src_flat, np.diff(src_offsets), tgt_flat, np.diff(tgt_offsets), device)


def make_batch(
    src_id_lists: Sequence[Sequence[int]],
    tgt_id_lists: Sequence[Sequence[int]],
    device: torch.device | str | None = None,
) -> Batch:
    """The :class:`Batch` of pairs given as lists of ids (no BOS/EOS), e.g. when scoring."""
    if len(src_id_lists) != len(tgt_id_lists):
        raise ValueError("as many source as target id lists are needed")
    src_flat, src_lengths = flatten_ids(src_id_lists)
    tgt_flat, tgt_lengths = flatten_ids(tgt_id_lists)
    return _batch_from_flat(src_flat, src_lengths, tgt_flat, tgt_lengths, device)
