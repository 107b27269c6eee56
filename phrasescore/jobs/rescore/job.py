"""``rescore``'s table scored as a chunked job: what it reads (:class:`RescoreRun`), what it
gives (:class:`RescoreResult`), and :func:`score_table`, the run itself: the columns loaded
(:mod:`.columns`), the table read in chunks (:mod:`.chunks`), each chunk's bytes appended through
the runner every chunked job shares (:class:`~phrasescore.runners.chunked_job.ChunkedRun`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from phrasescore.compression import compressor
from phrasescore.engine.graph_scoring import log_captured_graphs
from phrasescore.files import ReadPosition
from phrasescore.hardware import resolve_dtype
from phrasescore.jobs.rescore.chunks import (
    ChunkScorer,
    Progress,
    RawTable,
    chunk_label,
    own_chunks,
    skip_done_lines,
)
from phrasescore.jobs.rescore.columns import NewColumns, RescoreOptions
from phrasescore.runners.chunked_job import ChunkedRun, PartKey, PartPlan, RunFlags, Written
from phrasescore.runners.partial import PartialOutput
from phrasescore.runners.shards import PHRASE_TABLE, joined_runs
from phrasescore.runners.streams import StdoutOutput

log = logging.getLogger(__name__)


@dataclass
class RescoreResult:
    output: str
    lines: int
    distinct_sources: int
    seconds: float
    new_columns: int
    column_names: list[str] = field(default_factory=list)
    signatures: list[str] = field(default_factory=list)
    resumed_from_line: int = 0
    complete_already: bool = False
    """``--resume`` found the output complete (a part and its manifest): nothing was done."""
    too_long: int = 0
    """Pairs with a phrase over ``max_phrase_length`` tokens, given the floor value unscored."""
    scoring: str = "exact"
    clamped: int = 0
    """Self-normalized scoring: model scores of this run above log p = 0, clamped to p = 1
    (summed over the model columns; lines done before a ``--resume`` are not counted)."""
    empty_input: bool = False
    """The table has no line at all: the output is empty too."""

    @property
    def pairs_per_second(self) -> float:
        return (self.lines - self.resumed_from_line) / max(self.seconds, 1e-9)

    def summary_lines(self) -> list[str]:
        """The summary ``rescore`` prints on standard error (``lines`` is the count)."""
        if self.complete_already:
            return [
                f"phrasescore: {self.output} is complete already ({self.lines} lines, "
                f"{self.distinct_sources} distinct sources, +{self.new_columns} column(s)): "
                "nothing to do"
            ]
        resumed = (
            f" (resumed after line {self.resumed_from_line})" if self.resumed_from_line else ""
        )
        output = "<stdout>" if self.output == "-" else self.output
        return [
            f"phrasescore: rescored {self.lines} lines{resumed}, {self.distinct_sources} "
            f"distinct sources, {self.seconds:.1f} s, {self.pairs_per_second:.0f} pairs/s, "
            f"+{self.new_columns} column(s) -> {output}, {self.scoring} scoring"
            + (f" ({self.clamped} score(s) clamped at p = 1)" if self.clamped else "")
            + (f", {self.too_long} over --max-phrase-length (floor value)" if self.too_long else "")
            + ("; the table is empty: so is the output" if self.empty_input else "")
        ]


@dataclass
class RescoreRun:
    """What one rescoring run reads: the table, the models and the flags that change the bytes
    (how it runs, output included, is its :class:`~phrasescore.runners.chunked_job.RunFlags`)."""

    table: str
    model_paths: list[str] = field(default_factory=list)
    options: RescoreOptions = field(default_factory=RescoreOptions)
    inverse_model_paths: list[str] = field(default_factory=list)
    lm_paths: list[str] = field(default_factory=list)
    scorers: list | None = None
    """Scorers already built, one per direct model (instead of ``model_paths``):
    ``tools/bench-io``'s :class:`~phrasescore.engine.constant_scoring.ConstantScorer`."""

    def __post_init__(self):
        self.inverse_model_paths = list(self.inverse_model_paths or [])
        self.lm_paths = list(self.lm_paths or [])

    def inputs(self) -> dict:
        """The files the run reads, by role (:func:`refuse_outputs_onto_inputs`)."""
        return {
            "input table": self.table,
            "model": self.model_paths,
            "--inverse-model": self.inverse_model_paths,
            "--lm": self.lm_paths,
        }

    @property
    def new_columns(self) -> int:
        """Columns added to each line."""
        n = len(self.model_paths) + len(self.inverse_model_paths) + len(self.lm_paths)
        return n + (1 if self.options.unk_column else 0)


