"""``nbest``'s list scored as a chunked job: its flags (:class:`NBestOptions`), what it reads
(:class:`NBestRun`), what it gives (:class:`NBestResult`), and :func:`score_list`, the run
itself, top to bottom: the weights, the source and the features' models loaded
(:mod:`.features`), the list read as raw lines in chunks cut at sentence-id groups
(:class:`ListChunks`), each chunk parsed, scored and formatted (:class:`~.chunks.ListChunkJob`,
here or in a worker process) and appended in order through the runner every chunked job shares
(:class:`~phrasescore.runners.chunked_job.ChunkedRun`), the run's count kept by
:class:`~.writer.ListTally`.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from phrasescore.compression import TABLE_LEVEL, compressor
from phrasescore.engine.graph_scoring import log_captured_graphs
from phrasescore.errors import InputError
from phrasescore.files import display_name, iter_lines
from phrasescore.jobs.feature_specs import FeatureModel
from phrasescore.jobs.nbest.chunks import (
    ListChunkJob,
    RawList,
    RawListChunk,
    chunk_label,
    list_chunks,
)
from phrasescore.jobs.nbest.features import ChunkFeatures, load_features
from phrasescore.jobs.nbest.writer import GroupSpan, ListFormat, ListTally, OneBestLines, spans
from phrasescore.moses.nbest import read_weights
from phrasescore.progress import log_startup, progress_bar
from phrasescore.runners.chunked_job import ChunkedRun, PartKey, PartPlan, RunFlags, Written
from phrasescore.runners.partial import PartialOutput, TextPublish, file_identity
from phrasescore.runners.shards import NBEST, Shard, joined_runs, runs_record
from phrasescore.runners.streams import WholeOutput

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
    shared_prefixes: bool | None = None
    """Score each distinct (source, prefix, word) once
    (:mod:`phrasescore.engine.prefix_scoring`); None: on the CPU only."""
    gzip_level: int = TABLE_LEVEL
    """A ``.gz`` list's compression (:mod:`phrasescore.compression`): each chunk one gzip
    member, compressed where the chunk is formatted."""


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
    resumed_hypotheses: int = 0
    """``--resume``: the hypotheses an earlier run wrote (counted above, not scored here)."""
    complete_already: bool = False
    """``--resume --shard`` found the part complete (with its manifest): nothing was done."""

    @property
    def hypotheses_per_second(self) -> float:
        return (self.hypotheses - self.resumed_hypotheses) / max(self.seconds, 1e-9)

    def lines(self) -> list[str]:
        """The summary ``nbest`` prints on standard error."""
        if self.complete_already:
            return [
                f"phrasescore: {self.output} is complete already ({self.hypotheses} hypotheses "
                f"of {self.sentences} sentences): nothing to do"
            ]
        resumed = ""
        if self.resumed_hypotheses:
            resumed = f" (resumed after {self.resumed_hypotheses} hypotheses)"
        changed = "" if self.changed is None else f", best hypothesis changed for {self.changed}"
        mode = ""
        if self.scoring is not None:
            mode = f", {self.scoring} scoring" + (
                f" ({self.clamped} clamped at log p = 0)" if self.clamped else ""
            )
        return [
            f"phrasescore: {self.hypotheses} hypotheses of {self.sentences} sentences{resumed}, "
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
    of about ``chunk_lines`` hypotheses at a time (whole sentence-id groups); with
    ``flags.resume`` after the chunks an earlier run wrote."""
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
                options.shared_prefixes,
            )
        prefixes = scorer is not None and scorer.shared_prefixes
        job = _manifest_job(run, signatures, weights, sources, prefixes)
        key = PartKey(NBEST, run.nbest, options.chunk_lines, job)
        done = chunked.finished_part(key)
        if done is not None:
            return _finished(flags.output, done, options.scoring if run.with_model else None)
        names = [name for name, _ in features]
        list_format = ListFormat(weights, options.weights, options.one_best, names)
        sink = _output(run, flags, _identity(run, flags, job), len(sources))
        chunk_job = ListChunkJob(
            display_name(run.nbest),
            sources,
            run.source,
            ChunkFeatures(features, scorer),
            scorer,
            list_format,
            sink.gzip_level if isinstance(sink, PartialOutput) else None,
        )
        chunks = ListChunks(run.nbest, options.chunk_lines, flags.shard, chunk_job)
        tally = ListTally(len(sources), options.one_best)
        start_line = chunked.open(sink)
        log_startup(log, "the source read, the models loaded")
        started = time.monotonic()
        with progress_bar(flags.progress, unit=" hyps", unit_scale=True) as bar:
            totals = chunked.resumed_totals()
            tally.changed, clamped = totals.get("changed", 0), totals.get("clamped", 0)
            input_crc = chunks.skip_done(start_line, tally, chunked.records)
            if start_line:  # standard input: the CRC-32 of the lines read again is the only proof
                chunked.check_input(input_crc, bar.close, provable=run.nbest != "-")
            resumed = tally.hypotheses
            bar.update(resumed)
            warm_up = scorer.warm_up if scorer is not None else None
            serve = chunk_job.features.serve  # an --io-workers process asks this one to score
            with chunked.scoring(chunk_job, warm_up, chunk_label, serve) as scoring:
                scored = scoring.results(chunks.items())
                clamped = _write_scored(chunked, scored, chunks, tally, bar, clamped)
                scoring.finish()
            if scorer is not None:
                log_captured_graphs(scorer.scorers)
            tally.finish(run.nbest)
            chunked.complete()
            chunked.publish(PartPlan(key, sum(chunks.plan), tally.hypotheses, chunks.plan))
    result = _result(flags.output, tally, time.monotonic() - started, weights, clamped)
    result.scoring = options.scoring if run.with_model else None
    result.resumed_hypotheses = resumed
    return result


