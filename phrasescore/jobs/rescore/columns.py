"""The columns ``rescore`` appends to each phrase-table line, and the flags that shape them.

For each input line, exactly one output line in the same order, with only the score field
changed: the new values are appended after the existing scores (``phrasescore.moses``).

Per model, the new column holds p(target | source) = exp(max(log p, -100)) — a probability,
because Moses takes ln of every value it loads and floors it at -100. ``normalize`` writes the
per-token geometric mean exp(log p / n) instead (n target tokens, end-of-sequence included),
``logprob`` the raw log p for consumers other than Moses. ``unk_column`` appends
exp(-(unknown source words + unknown target words)), the unknown-word feature of Cho et al. §4.2
(counted with the first model's vocabularies).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from phrasescore.bundle import TrainedLM, load_lm, load_model
from phrasescore.compression import TABLE_LEVEL
from phrasescore.engine.batching import IdPairs
from phrasescore.engine.lm_scoring import LMScorer
from phrasescore.engine.protocol import build_scorer
from phrasescore.engine.scoring import (
    SELF_NORMALIZED,
    EncodedPairs,
    ScoredPairs,
    check_scoring,
)
from phrasescore.errors import InputError
from phrasescore.jobs.common import warn_if_reversed
from phrasescore.moses.columnar import TableChunk, splice
from phrasescore.moses.phrase_table import (
    format_float_column,
    format_logprob_column,
    format_probability,
    probability_from_logprob,
)
from phrasescore.runners.partial import file_identity
from phrasescore.text.corpus import gather_sequences
from phrasescore.text.phrase_ids import PhraseArrays, PhraseIds

log = logging.getLogger(__name__)


LOGPROB_FLOOR = -100.0


@dataclass
class RescoreOptions:
    """Flags of ``phrasescore rescore`` that change the output bytes (kept in the resume state)."""

    normalize: bool = False
    logprob: bool = False
    unk_column: bool = False
    no_eos: bool = False
    dtype: str = "float32"
    batch_tokens: int = 8192
    chunk_lines: int = 10000
    max_phrase_length: int = 100
    scoring: str = "exact"
    """``exact`` or ``self-normalized`` (:mod:`phrasescore.engine.scoring`): the model columns only."""
    gzip_level: int = TABLE_LEVEL
    """The level of a ``.gz`` output (:mod:`phrasescore.compression`: 0-3 ISA-L, 4-9 zlib)."""

    def key(self) -> dict:
        return dict(self.__dict__)


def is_too_long(source: str, target: str, limit: int) -> bool:
    """Whether a pair has a phrase of more than ``limit`` tokens (never given to a model)."""
    return len(source.split()) > limit or len(target.split()) > limit


def scored_within_limit(pairs: EncodedPairs, logprob: np.ndarray, too_long: np.ndarray):
    """:class:`ScoredPairs` of every pair: ``logprob`` (the scorer's, of the pairs that are not
    too long) in place, LOGPROB_FLOOR for the others."""
    if too_long.any():
        full = np.full(len(too_long), LOGPROB_FLOOR)
        full[~too_long] = logprob
        logprob = full
    return ScoredPairs(logprob, pairs.n_tokens, pairs.src_unknown, pairs.tgt_unknown)


def floor_value(logprob: bool = False) -> str:
    """The value of a pair that is not scored: exp(-100), or -100 with ``logprob``."""
    if logprob:
        return repr(LOGPROB_FLOOR)
    return format_probability(probability_from_logprob(LOGPROB_FLOOR))


def lm_values_within_limit(values: list[str], too_long: np.ndarray) -> list[str]:
    """A CSLM column: ``values`` (of the pairs that are not too long) in place, the floor value
    for pairs marked ``too_long``."""
    if not too_long.any():
        return values
    scored = iter(values)
    floor = floor_value()
    return [floor if long else next(scored) for long in too_long]


def column_values(scored, options: RescoreOptions, too_long: np.ndarray | None = None) -> list[str]:
    """The formatted values of one model's column for a block of scored pairs; pairs marked
    ``too_long`` get the floor value (exp(-100), or -100 with ``logprob``) in every mode."""
    if too_long is not None and too_long.any():
        values = column_values(scored, options)
        floor = floor_value(options.logprob)
        return [floor if long else v for v, long in zip(values, too_long, strict=True)]
    if options.logprob:
        return format_float_column(np.maximum(scored.logprob, LOGPROB_FLOOR))
    if options.normalize:
        per_token = np.maximum(scored.logprob, LOGPROB_FLOOR) / scored.n_tokens
        return format_logprob_column(per_token)
    return format_logprob_column(scored.logprob)


def unknown_values(scored) -> list[str]:
    counts = scored.src_unknown + scored.tgt_unknown
    return format_logprob_column(-counts)


# ---------------------------------------------------------------------------- CSLM column
class LMPhraseColumn:
    """A phrase-table column: p(target phrase) under a CSLM, phrase mode (:mod:`phrasescore.engine.lm_scoring`).

    ``LMPhraseColumn(lm).values(sources, targets)`` gives the formatted column values for a
    block of table lines; ``name`` identifies the column (``cslm:<signature>``) in logs and in
    the moses.ini comment.
    """

    def __init__(self, lm: TrainedLM, device="cpu"):
        self.lm = lm
        self.scorer = LMScorer(lm, device)
        self.name = f"cslm:{lm.signature}"

    def logprobs(self, targets: Sequence[str]) -> np.ndarray:
        return self.scorer.score_phrases(targets).logprob

    def encode(self, targets: Sequence[str]) -> list[list[int]]:
        """The ids of target phrases (the text half of :meth:`logprobs`)."""
        lm = self.lm
        return lm.vocab.encode_batch([lm.text.normalize_tokenized(t) for t in targets])

    def score_ids(self, ids: list[list[int]]) -> np.ndarray:
        """log p of phrases given as ids (:meth:`encode`), phrase mode."""
        return self.scorer.score_ids(ids, False)[0]

    def values(self, sources: Sequence[str], targets: Sequence[str]) -> list[str]:
        return format_values(self.logprobs(targets))


def format_values(logprobs: np.ndarray) -> list[str]:
    """Column values: the probabilities of natural-log scores (floored at -100)."""
    return format_logprob_column(logprobs)


def check_directions(models, inverse_models, model_paths, inverse_paths) -> None:
    """Refuse models that disagree on the table's direction (before anything is written).

    Every ``--model`` must translate the same source language into the same target language,
    and every ``--inverse-model`` the other way round (languages as recorded at training).
    """
    pairs = [(m.src_text.lang, m.tgt_text.lang) for m in models]
    pairs += [(m.tgt_text.lang, m.src_text.lang) for m in inverse_models]
    paths = list(model_paths) + list(inverse_paths)
    if pairs and any(p != pairs[0] for p in pairs):
        first = pairs[0]
        for path, pair, inverse in zip(
            paths, pairs, [False] * len(models) + [True] * len(inverse_models), strict=True
        ):
            if pair != first:
                given = (pair[1], pair[0]) if inverse else pair
                hint = "" if inverse else "; a model of the other direction goes in --inverse-model"
                raise InputError(
                    f"model translates {given[0]}->{given[1]}, but the table is "
                    f"{first[0]}->{first[1]} for {paths[0]}{hint}",
                    path,
                )


class NewColumns:
    """The columns added to each line: one per model (direct, then inverse), one per CSLM, and
    the unknown-word column."""

    def __init__(
        self, models, directions, lm_columns, options: RescoreOptions, device, scorers=None
    ):
        """``scorers``: built already, one per model (default: the device's engine each,
        :func:`~phrasescore.engine.protocol.build_scorer`)."""
        self.options = options
        self.directions = directions
        self.lm_columns = lm_columns
        self.scorers = scorers or [
            build_scorer(
                m,
                device=device,
                dtype=options.dtype,
                batch_tokens=options.batch_tokens,
                include_eos=not options.no_eos,
                scoring=options.scoring,
            )
            for m in models
        ]
        self.models = list(models)
        self.paths = [""] * len(self.models)
        self.signatures = [m.signature for m in models]
        self.names = [
            f"phrasescore{'-inverse' if inverse else ''}:{m.signature}"
            + ("+no-eos" if options.no_eos else "")
            + ("+self-normalized" if options.scoring == SELF_NORMALIZED else "")
            for m, inverse in zip(models, directions, strict=True)
        ]
        self.names += [column.name for column in lm_columns]
        self._phrase_ids: list[tuple[PhraseIds, PhraseIds]] | None = None
        if options.unk_column:
            if not models:
                raise InputError("--unk-column counts with a model's vocabularies: give a --model")
            self.names.append("unknown-words")

    @classmethod
    def load(
        cls, model_paths, inverse_paths, lm_paths, options, device, scorers=None
    ) -> NewColumns:
        """Load the models and CSLMs (``scorers``: the direct models' scorers, built already,
        in place of ``model_paths``)."""
        lm_columns = [LMPhraseColumn(load_lm(path, device), device) for path in lm_paths]
        if scorers is not None:
            models = [scorer.model for scorer in scorers]
        else:
            if not model_paths and not inverse_paths and not lm_columns:
                raise InputError("give at least one --model (or --lm)")
            models = [load_model(path, device) for path in model_paths]
        inverse_models = [load_model(path, device) for path in inverse_paths]
        named = list(model_paths) + list(inverse_paths)
        loaded = list(models) + inverse_models
        for model, path in zip(
            loaded, named if len(named) == len(loaded) else [None] * len(loaded), strict=True
        ):
            check_scoring(model, options.scoring, path)  # before any output is written
        check_directions(models, inverse_models, model_paths, inverse_paths)
        directions = [False] * len(models) + [True] * len(inverse_models)
        if scorers is not None and inverse_models:
            raise InputError("built scorers are for direct models alone, not --inverse-model")
        columns = cls(
            list(models) + inverse_models, directions, lm_columns, options, device, scorers
        )
        paths = list(model_paths) + list(inverse_paths)
        all_models = list(models) + inverse_models
        columns.paths = paths if len(paths) == len(all_models) else [""] * len(all_models)
        for model, path in zip(all_models, paths or [""] * len(all_models), strict=False):
            log.info("model %s: %s, signature %s", path, model.config.arch, model.signature)
        return columns

    def warn_direction(self, chunk) -> None:
        """Warn when the table looks reversed for a model (see :func:`~phrasescore.jobs.common.direction_evidence`).

        A lone model cannot be checked against another's direction, and neither the table nor
        the moses.ini records its languages; what can be seen is which of the model's
        vocabularies knows the table's words.
        """
        sources = list(dict.fromkeys(chunk.source_strings()))
        targets = list(dict.fromkeys(chunk.target_strings()))
        for model, inverse, path in zip(self.models, self.directions, self.paths, strict=True):
            src, tgt = (targets, sources) if inverse else (sources, targets)
            warn_if_reversed(
                model,
                path,
                src,
                tgt,
                "the table's",
                "if it translates the table's target language into its source language, give it "
                f"as {'--model' if inverse else '--inverse-model'}",
            )

    def warm_up(self) -> None:
        """Compile every model's kernels before ``--workers`` processes are forked from this
        one (:meth:`~phrasescore.engine.scoring.BlockScorer.warm_up`): they inherit them."""
        for scorer in self.scorers:
            scorer.warm_up()

    def clamped(self) -> int:
        """Model scores clamped at log p = 0 so far (self-normalized scoring)."""
        return sum(scorer.clamped for scorer in self.scorers)

    def identity(self, table: str) -> dict:
        """What a partial output was made from: input, models, flags (the resume key)."""
        identity = {
            "input": file_identity(table),
            "models": self.signatures,
            "inverse": self.directions,
            "options": self.options.key(),
            "version": 1,
        }
        if self.lm_columns:
            identity["lms"] = [column.lm.signature for column in self.lm_columns]
        return identity

    def job(self) -> dict:
        """What every shard of one job must share (the manifest's ``job``)."""
        job = {
            "models": self.signatures,
            "inverse": self.directions,
            "columns": self.names,
            "options": self.options.key(),
        }
        if self.lm_columns:
            job["lms"] = [column.lm.signature for column in self.lm_columns]
        return job

    def phrase_ids(self) -> list[tuple[PhraseIds, PhraseIds]]:
        """Per model: the encoders of its source side's phrases and of its target side's
        (:class:`~phrasescore.text.phrase_ids.PhraseIds`)."""
        if self._phrase_ids is None:
            self._phrase_ids = [
                (
                    PhraseIds(s.model.src_vocab, s.model.src_text),
                    PhraseIds(
                        s.model.tgt_vocab,
                        s.model.tgt_text,
                        s.model.config.target_order if s.model.config.reverse_target else None,
                    ),
                )
                for s in self.scorers
            ]
        return self._phrase_ids

    def too_long(self, chunk: TableChunk) -> np.ndarray:
        """Which lines have a phrase of more than ``max_phrase_length`` tokens: a phrase of at
        most twice as many bytes cannot (each token takes a byte and a separator), so only
        longer ones are split (:func:`is_too_long`)."""
        limit = self.options.max_phrase_length
        src_bytes, tgt_bytes = chunk.phrase_bytes()
        maybe = np.flatnonzero((src_bytes > 2 * limit) | (tgt_bytes > 2 * limit))
        too_long = np.zeros(len(chunk), dtype=bool)
        if len(maybe):
            sources, targets = chunk.sources(), chunk.targets()
            for i in maybe.tolist():
                too_long[i] = is_too_long(sources[i].decode(), targets[i].decode(), limit)
        return too_long

    def prepare(self, chunk: TableChunk) -> PreparedChunk:
        """The text half of a chunk's scoring (vocabularies, no network): which pairs are too
        long, and the ids every column scores (:class:`PreparedChunk`), as arrays: the
        chunk's targets and the first source of each run of equal sources encoded in one pass
        each (:meth:`~phrasescore.text.phrase_ids.PhraseIds.encode`), the pairs' ids gathered."""
        too_long = self.too_long(chunk)
        keep = np.flatnonzero(~too_long) if too_long.any() else None
        runs = chunk.source_runs()
        run_of_line = np.repeat(
            np.arange(len(runs), dtype=np.int64), np.diff(np.append(runs, len(chunk)))
        )
        source_text, target_text = chunk.phrase_text("source", runs), chunk.phrase_text("target")
        counts = self.options.unk_column  # the unknown-word column is their only use
        pairs, request_pairs = [], []
        for index, (scorer, inverse, (src_ids, tgt_ids)) in enumerate(
            zip(self.scorers, self.directions, self.phrase_ids(), strict=True)
        ):
            # each side's phrases and the line each of them belongs to (None: one per line)
            if inverse:  # the model reads the line's target and predicts its source
                src, src_line = src_ids.encode(target_text), None
                tgt, tgt_line = tgt_ids.encode(source_text), run_of_line
            else:
                src, src_line = src_ids.encode(source_text), run_of_line
                tgt, tgt_line = tgt_ids.encode(target_text), None
            request_pairs.append(
                IdPairs(
                    PhraseArrays(*_lines_ids(src, src_line, keep)),
                    PhraseArrays(*_lines_ids(tgt, tgt_line, keep)),
                )
            )
            eos = 1 if scorer.include_eos else 0  # counted as the scorer counts
            n_tokens = _per_line(tgt.lengths(), tgt_line) + eos
            if keep is not None:  # a pair not scored: its words (only --normalize uses it)
                side = chunk.sources() if inverse else chunk.targets()
                for i in np.flatnonzero(too_long).tolist():
                    n_tokens[i] = len(side[i].decode().split()) + eos
            src_unk = tgt_unk = None
            if counts and index == 0:
                src_unk = _per_line(src.unknown, src_line)
                tgt_unk = _per_line(tgt.unknown, tgt_line)
            pairs.append(EncodedPairs(None, None, src_unk, tgt_unk, n_tokens))
        lm_ids = []
        if self.lm_columns:
            kept = [t.decode() for t in chunk.targets()]
            if keep is not None:
                kept = [kept[i] for i in keep.tolist()]
            lm_ids = [column.encode(kept) for column in self.lm_columns]
        return PreparedChunk(too_long, pairs, ScoreRequest(request_pairs, lm_ids))

    def score_request(self, request: ScoreRequest) -> ScoredRequest:
        """The network half: log p of the request's ids, one array per column, and the model
        scores this clamped (self-normalized scoring). What the process that owns the networks
        runs, for itself or for ``--io-workers`` processes."""
        before = self.clamped()
        logprobs = [
            scorer.score_arrays(pairs)[0]
            for scorer, pairs in zip(self.scorers, request.pairs, strict=True)
        ]
        logprobs += [
            column.score_ids(ids)
            for column, ids in zip(self.lm_columns, request.lm_ids, strict=True)
        ]
        return ScoredRequest(logprobs, self.clamped() - before)

    def finish(self, chunk: TableChunk, prepared: PreparedChunk, scored: ScoredRequest) -> bytes:
        """The output lines of a prepared and scored chunk: the new columns spliced into the
        chunk's bytes (:func:`~phrasescore.moses.columnar.splice`)."""
        too_long = prepared.too_long
        columns = []
        first_scored = None
        for pairs, logprob in zip(prepared.pairs, scored.logprobs, strict=False):
            scored_pairs = scored_within_limit(pairs, logprob, too_long)
            first_scored = first_scored or scored_pairs
            columns.append(column_values(scored_pairs, self.options, too_long))
        for logprob in scored.logprobs[len(prepared.pairs) :]:
            columns.append(lm_values_within_limit(format_values(logprob), too_long))
        if self.options.unk_column:
            columns.append(unknown_values(first_scored))
        return splice(chunk, columns)

    def format_chunk(
        self, chunk: TableChunk, score: Callable | None = None
    ) -> tuple[bytes, int, int]:
        """The output lines of a chunk of the table, how many pairs have a phrase over
        ``max_phrase_length`` tokens (they get the floor value without being scored), and the
        model scores clamped: :meth:`prepare`, then ``score`` (:meth:`score_request` in this
        process by default; a ``--io-workers`` process asks the one that owns the networks),
        then :meth:`finish`. The same functions either way: the same bytes."""
        prepared = self.prepare(chunk)
        scored = (score or self.score_request)(prepared.request)
        text = self.finish(chunk, prepared, scored)
        return text, int(prepared.too_long.sum()), scored.clamped


def _per_line(values: np.ndarray, line: np.ndarray | None) -> np.ndarray:
    """A phrase's value for each line (``line``: each line's phrase; None: one per line)."""
    return values if line is None else values[line]


def _lines_ids(
    phrases: PhraseArrays, line: np.ndarray | None, keep: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """The ids and offsets of each kept line's phrase (``keep``: the lines scored; None: all),
    ``line`` as in :func:`_per_line`: one gather, none when they are the phrases as they are."""
    if line is None and keep is None:
        return phrases.ids, phrases.offsets
    index = keep if line is None else (line if keep is None else line[keep])
    return gather_sequences(phrases.ids, phrases.offsets, index)


class ScoreRequest(NamedTuple):
    """What the scoring process gets of a chunk: ids only, as arrays (a pickle of a few
    numpy arrays)."""

    pairs: list[IdPairs]
    """Per model: the ids of the pairs that are not too long."""
    lm_ids: list[list[list[int]]]
    """Per CSLM: the ids of those pairs' target phrases."""


class ScoredRequest(NamedTuple):
    """The scoring process's answer: log p per column (models, then CSLMs), scores clamped."""

    logprobs: list[np.ndarray]
    clamped: int


class PreparedChunk(NamedTuple):
    """A chunk after :meth:`NewColumns.prepare`: what stays with the text for :meth:`finish`."""

    too_long: np.ndarray
    pairs: list[EncodedPairs]
    request: ScoreRequest
