"""``nbest``'s list scored as a chunked job: its flags (:class:`NBestOptions`), what it reads
(:class:`NBestRun`), what it gives (:class:`NBestResult`), and :func:`score_list`, the run
itself, top to bottom: the weights, the source and the features' models loaded
(:mod:`.features`), the list read in chunks cut at sentence-id groups (:class:`ListChunks`), each
chunk scored (:class:`~.features.ChunkFeatures`), written (:mod:`.writer`) and appended through
the runner every chunked job shares (:class:`~phrasescore.runners.chunked_job.ChunkedRun`).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from phrasescore.errors import InputError
from phrasescore.files import display_name, iter_lines
from phrasescore.jobs.feature_specs import FeatureModel
from phrasescore.jobs.nbest.features import ChunkFeatures, load_features
from phrasescore.jobs.nbest.writer import ListWriter, regroup, with_features
from phrasescore.moses.nbest import NBestEntry, iter_nbest_groups, read_nbest, read_weights
from phrasescore.progress import progress_bar
from phrasescore.runners.chunked_job import ChunkedRun, PartKey, PartPlan, RunFlags, Written
from phrasescore.runners.partial import WholeOutput
from phrasescore.runners.shards import NBEST, Shard, chunk_record

log = logging.getLogger(__name__)


@dataclass
class NBestOptions:
    """Flags of ``phrasescore nbest``."""

    name: str | None = None
    """``--name`` of a plain ``-m MODEL`` (default ``RNNEncDec0``); None with ``NAME=MODEL``."""
    normalize: bool = False
    weights: str | None = None
    one_best: bool = False
    chunk_lines: int = 4000
    """Lines per chunk (``--chunk-lines``): a chunk ends after the sentence that reaches it."""
    batch_tokens: int = 8192
    lm: str | None = None
    """A CSLM file (``phrasescore train-lm``): also add ``lm_name= log p(hypothesis)``."""
    lm_name: str = "CSLM0"
    scoring: str = "exact"
    """``exact`` or ``self-normalized`` (:mod:`phrasescore.engine.scoring`; the model's feature only)."""
    inverse: bool = False
    """The model is target->source: its feature is log p(source | hypothesis)."""
    inverse_models: tuple[str, ...] = ()
    """``--inverse-model NAME=MODEL[,MODEL]`` specs: target->source features."""


@dataclass
class NBestResult:
    output: str
    sentences: int
    hypotheses: int
    seconds: float
    changed: int | None = None
    """With weights: ids whose best hypothesis is not the one with the best original total."""
    clamped: int = 0
    """Self-normalized scoring: hypotheses whose log p was above 0, clamped to 0."""
    scoring: str | None = None
    """The model's scoring (``exact`` or ``self-normalized``); None without a model."""

    @property
    def hypotheses_per_second(self) -> float:
        return self.hypotheses / max(self.seconds, 1e-9)

    def lines(self) -> list[str]:
        """The summary ``nbest`` prints on standard error."""
        changed = "" if self.changed is None else f", best hypothesis changed for {self.changed}"
        mode = ""
        if self.scoring is not None:
            mode = f", {self.scoring} scoring" + (
                f" ({self.clamped} clamped at log p = 0)" if self.clamped else ""
            )
        return [
            f"phrasescore: {self.hypotheses} hypotheses of {self.sentences} sentences, "
            f"{self.seconds:.1f} s{changed}{mode} -> {self.output}"
        ]


@dataclass
class NBestRun:
    """What one n-best run reads: the list, the source, the features and the flags that change
    the bytes (how it runs, output included, is its
    :class:`~phrasescore.runners.chunked_job.RunFlags`)."""

    nbest: str
    source: str
    features: Sequence[FeatureModel]
    options: NBestOptions
    names: list[str]
    """The features added, in order (the CSLM's first)."""
    with_model: bool
    """Whether a model's feature is added (else the CSLM's alone, or re-ranking alone)."""


def score_list(run: NBestRun, flags: RunFlags) -> NBestResult:
    """Add ``run``'s features to every hypothesis of its list into ``flags.output``, one chunk
    of about ``chunk_lines`` hypotheses at a time (whole sentence-id groups)."""
    options = run.options
    with ChunkedRun(flags) as chunked:
        weights = _read_weights(options.weights, run.names) if options.weights else None
        sources = read_source(run.source)
        device = chunked.device()
        with chunked.loading():  # everything loaded before anything is written
            features, signatures, scorer = load_features(
                run.features,
                options.lm,
                options.lm_name,
                device,
                options.batch_tokens,
                options.scoring,
                options.normalize,
            )
        key = None
        if flags.shard is not None:
            log.info(
                "shard %s: chunks i of about %d hypotheses with i %% %d == %d",
                flags.shard,
                options.chunk_lines,
                flags.shard.count,
                flags.shard.index - 1,
            )
            job = _manifest_job(run, signatures, weights, sources)
            key = PartKey(NBEST, run.nbest, options.chunk_lines, job)
        names = [name for name, _ in features]
        writer = ListWriter(weights, options.weights, options.one_best, len(sources), names)
        chunks = ListChunks(run.nbest, sources, run.source, options.chunk_lines, flags.shard)
        chunks.first_chunk = scorer.warn_direction if scorer is not None else None
        started = time.monotonic()
        bar = progress_bar(flags.progress, unit=" hyps", unit_scale=True)
        clamped = 0
        try:
            chunked.open(WholeOutput(flags.output))
            score = ChunkFeatures(features, scorer)
            warm_up = scorer.warm_up if scorer is not None else None
            with chunked.scoring(score, warm_up) as scoring:
                for _, scored in scoring.results(chunks.pairs()):
                    chunk = chunks.pending.popleft()
                    if scored is None:
                        writer.skip(chunk.groups)
                        continue
                    values, chunk_clamped = scored
                    clamped += chunk_clamped
                    entries = with_features(chunk.entries, names, values)
                    text = writer.chunk_text(regroup(entries, chunk.groups))
                    ids = [str(e.id) for e in entries] if flags.shard else None
                    record = chunk_record(chunk.index, ids) if ids is not None else None
                    chunked.append(Written(text.encode("utf-8"), len(entries), b"", record))
                    bar.update(len(entries))
                scoring.finish()
            chunked.append(Written(writer.finish(run.nbest).encode("utf-8"), 0))
            chunked.complete()
            plan = PartPlan(key, sum(chunks.plan), writer.hypotheses, chunks.plan) if key else None
            chunked.publish(plan)
        finally:
            bar.close()
    result = _result(flags.output, writer, time.monotonic() - started, weights, clamped)
    result.scoring = options.scoring if run.with_model else None
    return result


def read_source(path: str) -> list[str]:
    """The source sentences, one per line."""
    return list(iter_lines(path))


def _read_weights(path: str, names: list[str]) -> dict[str, list[float]]:
    """The weights of ``path``, which must weigh each new feature."""
    weights = read_weights(path)
    for name in names:
        if name not in weights:
            raise InputError(
                f"gives no weight for the new feature {name}: add a line "
                f"'{name}= 1.0' (or the weight MERT found) to its [weight] section",
                display_name(path),
            )
        if len(weights[name]) != 1:
            raise InputError(
                f"{name} has one value but {len(weights[name])} weights", display_name(path)
            )
    return weights


class ListChunk(NamedTuple):
    """One chunk of the list: whole sentence-id groups."""

    index: int
    """Its index among all the list's chunks (a shard's own: ``index % N == K - 1``)."""
    groups: list[list[NBestEntry]]
    entries: list[NBestEntry]
    """The groups' entries, in order."""


def _grouped(groups: Iterable[list[NBestEntry]], size: int) -> Iterator[list[list[NBestEntry]]]:
    """The groups gathered into chunks: a chunk ends after the group that brings it to ``size``
    lines or more."""
    chunk: list[list[NBestEntry]] = []
    count = 0
    for group in groups:
        chunk.append(group)
        count += len(group)
        if count >= size:
            yield chunk
            chunk, count = [], 0
    if chunk:
        yield chunk


class ListChunks:
    """The list's chunks in input order (:func:`_grouped`): the pairs each one scores (None for
    another shard's chunk), every chunk kept in :attr:`pending` until its scores come back, and
    the sizes of all chunks in :attr:`plan` (a shard's manifest)."""

    def __init__(self, nbest: str, sources: list[str], source_path: str, size: int, shard):
        self.nbest = nbest
        self.sources = sources
        self.source_path = source_path
        self.size = size
        self.shard: Shard | None = shard
        self.plan: list[int] = []
        self.pending: collections.deque[ListChunk] = collections.deque()
        self.first_chunk = None
        """Called with the first scored chunk's ``(sources, hypotheses)`` in this process (the
        models' direction check, :meth:`~phrasescore.jobs.nbest.features.ModelFeatures.warn_direction`)."""

    def pairs(self) -> Iterator[tuple[list[str], list[str]] | None]:
        """The ``(sources, hypotheses)`` of each chunk to score (None for another shard's)."""
        groups = iter_nbest_groups(read_nbest(self.nbest))
        for index, groups_ in enumerate(_grouped(groups, self.size)):
            entries = [e for group in groups_ for e in group]
            self.plan.append(len(entries))
            srcs = [_source_of(e, self.sources, self.source_path) for e in entries]
            self.pending.append(ListChunk(index, groups_, entries))
            if self.shard is not None and not self.shard.owns(index):
                yield None
                continue
            hyps = [e.hypothesis for e in entries]
            if self.first_chunk is not None:
                self.first_chunk(srcs, hyps)
                self.first_chunk = None
            yield srcs, hyps


def _source_of(entry: NBestEntry, sources: list[str], source_path: str) -> str:
    if entry.id >= len(sources):
        has = f"{len(sources)} lines (ids 0-{len(sources) - 1})" if sources else "no line"
        raise InputError(
            f"sentence id {entry.id} is out of range: the source {display_name(source_path)} has "
            f"{has}; the list and the source do not match",
            entry.path,
            entry.lineno,
        )
    text = sources[entry.id]
    if not text.strip():
        raise InputError(
            f"the source sentence of id {entry.id} (line {entry.id + 1} of "
            f"{display_name(source_path)}) is empty; the list and the source do not match",
            entry.path,
            entry.lineno,
        )
    return text


def _manifest_job(run: NBestRun, signatures: dict, weights, sources: list[str]) -> dict:
    """What every shard of one n-best job must share (the manifest's ``job``)."""
    options = run.options
    inverse = [feature.name for feature in run.features if feature.inverse]
    return {
        "features": run.names,
        **signatures,
        "options": {
            "normalize": options.normalize,
            "batch_tokens": options.batch_tokens,
            "scoring": options.scoring,
            "weights": weights,
            **({"inverse": inverse} if inverse else {}),
        },
        "source": {
            "lines": len(sources),
            "sha256": hashlib.sha256("\n".join(sources).encode("utf-8")).hexdigest(),
        },
    }


def _result(output: str, writer: ListWriter, seconds: float, weights, clamped: int):
    """The result of a run, logged."""
    reranked = weights is not None
    result = NBestResult(
        "<stdout>" if output == "-" else output,
        writer.sentences,
        writer.hypotheses,
        seconds,
        writer.changed if reranked else None,
        clamped,
    )
    log.info(
        "%d hypotheses of %d sentences scored in %.1f s (%.0f hypotheses/s)%s",
        writer.hypotheses,
        writer.sentences,
        seconds,
        result.hypotheses_per_second,
        f"; re-ranking changed the best hypothesis of {writer.changed} sentences"
        if reranked
        else "",
    )
    return result