def _write_scored(chunked: ChunkedRun, scored, chunks: ListChunks, tally, bar, clamped: int):
    """Append each scored chunk (its :class:`~.chunks.ListChunkOutput`; None: another shard's,
    whose ids alone are counted) in input order; returns the model scores clamped so far."""
    for _, out in scored:
        chunk = chunks.pending.popleft()
        if out is None:
            tally.skip(spans(chunks.job.groups(chunk)), chunks.job.name)
            continue
        tally.add(out.groups, chunks.job.name, out.changed)
        clamped += out.clamped
        totals = {"changed": tally.changed, "clamped": clamped}
        record = chunks.record(chunk, out.groups)
        chunked.append(Written(out.data, out.lines, chunk.source, record, totals))
        bar.update(sum(group.size for group in out.groups))
    return clamped


def _output(run: NBestRun, flags: RunFlags, identity: dict, n_sources: int):
    """The list's output: a partial file and its state (``--resume``) that holds the output's
    bytes (a ``.gz`` list's gzip members, one a chunk) and takes its name when whole; with
    ``--one-best`` plain text whose best lines are placed by id when it is published (one gzip
    stream for ``.gz``); or a stream."""
    final = OneBestLines(n_sources) if run.options.one_best else None
    if flags.stream:
        return WholeOutput(flags.output, final)
    if final is not None:
        return PartialOutput(flags.output, identity, text=TextPublish(final))
    return PartialOutput(flags.output, identity, run.options.gzip_level)


def _identity(run: NBestRun, flags: RunFlags, job: dict) -> dict:
    """What a partial output is made from (its resume key): the list, the source, the
    features' models and the flags that change the bytes, the shard."""
    options = run.options
    identity = {
        # first: a partial output of another version is refused as such, whatever else differs
        "version": 2,
        "input": file_identity(run.nbest),
        "source": job["source"],
        "features": job["features"],
        "models": job["models"],
        "lms": job["lms"],
        "options": {
            **{key: value for key, value in job["options"].items() if key != "gzip_level"},
            "one_best": options.one_best,
            "chunk_lines": options.chunk_lines,
        },
    }
    if flags.output.endswith(".gz") and not options.one_best:  # the bytes depend on the library
        identity["gzip"] = compressor(options.gzip_level)
    if flags.shard is not None:
        identity["shard"] = [flags.shard.index, flags.shard.count]
        log.info(
            "shard %s: chunks i of about %d hypotheses with i %% %d == %d",
            flags.shard,
            options.chunk_lines,
            flags.shard.count,
            flags.shard.index - 1,
        )
    return identity


def _finished(output: str, manifest: dict, scoring: str | None) -> NBestResult:
    """The result of a part an earlier run finished (``--resume --shard``): nothing done."""
    part = manifest["part"]
    return NBestResult(
        output,
        joined_runs(list(part["chunks"])),
        int(part["lines"]),
        0.0,
        None,
        scoring=scoring,
        complete_already=True,
    )


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