def score_table(
    run: RescoreRun,
    flags: RunFlags,
    before_publish: Callable[[RescoreResult], None] | None = None,
) -> RescoreResult:
    """Score ``run``'s table into ``flags.output``, one chunk of ``chunk_lines`` lines at a time
    (:class:`~phrasescore.runners.chunked_job.ChunkedRun`: lock, devices, workers, resume,
    shard manifest); ``before_publish(result)`` runs before the output takes its name."""
    options = run.options
    with ChunkedRun(flags) as chunked:
        device = chunked.device()
        with chunked.loading():  # everything loaded before anything is written
            columns = _load_columns(run, device)
        identity = _identity(run, flags, columns)
        key = PartKey(PHRASE_TABLE, run.table, options.chunk_lines, columns.job())
        done = chunked.finished_part(key)
        if done is not None:
            return _finished(run, columns, flags.output, done)
        if flags.stream:
            sink = StdoutOutput(flags.output, options.gzip_level)
        else:
            sink = PartialOutput(flags.output, identity, options.gzip_level)
        start_line = chunked.open(sink)
        started = time.monotonic()
        position = ReadPosition()
        reader = RawTable(run.table, position)
        counter = Progress(flags.progress, position, start_line, started, options.max_phrase_length)
        try:
            index, input_crc = skip_done_lines(
                reader, counter, start_line, flags.shard, options, run.table, chunked.records
            )
            if start_line:  # standard input: the CRC-32 of the lines read again is the only proof
                chunked.check_input(input_crc, counter.close, provable=run.table != "-")
            score = ChunkScorer(columns, sink.gzip_level, reader.name)
            chunks = own_chunks(reader, flags.shard, options.chunk_lines, index)
            clamped = 0
            serve = columns.score_request  # an --io-workers process asks this one to score
            with chunked.scoring(score, columns.warm_up, chunk_label, serve) as scoring:
                for chunk, out in scoring.results(chunks):
                    chunked.append(Written(out.data, out.record["lines"], chunk.data, out.record))
                    clamped += out.clamped
                    counter.update(out.record, out.too_long)
                scoring.finish()
            log_captured_graphs(columns.scorers)
            chunked.complete()
            counter.close()
            result = RescoreResult(
                output=sink.output,
                lines=counter.lines,
                distinct_sources=counter.distinct_sources,
                seconds=time.monotonic() - started,
                new_columns=len(columns.names),
                column_names=columns.names,
                signatures=columns.signatures,
                resumed_from_line=start_line,
                too_long=counter.too_long,
                scoring=options.scoring,
                clamped=clamped,
                empty_input=reader.lineno == 0,
            )
            if before_publish is not None:
                before_publish(result)
            chunked.publish(PartPlan(key, reader.lineno, counter.lines))
        finally:
            counter.close()
    return result


def _load_columns(run: RescoreRun, device) -> NewColumns:
    """The new columns, their models loaded on ``device``."""
    # 'auto' fixed here: part of the resume key
    run.options.dtype = resolve_dtype(run.options.dtype, device)
    columns = NewColumns.load(
        run.model_paths,
        run.inverse_model_paths,
        run.lm_paths,
        run.options,
        device,
        scorers=run.scorers,
    )
    log.info("device %s, dtype %s, scoring %s", device, run.options.dtype, run.options.scoring)
    return columns


def _identity(run: RescoreRun, flags: RunFlags, columns: NewColumns) -> dict:
    """What the partial output is made from (its resume key), the shard included."""
    shard = flags.shard
    identity = columns.identity(run.table)
    if shard is not None:
        identity["shard"] = [shard.index, shard.count]
        log.info(
            "shard %s: chunks i of %d lines with i %% %d == %d",
            shard,
            run.options.chunk_lines,
            shard.count,
            shard.index - 1,
        )
    if flags.output.endswith(".gz"):  # the bytes depend on the library too: a resume must match
        identity["gzip"] = compressor(run.options.gzip_level)
    return identity


def _finished(run: RescoreRun, columns: NewColumns, output: str, manifest: dict):
    """The result of a part an earlier run finished (``--resume --shard``): nothing done."""
    lines = int(manifest["part"]["lines"])
    return RescoreResult(
        output=output,
        lines=lines,
        distinct_sources=joined_runs(list(manifest["part"]["chunks"])),
        seconds=0.0,
        new_columns=len(columns.names),
        column_names=columns.names,
        signatures=columns.signatures,
        resumed_from_line=lines,
        complete_already=True,
        scoring=run.options.scoring,
    )
