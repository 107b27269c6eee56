"""The batched scoring engine: log p(target | source) for many pairs at once.

This is the loop ``rescore``, ``nbest`` and the analyses call. For a block of pairs it

1. encodes every *distinct* source once (a sorted phrase table has ~1.3 targets per source, an
   n-best list ~100 hypotheses per source), in batches of sources of exactly equal length, so no
   padding is computed;
2. sorts the pairs by target length and cuts them into batches of exactly equal target length
   within a token budget; each batch selects its sources' encodings (rows of one tensor) and is
   scored teacher-forced;
3. computes the softmax over the target vocabulary in cache-sized row chunks (logits, then the
   float32 log-sum-exp and the reference logit in one pass), never holding a [tokens x
   vocabulary] matrix for a whole batch nor a log-softmax for a chunk;
4. scatters the results back to input order.

Steps 1, 2 and 4 are the one plan of every engine (:class:`BlockScorer`); each engine adds its
batch kernel: :class:`CpuScorer` (batches of one exact target length, step 3 as written) and
:class:`~phrasescore.engine.graph_scoring.CudaGraphScorer` (fixed shapes, CUDA graphs).

The batch plan depends only on the pairs and the flags, so the same input and flags give the same
bytes; different batch sizes change float32 sums only in the last digits (< 1e-4 in log p).

log p(y | x) = Σ_t log p(y_t | y_<t, x) over the target tokens *including* the end-of-sequence
symbol (Cho et al. 2014, eq. 4).

Scoring modes (``scoring``):

``exact``            (default) the softmax over the whole target vocabulary, step 3 above.
``self-normalized``  for a model trained with ``--self-normalize`` α > 0 only: log p(y | x) ≈
                     Σ_t u_{y_t}, the sum of the target words' logits (Devlin et al. 2014, §2.1:
                     the penalty keeps log Z near 0), one row of the output matrix per token
                     (:meth:`~phrasescore.model.base.EncoderDecoder.target_logits`) instead of
                     the [tokens x vocabulary] product. The sum can be above 0: each pair's log p
                     is clamped at 0 (p ≤ 1) and the clamped pairs are counted
                     (:attr:`BlockScorer.clamped`).

Ensembles: :class:`EnsembleScorer` scores the same pairs with several models of one target
vocabulary and direction and averages their probabilities token by token (teacher-forced, each
model reads the same target prefix), one score per pair as from one model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from phrasescore.bundle import TrainedModel
from phrasescore.engine.batching import (
    BatchRows,
    ExactBuckets,
    FixedShapeBuckets,
    IdPairs,
    distinct_sequences,
    equal_runs,
    sorted_runs,
    source_matrix,
    teacher_forcing,
)
from phrasescore.engine.prefix_scoring import build_trie, path_sums, source_groups, trie_logprobs
from phrasescore.errors import InputError
from phrasescore.hardware import resolve_dtype
from phrasescore.model.base import EncoderDecoder, EncoderOutput, select_rows
from phrasescore.text.phrase_ids import PhraseArrays, PhraseIds

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

EXACT = "exact"
SELF_NORMALIZED = "self-normalized"
SCORING_MODES = (EXACT, SELF_NORMALIZED)
"""The values of ``--scoring`` (see the module docstring)."""

PREFIXES_PAY = 0.9
"""``shared_prefixes``: a block is scored by its tries when they hold at most this fraction of
its target positions (below it the level-by-level steps cost less than the positions saved)."""


def check_scoring(model: TrainedModel, scoring: str, path: str | None = None) -> None:
    """Refuse a scoring mode the model cannot give: ``self-normalized`` needs a model trained
    with ``--self-normalize`` α > 0 (for any other model the logits are not log-probabilities)."""
    if scoring not in SCORING_MODES:
        raise InputError(f"unknown scoring mode {scoring!r} (one of {', '.join(SCORING_MODES)})")
    if scoring == SELF_NORMALIZED and not model.config.self_normalize > 0:
        raise InputError(
            f"--scoring {SELF_NORMALIZED} needs a model trained with --self-normalize ALPHA > 0; "
            f"model {model.signature or '(unsaved)'} was trained without it (use --scoring exact)",
            path,
        )


def phrase_tokens(normalizer, phrase: str) -> list[str]:
    """Tokens of a phrase that is already tokenised (phrase tables, n-best hypotheses).

    Only lowercasing is applied again when the model was trained with ``--lowercase``;
    tokenising a second time would escape ``&amp;`` into ``&amp;amp;``.
    """
    return normalizer.normalize_tokenized(phrase)


@dataclass
class ScoredPairs:
    """Scores of a block of pairs, in input order."""

    logprob: np.ndarray  # float64 [N]: log p(y | x), EOS included unless include_eos=False
    # (self-normalized scoring: Σ_t u_{y_t}, clamped at 0)
    n_tokens: np.ndarray  # int64 [N]: target tokens scored (EOS counted likewise)
    src_unknown: np.ndarray  # int64 [N]: source words the vocabulary does not know
    tgt_unknown: np.ndarray  # int64 [N]
    token_logprobs: list[np.ndarray] | None = None


@dataclass
class EncodedPairs:
    """A block of pairs as ids (:meth:`BlockScorer.encode_phrases`), in input order."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]  # in the model's reading order (reversed for right-to-left)
    src_unknown: np.ndarray | None  # int64 [N]: source words the vocabulary does not know
    tgt_unknown: np.ndarray | None  # int64 [N] (both None: not counted)
    n_tokens: np.ndarray  # int64 [N]: target tokens scored (EOS counted unless include_eos=False)