class ListChunks:
    """The list's chunks in input order (:class:`~.chunks.RawList`), read in this process: the
    chunks an earlier run wrote read past (:meth:`skip_done`), then each chunk left handed to
    the map (:meth:`items`; None for another shard's), every chunk kept in :attr:`pending`
    until its result comes back; the sizes of all chunks in :attr:`plan` (a shard's
    manifest)."""

    def __init__(self, nbest: str, size: int, shard: Shard | None, job: ListChunkJob):
        self.nbest = nbest
        self.shard = shard
        self.job = job
        self.plan: list[int] = []
        self.pending: collections.deque[RawListChunk] = collections.deque()
        self._chunks = list_chunks(RawList(nbest), size)

    def _next(self) -> RawListChunk | None:
        chunk = next(self._chunks, None)
        if chunk is not None:
            self.plan.append(chunk.lines)
        return chunk

    def _owns(self, chunk: RawListChunk) -> bool:
        return self.shard is None or self.shard.owns(chunk.index)

    def record(self, chunk: RawListChunk, groups: list[GroupSpan]) -> dict | None:
        """A shard's record of its chunk (:func:`~phrasescore.runners.shards.runs_record`: its
        sentence ids are its runs)."""
        if self.shard is None:
            return None
        if not groups:
            return runs_record(chunk.index, 0, 0, None, None)
        lines = sum(group.size for group in groups)
        first, last = str(groups[0].id).encode(), str(groups[-1].id).encode()
        return runs_record(chunk.index, lines, len(groups), first, last)

    def skip_done(self, start_line: int, tally: ListTally, records: list[dict]) -> int:
        """``--resume``: read past the chunks whose ``start_line`` output lines an earlier run
        wrote (counted by ``tally``; a shard's records appended to ``records``); the CRC-32
        of their input lines."""
        done = input_crc = 0
        name = self.job.name
        while done < start_line:
            chunk = self._next()
            if chunk is None:
                raise InputError(
                    f"cannot resume: the list ends before the {start_line} output lines of the "
                    "partial output (run without --resume to start again)",
                    display_name(self.nbest),
                )
            groups = spans(self.job.groups(chunk))
            if not self._owns(chunk):
                tally.skip(groups, name)
                continue
            done += tally.count_done(groups, name)
            input_crc = zlib.crc32(chunk.source, input_crc)
            if self.shard is not None:
                records.append(self.record(chunk, groups))
        if done != start_line:
            raise InputError(
                f"cannot resume: the partial output ends after its line {start_line}, within a "
                "chunk of the list (run without --resume to start again)",
                display_name(self.nbest),
            )
        if start_line:
            log.info("resuming after %d output lines", start_line)
        return input_crc

    def items(self) -> Iterator[RawListChunk | None]:
        """Each chunk left to score (None for another shard's), the first marked."""
        first = True
        for chunk in iter(self._next, None):
            if self._owns(chunk) and first:
                chunk, first = chunk._replace(first=True), False
            self.pending.append(chunk)
            yield chunk if self._owns(chunk) else None


def _manifest_job(
    run: NBestRun, signatures: dict, weights, sources: list[str], shared_prefixes: bool
) -> dict:
    """What every shard of one n-best job must share (the manifest's ``job``); the scoring
    plan (``shared_prefixes``) is among the flags that change the last digits."""
    options = run.options
    inverse = [feature.name for feature in run.features if feature.inverse]
    return {
        "features": run.names,
        **signatures,
        "options": {
            "normalize": options.normalize,
            "batch_tokens": options.batch_tokens,
            "scoring": options.scoring,
            "shared_prefixes": shared_prefixes,
            "weights": weights,
            "gzip_level": options.gzip_level,
            **({"inverse": inverse} if inverse else {}),
        },
        "source": {
            "lines": len(sources),
            "sha256": hashlib.sha256("\n".join(sources).encode("utf-8")).hexdigest(),
        },
    }


def _result(output: str, tally: ListTally, seconds: float, weights, clamped: int):
    """The result of a run, logged."""
    reranked = weights is not None
    result = NBestResult(
        "<stdout>" if output == "-" else output,
        tally.sentences,
        tally.hypotheses,
        seconds,
        tally.changed if reranked else None,
        clamped,
    )
    log.info(
        "%d hypotheses of %d sentences scored in %.1f s (%.0f hypotheses/s)%s",
        tally.hypotheses,
        tally.sentences,
        seconds,
        result.hypotheses_per_second,
        f"; re-ranking changed the best hypothesis of {tally.changed} sentences"
        if reranked
        else "",
    )
    return result