class PhraseEncoder:
    """The text half of a scorer: phrases to ids in a model's vocabularies (no network), what
    :class:`BlockScorer` and every other scorer of the protocol
    (:class:`~phrasescore.engine.protocol.Scorer`) share. Each side's phrases go through
    :class:`~phrasescore.text.phrase_ids.PhraseIds` (the one home of phrases to ids: the
    phrase's tokens, :func:`phrase_tokens`, in the model's reading order, then the
    vocabulary's ids), all of a side in one pass."""

    def __init__(self, model: TrainedModel, include_eos: bool = True):
        self.model = model
        self.include_eos = include_eos
        config = model.config
        self.src = PhraseIds(model.src_vocab, model.src_text)
        self.tgt = PhraseIds(
            model.tgt_vocab, model.tgt_text, config.target_order if config.reverse_target else None
        )

    def encode_arrays(self, sources: Sequence[str], targets: Sequence[str]) -> IdPairs:
        """The ids of already-tokenised phrase pairs as the engine takes them (each side's
        unknown-word counts in its :class:`~phrasescore.text.phrase_ids.PhraseArrays`)."""
        if len(sources) != len(targets):
            raise ValueError("sources and targets differ in length")
        if any("\n" in p for p in sources) or any("\n" in p for p in targets):
            # a line break inside a phrase (never in a table or an n-best list) would cut the
            # one-pass text: the tokens' path, which keeps it inside its token
            src_tok = [phrase_tokens(self.model.src_text, p) for p in sources]
            tgt_tok = [phrase_tokens(self.model.tgt_text, p) for p in targets]
            ids = self.encode_tokens(src_tok, tgt_tok)
            return IdPairs(
                PhraseArrays(*PhraseArrays.from_lists(ids.src_ids)[:2], ids.src_unknown),
                PhraseArrays(*PhraseArrays.from_lists(ids.tgt_ids)[:2], ids.tgt_unknown),
            )
        src = self.src.encode_list([p.encode("utf-8") for p in sources])
        tgt = self.tgt.encode_list([p.encode("utf-8") for p in targets])
        return IdPairs(src, tgt)

    def token_counts(self, pairs: IdPairs) -> np.ndarray:
        """The target tokens scored per pair (EOS counted unless ``include_eos`` is False)."""
        return pairs.tgt_lengths() + (1 if self.include_eos else 0)

    def encode_phrases(
        self, sources: Sequence[str], targets: Sequence[str], counts: bool = True
    ) -> EncodedPairs:
        """The ids of already-tokenised phrase pairs as id lists (:meth:`encode_arrays`), what
        :meth:`BlockScorer.score_ids` takes. Without ``counts`` the unknown-word counts are
        left out (None)."""
        pairs = self.encode_arrays(sources, targets)
        src_unk, tgt_unk = (pairs.src.unknown, pairs.tgt.unknown) if counts else (None, None)
        return EncodedPairs(
            pairs.src.to_lists(), pairs.tgt.to_lists(), src_unk, tgt_unk, self.token_counts(pairs)
        )

    def encode_tokens(
        self, src_tokens: Sequence[list[str]], tgt_tokens: Sequence[list[str]], counts: bool = True
    ) -> EncodedPairs:
        """:meth:`encode_phrases` of pairs given as token lists. The targets come in their
        natural order; a right-to-left model reads them reversed (``reverse_target``)."""
        src_vocab, tgt_vocab = self.model.src_vocab, self.model.tgt_vocab
        src_ids = src_vocab.encode_batch(src_tokens)
        order = self.model.config.target_order  # a new list when reversed; never changed
        tgt_ids = tgt_vocab.encode_batch([order(t) for t in tgt_tokens])
        src_unk = tgt_unk = None
        if counts:
            src_unk = np.array([src_vocab.count_unknown(t) for t in src_tokens], dtype=np.int64)
            tgt_unk = np.array([tgt_vocab.count_unknown(t) for t in tgt_tokens], dtype=np.int64)
        eos = 1 if self.include_eos else 0
        n_tokens = np.array([len(t) + eos for t in tgt_ids], dtype=np.int64)
        return EncodedPairs(src_ids, tgt_ids, src_unk, tgt_unk, n_tokens)


class BlockScorer:
    """The scoring plan every engine shares, for one resident model on one device and dtype:
    the text half (:class:`PhraseEncoder`), then for a block of pairs the module docstring's
    steps (distinct sources encoded once, pairs ordered by target length then source, cut into
    the batches of the engine's bucket policy, the results back in input order, the
    self-normalised clamp). An engine adds its batch kernel alone (:meth:`_batch_scores`):
    :class:`CpuScorer` and :class:`~phrasescore.engine.graph_scoring.CudaGraphScorer`.

    ``include_eos=False`` leaves the end-of-sequence term out of log p (and of the token count):
    the probability of the target words alone, a fragment's score under a model trained on
    whole sentences (docs/benchmarks.md: "Which model to train for the column (history)").
    ``scoring``: ``exact`` or ``self-normalized`` (module docstring; refused, naming
    ``model_path``, for a model not trained with ``--self-normalize``). ``buckets``: the batch
    policy (:mod:`phrasescore.engine.batching`). ``shared_prefixes``: a block whose targets share
    prefixes with their source's other targets (an n-best list) is scored by its tries, each
    distinct (source, prefix, word) once (:mod:`phrasescore.engine.prefix_scoring`), where they
    hold at most :data:`PREFIXES_PAY` of its positions."""

    def __init__(
        self,
        model: TrainedModel,
        device: str | torch.device,
        dtype: str,
        chunk_rows: int | None,
        include_eos: bool,
        scoring: str,
        model_path: str | None,
        buckets: ExactBuckets | FixedShapeBuckets,
        shared_prefixes: bool = False,
    ):
        check_scoring(model, scoring, model_path)
        self.shared_prefixes = shared_prefixes
        self.scoring = scoring
        self.self_normalized = scoring == SELF_NORMALIZED
        self.clamped = 0
        """Pairs whose self-normalised log p was above 0 and was clamped to 0 (all calls)."""
        self.include_eos = include_eos
        self.model = model
        self.device = torch.device(device)
        self.dtype = DTYPES[resolve_dtype(dtype, self.device)]
        self.chunk_rows = chunk_rows
        network: EncoderDecoder = model.network
        self.network = network.to(self.device, self.dtype).eval()
        self.buckets = buckets
        self.positional = bool(network.POSITIONAL_OUTPUTS) and buckets.pads_sources
        self.encoder = PhraseEncoder(model, include_eos)

    def warm_up(self) -> None:
        """Build what the engine compiles before worker processes fork (nothing here)."""

    # ------------------------------------------------------------------ text level
    def score_phrases(
        self, sources: Sequence[str], targets: Sequence[str], per_token: bool = False
    ) -> ScoredPairs:
        """Score already-tokenised phrase pairs (phrase-table or n-best text): their ids
        (:meth:`PhraseEncoder.encode_arrays`), then :meth:`score_arrays`."""
        return self.score_encoded(self.encode_arrays(sources, targets), per_token)

    def encode_arrays(self, sources: Sequence[str], targets: Sequence[str]) -> IdPairs:
        """The ids of already-tokenised phrase pairs as :meth:`score_encoded` takes them: the
        text half of :meth:`score_phrases`, which needs the vocabularies and not the network
        (an ``nbest --io-workers`` process runs it)."""
        return self.encoder.encode_arrays(sources, targets)

    def score_encoded(self, pairs: IdPairs, per_token: bool = False) -> ScoredPairs:
        """The network half of :meth:`score_phrases`: :meth:`score_arrays` of
        :meth:`encode_arrays`' ids, with their token and unknown-word counts."""
        logprob, per_tok = self.score_arrays(pairs, per_token)
        n_tokens = self.encoder.token_counts(pairs)
        return ScoredPairs(logprob, n_tokens, pairs.src.unknown, pairs.tgt.unknown, per_tok)

    def encode_phrases(
        self, sources: Sequence[str], targets: Sequence[str], counts: bool = True
    ) -> EncodedPairs:
        """The ids of already-tokenised phrase pairs, what :meth:`score_ids` takes: the text
        half of :meth:`score_phrases` (:class:`PhraseEncoder`), which needs the vocabularies
        and not the network (a ``rescore --io-workers`` process runs it; the process that owns
        the network scores). Without ``counts`` the unknown-word counts are left out (None)."""
        return self.encoder.encode_phrases(sources, targets, counts)

    def encode_tokens(
        self, src_tokens: Sequence[list[str]], tgt_tokens: Sequence[list[str]], counts: bool = True
    ) -> EncodedPairs:
        """:meth:`encode_phrases` of pairs given as token lists."""
        return self.encoder.encode_tokens(src_tokens, tgt_tokens, counts)

    def score_tokens(
        self,
        src_tokens: Sequence[list[str]],
        tgt_tokens: Sequence[list[str]],
        per_token: bool = False,
    ) -> ScoredPairs:
        """Score pairs given as token lists (words; subword models split them here); a
        right-to-left model's ``per_token`` values are in its reading order."""
        pairs = self.encode_tokens(src_tokens, tgt_tokens)
        logprob, per_tok = self.score_ids(pairs.src_ids, pairs.tgt_ids, per_token=per_token)
        return ScoredPairs(logprob, pairs.n_tokens, pairs.src_unknown, pairs.tgt_unknown, per_tok)

    # ------------------------------------------------------------------ id level
    def score_ids(
        self,
        src_ids: Sequence[Sequence[int]],
        tgt_ids: Sequence[Sequence[int]],
        per_token: bool = False,
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """log p(y | x) for pairs of id lists (EOS is appended here to both sides):
        :meth:`score_arrays` of the lists laid end to end."""
        return self.score_arrays(IdPairs.from_lists(src_ids, tgt_ids), per_token)

    @torch.inference_mode()
    def score_arrays(
        self, pairs: IdPairs, per_token: bool = False
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """log p(y | x) (Cho et al. 2014, eq. 4) for pairs given as flat ids and offsets
        (:class:`IdPairs`), the engine's own input, in input order: the module docstring's
        steps, the batch plan numpy over these arrays (:mod:`~phrasescore.engine.batching`).
        The sums stay where the engine computes them and come back in one copy per block."""
        n = len(pairs)
        if n == 0:
            return np.zeros(0, dtype=np.float64), [] if per_token else None
        # 1. distinct sources, encoded once each
        first, pair_source = distinct_sequences(pairs.src_ids, pairs.src_offsets)
        enc_all, src_width = self._encode_distinct(pairs.src_ids, pairs.src_offsets, first)
        extra = 1 + src_width  # positions a row holds beside its target's
        by_prefixes = None
        if self.shared_prefixes:
            by_prefixes = self._score_by_prefixes(enc_all, pair_source, pairs, extra, per_token)
        if by_prefixes is not None:
            result, per_tok = by_prefixes
        else:
            result, per_tok = self._score_pairs(enc_all, pair_source, pairs, extra, per_token)
        if self.self_normalized:
            # Σ_t u_{y_t} approximates log p and can exceed 0: keep p a probability (≤ 1)
            above = result > 0.0
            self.clamped += int(above.sum())
            result[above] = 0.0
        return result, per_tok

    def _score_pairs(
        self,
        enc_all: EncoderOutput,
        pair_source: np.ndarray,
        pairs: IdPairs,
        extra: int,
        per_token: bool,
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """Steps 2-4 of the module docstring: every position of every pair."""
        # 2. targets by length (the policy's buckets), then by source: a batch's sources are runs
        n = len(pairs)
        tgt_len = pairs.tgt_lengths()
        order = np.lexsort((pair_source, tgt_len))
        sums = torch.zeros(n, dtype=torch.float64, device=self._sums_device)
        kept: list[tuple[np.ndarray, torch.Tensor]] = []
        for batch in self.buckets.batches(tgt_len, order, extra):
            own = batch.index[: batch.own_rows]
            batch_sums, values = self._score_batch(enc_all, batch, pair_source, pairs, tgt_len)
            sums[self._index(own)] = batch_sums[: len(own)]
            if per_token:
                kept.append((own, values[: len(own)]))
        result = sums.cpu().numpy()  # the block's one wait for the device
        return result, self._per_token(kept, tgt_len, n) if per_token else None

    def _score_by_prefixes(
        self,
        enc_all: EncoderOutput,
        pair_source: np.ndarray,
        pairs: IdPairs,
        extra: int,
        per_token: bool,
    ) -> tuple[np.ndarray, list[np.ndarray] | None] | None:
        """The block scored by shared prefixes (:mod:`phrasescore.engine.prefix_scoring`), or
        None when its tries would hold more than :data:`PREFIXES_PAY` of its positions (the pair
        plan then costs less)."""
        tgt_len = pairs.tgt_lengths()
        groups = list(source_groups(pair_source, tgt_len + extra, self.buckets.batch_tokens))
        tries = []
        for group in groups:
            sources, roots = sorted_runs(pair_source[group])
            tries.append((sources, build_trie(roots, pairs, group)))
        positions = int(tgt_len.sum()) + len(pairs)
        if sum(trie.nodes for _, trie in tries) > PREFIXES_PAY * positions:
            return None
        values, paths, base = [], [], 0
        for group, (sources, trie) in zip(groups, tries, strict=True):
            enc = select_rows(enc_all, self._to_device(sources))
            enc.update(self.network.source_terms(enc))
            values.append(
                trie_logprobs(
                    self.network, enc, trie, self._to_device, self.chunk_rows, self.self_normalized
                )
            )
            paths.append((group, np.where(trie.paths >= 0, trie.paths + base, -1)))
            base += trie.nodes
        flat = torch.cat(values).double().cpu().numpy()  # the block's one wait for the device
        result = np.empty(len(pairs), dtype=np.float64)
        per_tok: list[np.ndarray] | None = [np.empty(0)] * len(pairs) if per_token else None
        for group, group_paths in paths:
            sums, terms = path_sums(flat, group_paths, self.include_eos, per_token)
            result[group] = sums
            if per_tok is not None and terms is not None:
                for i, row in zip(group.tolist(), terms, strict=True):
                    per_tok[i] = row
        return result, per_tok

    @property
    def _sums_device(self) -> torch.device:
        """Where the block's sums are gathered: where the kernel returns them."""
        return self.device

    def _index(self, index: np.ndarray) -> torch.Tensor:
        return (
            self._to_device(index) if self._sums_device.type != "cpu" else torch.from_numpy(index)
        )

    @staticmethod
    def _per_token(
        kept: list[tuple[np.ndarray, torch.Tensor]], tgt_len: np.ndarray, n: int
    ) -> list[np.ndarray]:
        """Each pair's log p(y_t | y_<t, x) [length + 1] (EOS last), in input order."""
        per_tok: list[np.ndarray] = [np.empty(0)] * n
        for index, values in kept:
            rows = values.double().cpu().numpy()
            for row, i in enumerate(index.tolist()):
                per_tok[i] = rows[row, : tgt_len[i] + 1]
        return per_tok

    def _encode_distinct(
        self, flat: np.ndarray, offsets: np.ndarray, first: np.ndarray
    ) -> tuple[EncoderOutput, int]:
        """Encode each distinct source (sequence ``first[k]`` of ``flat``, ``offsets``) once,
        in batches of one exact length (the encoder is told there is no padding:
        ``encode(src, None)``), the policy's rows a batch: (rows in the order of ``first``,
        the width positional outputs are padded to, 0 where the policy pads none)."""
        lengths = offsets[first + 1] - offsets[first]
        # a stable sort of small integers (16 bits: numpy's radix sort): equal lengths keep their order
        small = lengths.astype(np.int16) if lengths.max(initial=0) < 1 << 15 else lengths
        order = np.argsort(small, kind="stable")
        pieces: list[tuple[np.ndarray, EncoderOutput]] = []
        for start, end, length in equal_runs(lengths[order]):
            rows = self.buckets.source_rows(length)
            for s in range(start, end, rows):
                idx = order[s : min(end, s + rows)]
                ids = source_matrix(flat, offsets, first[idx], length)
                pieces.append((idx, self.network.encode(self._to_device(ids), None)))
        width = 0
        if self.positional:
            width = int(self.buckets.width(np.array([int(lengths.max()) + 1]))[0])
        return self._merge_encodings(pieces, width), width

    def _merge_encodings(
        self, pieces: list[tuple[np.ndarray, EncoderOutput]], width: int = 0
    ) -> EncoderOutput:
        """The encodings of ``pieces`` (each the rows ``index`` of the distinct sources) as one,
        row k the distinct source k's; positional outputs padded to at least ``width``."""
        done = np.concatenate([p[0] for p in pieces])
        positions = np.empty(len(done), dtype=np.int64)
        positions[done] = np.arange(len(done))  # the inverse permutation, no sort
        positions = self._to_device(positions)
        merged = self.network.concat_encodings([p[1] for p in pieces], width)
        return select_rows(merged, positions)

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        """Host to device; on CUDA through pinned memory, asynchronously (overlaps compute)."""
        tensor = torch.from_numpy(array)
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.to(self.device)

    def _pair_encodings(
        self, enc_all: EncoderOutput, idx: np.ndarray, pair_source: np.ndarray
    ) -> EncoderOutput:
        """The encodings of pairs ``idx`` (one row each): their distinct sources' rows of
        ``enc_all`` with the source-only decoder terms (V'c, C c, O_c c for the Cho model)
        computed once per source, then repeated per pair. A batch's pairs are in source order
        within each length (the plan sorts them by length, then source), so its sources are
        runs."""
        sources, inverse = sorted_runs(pair_source[idx])
        enc = select_rows(enc_all, self._to_device(sources))
        enc.update(self.network.source_terms(enc))
        return select_rows(enc, self._to_device(inverse))

    def _score_batch(
        self,
        enc_all: EncoderOutput,
        batch: BatchRows,
        pair_source: np.ndarray,
        pairs: IdPairs,
        tgt_len: np.ndarray,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(each row's log p [rows] float64, each position's log p [rows, width + 1]) of one
        batch: its pairs' encodings (:meth:`_pair_encodings`), the decoder's teacher-forced ids,
        then the engine's kernel (:meth:`_batch_scores`)."""
        idx, width = batch.index, batch.width
        enc = self._pair_encodings(enc_all, idx, pair_source)
        lengths = tgt_len[idx]
        tgt_in, tgt_out = teacher_forcing(pairs.tgt_ids, pairs.tgt_offsets, idx, width, lengths)
        return self._batch_scores(enc, batch, tgt_in, tgt_out, lengths)

    def _batch_scores(
        self,
        enc: EncoderOutput,
        batch: BatchRows,
        tgt_in: np.ndarray,
        tgt_out: np.ndarray,
        lengths: np.ndarray,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine's batch kernel: what :meth:`_score_batch` returns."""
        raise NotImplementedError


class CpuScorer(BlockScorer):
    """The CPU's engine: :class:`BlockScorer`'s plan with batches of one exact target length
    (:class:`~phrasescore.engine.batching.ExactBuckets`: no padding is ever computed; on the
    CPU a padded position costs as much as a real one), each batch's token terms summed on
    the host in float64."""

    def __init__(
        self,
        model: TrainedModel,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        batch_tokens: int = 8192,
        chunk_rows: int | None = None,
        include_eos: bool = True,
        scoring: str = EXACT,
        model_path: str | None = None,
        buckets: ExactBuckets | None = None,
        shared_prefixes: bool = False,
    ):
        if buckets is None:
            buckets = ExactBuckets(batch_tokens)
        if not isinstance(buckets, ExactBuckets):
            raise TypeError("the CPU engine cuts batches of one exact length (ExactBuckets)")
        super().__init__(
            model,
            device,
            dtype,
            chunk_rows,
            include_eos,
            scoring,
            model_path,
            buckets,
            shared_prefixes,
        )

    def warm_up(self) -> None:
        """Score two one-word pairs so that the compiled kernels are built now: one row chunk
        of 3 rows and one of 1 (torch.compile specialises a dimension of size 1)."""
        saved = self.chunk_rows, self.clamped
        self.chunk_rows = 3
        try:
            src, tgt = len(self.model.src_vocab) - 1, len(self.model.tgt_vocab) - 1
            self.score_ids([[src]] * 2, [[tgt]] * 2)
        finally:
            self.chunk_rows, self.clamped = saved

    @property
    def _sums_device(self) -> torch.device:
        return torch.device("cpu")

    def _batch_scores(self, enc, batch, tgt_in, tgt_out, lengths):
        """Every position of a batch of one exact length (no mask), summed in float64 on the
        host (Cho et al. 2014, eq. 4; without the EOS term for ``include_eos=False``)."""
        token_lp = self.network.token_logprobs(
            enc,
            self._to_device(tgt_in),
            self._to_device(tgt_out),
            None,
            self.chunk_rows,
            self_normalized=self.self_normalized,
        )
        values = token_lp.double().cpu().numpy()
        sums = values.sum(axis=1) if self.include_eos else values[:, :-1].sum(1)
        return torch.from_numpy(sums), torch.from_numpy(values)


PairScorer = CpuScorer
"""Another name of :class:`CpuScorer`, the one the tests and tools import."""


def check_ensemble(models: Sequence[TrainedModel], paths: Sequence[str]) -> None:
    """Refuse models that cannot be averaged token by token: each must score the same target
    tokens in the same order (equal target vocabularies, text preparation and direction)."""
    first, first_path = models[0], paths[0]
    for model, path in zip(models[1:], paths[1:], strict=True):
        differs = [
            what
            for what, same in (
                ("target vocabulary", model.tgt_vocab == first.tgt_vocab),
                ("target text preparation", model.tgt_text.to_state() == first.tgt_text.to_state()),
                ("direction", model.config.reverse_target == first.config.reverse_target),
            )
            if not same
        ]
        if differs:
            raise InputError(
                f"cannot be averaged with {first_path} into one feature: the {' and '.join(differs)}"
                f" differ (an ensemble needs models trained on the same data with the same "
                f"--vocab-size/--subwords and direction)",
                path,
            )


class EnsembleScorer:
    """Several :class:`BlockScorer` as one: log p(y | x) = Σ_t log (1/K Σ_k p_k(y_t | y_<t, x)),
    the average of the K models' next-token probabilities at each step (the ensemble of
    Sutskever et al. 2014, §3.6, here teacher-forced: every model reads the same prefix y_<t,
    so each model's token terms are computed alone and averaged afterwards).

    The models must share the target vocabulary and direction (:func:`check_ensemble`); the
    sources may have different vocabularies (unknown-word counts are the first model's)."""

    def __init__(self, scorers: Sequence[BlockScorer]):
        if any(scorer.self_normalized for scorer in scorers):
            raise InputError(
                "an ensemble scores exactly: --scoring self-normalized needs one model"
            )
        self.scorers = list(scorers)
        self.model = self.scorers[0].model
        self.include_eos = self.scorers[0].include_eos
        self.clamped = 0

    def warm_up(self) -> None:
        for scorer in self.scorers:
            scorer.warm_up()

    def score_phrases(
        self, sources: Sequence[str], targets: Sequence[str], per_token: bool = False
    ) -> ScoredPairs:
        """:meth:`BlockScorer.score_phrases` of the ensemble."""
        return self.score_encoded(self.encode_arrays(sources, targets), per_token)

    def encode_arrays(self, sources: Sequence[str], targets: Sequence[str]) -> list[IdPairs]:
        """Each model's ids of the pairs (:meth:`BlockScorer.encode_arrays`: the sources'
        vocabularies may differ)."""
        return [scorer.encode_arrays(sources, targets) for scorer in self.scorers]

    def score_encoded(self, pairs: Sequence[IdPairs], per_token: bool = False) -> ScoredPairs:
        """The ensemble's scores of :meth:`encode_arrays`' ids."""
        scored = [
            scorer.score_encoded(ids, per_token=True)
            for scorer, ids in zip(self.scorers, pairs, strict=True)
        ]
        first = scored[0]
        if not len(first.logprob):
            return first
        # every pair's token terms end to end, one row per model: averaged in one pass
        stacked = np.stack([np.concatenate(s.token_logprobs) for s in scored])
        tokens = np.logaddexp.reduce(stacked, axis=0) - np.log(len(scored))
        starts = np.concatenate(([0], np.cumsum(first.n_tokens + (0 if self.include_eos else 1))))
        per_tok = np.split(tokens, starts[1:-1])
        logprob = np.add.reduceat(tokens, starts[:-1])
        if not self.include_eos:  # the end-of-sequence term is each pair's last
            logprob -= tokens[starts[1:] - 1]
        return ScoredPairs(
            logprob,
            first.n_tokens,
            first.src_unknown,
            first.tgt_unknown,
            per_tok if per_token else None,
        )
