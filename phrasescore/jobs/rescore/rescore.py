"""``phrasescore rescore``: stream a phrase table and append the models' scores to every line.

The job checks everything it can before any work (input, output, moses.ini, models), then reads
the table in chunks (:mod:`.chunks`), scores each chunk's new columns
(:mod:`.columns`) in this process or in ``--workers`` processes
(:mod:`phrasescore.runners.workers`), appends it to a partial output that ``--resume`` goes on
with (:mod:`.partial`), renames the output into place once complete, and writes the new
moses.ini beside it (:mod:`.ini_update`). With ``--shard`` it scores one shard and writes a
manifest (``merge-shards`` joins the parts); under torchrun every rank scores one shard and rank
0 merges them.

Two entry points: :func:`run_rescore`, the command (the moses.ini too, torchrun), and
:func:`rescore_table`, the table alone for a caller in Python (the tests, ``tools/bench-io``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from phrasescore.compression import compressor
from phrasescore.errors import InputError
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.inputs import check_files_exist
from phrasescore.files.kinds import display_name, is_pipe, is_stream_target
from phrasescore.files.locks import output_lock, remove_stale_temporaries
from phrasescore.files.outputs import check_output_path, check_output_paths
from phrasescore.files.reading import ReadPosition
from phrasescore.hardware import resolve_device, resolve_dtype
from phrasescore.jobs.rescore.chunks import (
    ChunkScorer,
    Progress,
    RawTable,
    chunk_label,
    own_chunks,
    skip_done_lines,
)
from phrasescore.jobs.rescore.columns import NewColumns, RescoreOptions
from phrasescore.jobs.rescore.ini_update import IniUpdate, default_ini_out, ini_report_lines
from phrasescore.jobs.rescore.partial import (
    PartialOutput,
    StdoutOutput,
    check_work_paths,
    partial_paths,
)
from phrasescore.runners import distributed
from phrasescore.runners.chunk_pool import frozen_heap
from phrasescore.runners.shards import (
    PHRASE_TABLE,
    Shard,
    file_sha256,
    input_identity,
    joined_runs,
    manifest_path,
    run_on_ranks,
    shard_part_path,
    write_manifest,
)
from phrasescore.runners.workers import (
    WorkerMap,
    check_io_workers,
    check_torchrun_options,
    check_workers_device,
    loading_for_workers,
)

log = logging.getLogger(__name__)

__all__ = ["RescoreOptions", "RescoreResult", "RescoreRun", "rescore_table", "run_rescore"]


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
    """What one rescoring run reads and how: everything but the output path."""

    table: str
    model_paths: list[str] = field(default_factory=list)
    options: RescoreOptions = field(default_factory=RescoreOptions)
    device: str = "auto"
    resume: bool = False
    progress: bool = True
    inverse_model_paths: list[str] = field(default_factory=list)
    lm_paths: list[str] = field(default_factory=list)
    shard: Shard | None = None
    workers: int = 1
    io_workers: int = 0
    """Processes that parse, look up ids, format and compress chunks while this process scores
    them (0: this process does everything, or the ``workers``)."""
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


@dataclass
class RescoreJobResult:
    rescore: RescoreResult
    ini_out: str | None = None
    ini_update: object | None = None

    def lines(self) -> list[str]:
        """The summary and the moses.ini written (nothing more when the output was complete)."""
        if self.rescore.complete_already:
            return self.rescore.summary_lines()
        return self.rescore.summary_lines() + ini_report_lines(self.ini_out, self.ini_update)


def default_output_path(table: str, shard: Shard | None = None) -> str:
    """``phrase-table.gz`` -> ``phrase-table.rescored.gz``; ``pt`` -> ``pt.rescored``; with
    ``--shard 2/3`` -> ``phrase-table.rescored.part-2-of-3.gz`` (each shard its own part)."""
    if table == "-":
        return "-"
    part = f".part-{shard.index}-of-{shard.count}" if shard is not None else ""
    if table.endswith(".gz"):
        return table[: -len(".gz")] + f".rescored{part}.gz"
    return table + f".rescored{part}"


def _outputs(output: str, shard: Shard | None, ini_out: str | None = None) -> dict:
    """The files a run on ``output`` writes, by option: the table, the partial output and its
    state beside it, a shard's manifest, the moses.ini."""
    if output == "-" or is_stream_target(output):
        return {"-o": output, "--ini-out": ini_out}
    partial, state = partial_paths(output)
    return {
        "-o": output,
        "-o's partial output": partial,
        "-o's partial state": state,
        "-o's manifest": manifest_path(output) if shard is not None else None,
        "--ini-out": ini_out,
    }


def _check_request(run: RescoreRun, output: str) -> None:
    """Everything about the input, output and flags that can be refused before any work."""
    table, options, resume, shard = run.table, run.options, run.resume, run.shard
    stream = is_stream_target(output)
    if shard is not None and (output == "-" or table == "-" or stream):
        raise InputError("--shard needs an input file and an output file (for the manifest)")
    check_files_exist([table])
    refuse_outputs_onto_inputs(run.inputs(), _outputs(output, shard))
    if resume and table != "-" and is_pipe(table):
        raise InputError(
            "--resume reads the table again from its start: give the file, not a pipe", table
        )
    if shard is not None and is_pipe(table):
        raise InputError("--shard reads the table again for its manifest: give the file", table)
    check_output_path(output, "output table")
    if not stream:
        check_work_paths(output, shard)
    if options.chunk_lines < 1 or options.batch_tokens < 1:
        raise InputError("chunk_lines and batch_tokens must be at least 1")
    if options.logprob:
        log.warning(
            "--logprob writes log p values: Moses takes ln of every phrase-table value, so this "
            "table is NOT for Moses (a negative value becomes NaN)"
        )


def rescore_table(
    table: str,
    model_paths: list[str],
    output: str | None = None,
    options: RescoreOptions | None = None,
    before_publish: Callable[[RescoreResult], None] | None = None,
    **settings,
) -> RescoreResult:
    """Append one column per model (and optionally the unknown-word column) to ``table``.

    Models in ``model_paths`` give p(target | source); models in ``inverse_model_paths`` were
    trained in the other direction (target language -> source language) and give
    p(source | target), the neural counterpart of the table's inverse φ(f|e); their columns
    follow the direct ones. Each CSLM of ``lm_paths`` adds p(target phrase) after those
    (:class:`~phrasescore.jobs.rescore.columns.LMPhraseColumn`: the phrase scored with
    sentence-boundary context off), then comes the unknown-word column. ``settings`` are the
    other fields of :class:`RescoreRun`.

    ``before_publish`` runs once the whole table is written but before it is renamed to
    ``output``: what it raises leaves the output unpublished (and resumable).

    With ``shard`` only that shard's chunks are scored, and a manifest is written beside the
    output (:mod:`phrasescore.runners.shards`); ``merge-shards`` puts the parts together.

    ``workers`` > 1 (CPU only): the chunks are scored in that many forked processes of one
    PyTorch thread each (:mod:`phrasescore.runners.chunk_pool`); the output bytes are those of
    one process with one thread.

    ``io_workers`` > 0 (any device): that many forked processes parse, look up ids, format and
    compress the chunks while this process scores them, the one that owns the networks (a GPU):
    same bytes as one process (:mod:`phrasescore.runners.chunk_pool`, docs/scaling.md "A GPU fed
    by every core").
    """
    run = RescoreRun(table, model_paths, options or RescoreOptions(), **settings)
    return _score_run(run, output, before_publish)


def _score_run(
    run: RescoreRun,
    output: str | None = None,
    before_publish: Callable[[RescoreResult], None] | None = None,
) -> RescoreResult:
    """:func:`rescore_table` of a :class:`RescoreRun`: what the two entry points, and each torchrun
    rank, run."""
    output = output or default_output_path(run.table, run.shard)
    _check_request(run, output)
    stream = output == "-" or is_stream_target(output)
    # one run at a time on an output: a second is refused before it loads anything
    with output_lock(output):
        if not stream:
            for path in (output, *partial_paths(output), manifest_path(output)):
                remove_stale_temporaries(path)
        # Load everything before writing anything: a bad model leaves no output behind.
        columns, device = _load_columns(run)
        identity = _run_identity(run, columns)
        if run.resume and run.shard is not None:
            done = _complete_part(run.table, output, run.shard, run.options, columns)
            if done is not None:
                return done
        if output.endswith(".gz"):  # the bytes depend on the library too: a resume must match
            identity["gzip"] = compressor(run.options.gzip_level)
        sink = (
            StdoutOutput(output, run.options.gzip_level)
            if stream
            else PartialOutput(output, identity, run.options.gzip_level)
        )
        start_line = sink.open(run.resume)
        result = _write_table(run, columns, sink, start_line, device, before_publish)
    _log_warnings(result, run.options, run.table)
    _log_result(result)
    return result


def _load_columns(run: RescoreRun):
    """(the new columns, models loaded; the device)."""
    device = resolve_device(run.device)
    check_workers_device(run.workers, device)
    check_io_workers(run.workers, run.io_workers)
    # 'auto' fixed here: part of the resume key
    run.options.dtype = resolve_dtype(run.options.dtype, device)
    forks = max(run.workers, run.io_workers + 1)
    with loading_for_workers(forks):  # loaded at one thread, to fork from
        columns = NewColumns.load(
            run.model_paths,
            run.inverse_model_paths,
            run.lm_paths,
            run.options,
            device,
            scorers=run.scorers,
        )
    log.info("device %s, dtype %s, scoring %s", device, run.options.dtype, run.options.scoring)
    return columns, device


def _run_identity(run: RescoreRun, columns: NewColumns) -> dict:
    """What the partial output is made from (its resume key), the shard included."""
    identity = columns.identity(run.table)
    if run.shard is not None:
        identity["shard"] = [run.shard.index, run.shard.count]
        log.info(
            "shard %s: chunks i of %d lines with i %% %d == %d",
            run.shard,
            run.options.chunk_lines,
            run.shard.count,
            run.shard.index - 1,
        )
    return identity


def _write_table(run: RescoreRun, columns, sink, start_line: int, device, before_publish):
    """Score the chunks left into ``sink``, complete it (a shard: its manifest), run
    ``before_publish`` and publish; on an error keep what is resumable."""
    position = ReadPosition()
    reader = RawTable(run.table, position)
    started = time.monotonic()
    options = run.options
    counter = Progress(run.progress, position, start_line, started, options.max_phrase_length)
    records: list[dict] = []  # a shard's chunk records (shards.chunk_record), for its manifest
    index, input_crc = skip_done_lines(
        reader, counter, start_line, run.shard, options, run.table, records
    )
    if start_line:  # standard input: the CRC-32 of the lines read again is the only proof
        sink.check_input(input_crc, counter.close, provable=run.table != "-")
    score = ChunkScorer(columns, sink.gzip_level, reader.name)
    again = "run again" if isinstance(sink, StdoutOutput) else "rerun with --resume"
    if run.io_workers:  # they parse and write; this process scores (columns.score_request)
        scoring = WorkerMap(
            score, run.io_workers, columns.warm_up, chunk_label, again, columns.score_request
        )
    else:
        scoring = WorkerMap(score, run.workers, columns.warm_up, chunk_label, again)
    try:
        with scoring, frozen_heap():
            chunks = own_chunks(reader, run.shard, options.chunk_lines, index)
            clamped = _write_chunks(scoring.results(chunks), sink, counter, run.shard, records)
            scoring.finish()
        sink.complete()
        counter.close()
        if run.shard is not None:
            write_manifest(
                sink.output,
                sink.path,
                run.shard,
                run.table,
                reader.lineno,
                options.chunk_lines,
                counter.lines,
                columns.job(),
                device=device.type,
                chunks=records,
            )
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
        sink.publish()
    except InputError:
        # a bad input line: resuming cannot help, so leave nothing behind
        sink.discard()
        raise
    except BaseException:
        sink.close_incomplete()
        raise
    finally:
        counter.close()
    return result


def _write_chunks(done, sink, counter: Progress, shard: Shard | None, records: list) -> int:
    """Append the scored chunks ``done`` (``(chunk, ChunkOutput)`` in input order) to ``sink``
    (a shard: each one's record appended to ``records``); returns the model scores clamped."""
    clamped = 0
    for chunk, out in done:
        sink.append_chunk(out.data, out.record["lines"], chunk.data)
        clamped += out.clamped
        counter.update(out.record, out.too_long)
        if shard is not None:
            records.append(out.record)
    return clamped


def _log_warnings(result: RescoreResult, options: RescoreOptions, table: str) -> None:
    """An empty table, pairs given the floor value unscored, model scores clamped."""
    if result.empty_input:
        log.warning(
            "%s is empty: no line to rescore, the output %s is empty too",
            display_name(table),
            "<stdout>" if result.output == "-" else result.output,
        )
    if result.too_long:
        log.warning(
            "%d pairs have a phrase of more than %d tokens (--max-phrase-length): given the "
            "floor value exp(-100) without scoring",
            result.too_long,
            options.max_phrase_length,
        )
    if result.clamped:
        log.info(
            "self-normalized scoring: %d model score(s) had log p > 0 (sum of target logits), "
            "clamped to p = 1",
            result.clamped,
        )


def _complete_part(
    table: str, output: str, shard: Shard, options: RescoreOptions, columns: NewColumns
) -> RescoreResult | None:
    """``--resume --shard``: the result of a part finished by an earlier run (the part and its
    manifest, which matches this job, are complete), or None when there is work to do. A part
    of another input, model or flags is refused; one that does not match its own manifest
    (changed since, or a run stopped between the two) is scored again."""
    path = manifest_path(output)
    if not (os.path.isfile(output) and os.path.isfile(path)):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
        part = manifest["part"]
        same = (
            manifest.get("kind") == PHRASE_TABLE
            and [manifest.get("shard"), manifest.get("of")] == [shard.index, shard.count]
            and manifest["plan"]["chunk_lines"] == options.chunk_lines
            and manifest["job"] == columns.job()
            and manifest["input"] == input_identity(table, manifest["input"]["lines"])
        )
        records = list(part["chunks"])
        lines = int(part["lines"])
        size, digest = int(part["size"]), str(part["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"unreadable manifest ({type(exc).__name__}: {exc}); run without --resume to score "
            "the part again",
            path,
        ) from None
    if not same:
        raise InputError(
            "cannot resume: a finished part of another input, shard, model or flags is here "
            "(run without --resume to replace it)",
            output,
        )
    if os.path.getsize(output) != size or file_sha256(output) != digest:
        log.warning("%s does not match its manifest: scoring the part again", output)
        return None
    log.info(
        "shard %s: %s is complete already (its manifest matches): nothing to do", shard, output
    )
    return RescoreResult(
        output=output,
        lines=lines,
        distinct_sources=joined_runs(records),
        seconds=0.0,
        new_columns=len(columns.names),
        column_names=columns.names,
        signatures=columns.signatures,
        resumed_from_line=lines,
        complete_already=True,
        scoring=options.scoring,
    )


def _log_result(result: RescoreResult) -> None:
    """The result in the debug log (the command prints the one summary line)."""
    names = result.column_names
    log.debug(
        "rescored %d lines (%d distinct sources%s) in %.1f s, %.0f pairs/s: %s (+%d column%s, "
        "models %s)",
        result.lines,
        result.distinct_sources,
        f", resumed after line {result.resumed_from_line}" if result.resumed_from_line else "",
        result.seconds,
        result.pairs_per_second,
        display_name(result.output) if result.output != "-" else "<stdout>",
        len(names),
        "" if len(names) == 1 else "s",
        ", ".join(result.signatures),
    )


def run_rescore(
    table: str,
    model_paths: list[str],
    output: str | None,
    options: RescoreOptions,
    device: str = "auto",
    resume: bool = False,
    moses_ini: str | None = None,
    ini_out: str | None = None,
    ini_table: str | None = None,
    weight: float = 0.2,
    progress: bool = True,
    inverse_model_paths: list[str] | None = None,
    lm_paths: list[str] | None = None,
    shard: Shard | None = None,
    workers: int = 1,
    io_workers: int = 0,
) -> RescoreJobResult:
    """``phrasescore rescore``: check the moses.ini first, rescore, then write the new ini.

    The new ini declares one more feature and weight per added column, points at the new
    table, and carries a comment with the models' signatures, so that a score can be traced.

    Under torchrun (``WORLD_SIZE`` > 1) each rank scores one shard into a hidden part beside
    the output and rank 0 merges the parts after a barrier (:func:`_run_torchrun`).
    """
    run = RescoreRun(
        table,
        model_paths,
        options,
        device,
        resume,
        progress,
        inverse_model_paths=inverse_model_paths,
        lm_paths=lm_paths,
        shard=shard,
        workers=workers,
        io_workers=io_workers,
    )
    output = output or default_output_path(table, shard)
    launch = distributed.from_env()
    check_torchrun_options(launch, shard, workers)
    ini = _prepare_ini(run, output, moses_ini, ini_out, ini_table, weight)
    try:
        if launch is not None:
            result = _run_torchrun(launch, run, output)
            if not launch.is_main:
                return RescoreJobResult(result)
            if ini is not None:
                ini.before_publish(result)
        else:
            result = _score_run(run, output, ini.before_publish if ini is not None else None)
    except BaseException:
        if ini is not None:
            ini.discard()
        raise
    if ini is None:
        return RescoreJobResult(result)
    return RescoreJobResult(result, ini.ini_out, ini.publish())


def _prepare_ini(
    run: RescoreRun, output: str, moses_ini, ini_out, ini_table, weight: float
) -> IniUpdate | None:
    """The moses.ini update, checked before any scoring (None without ``moses_ini``).

    The table and its ini are one result: both locations are checked before any scoring, both
    are written under temporary names, and both renamed into place only once both are complete.
    """
    if moses_ini:
        if output == "-" or is_stream_target(output):
            raise InputError(
                "--moses-ini needs an output file for the ini to name, not standard output, a "
                "named pipe or a device"
            )
        if run.shard is not None:
            raise InputError(
                "with --shard give --moses-ini to merge-shards, which writes the table"
            )
        ini_out = ini_out or default_ini_out(moses_ini)
    else:
        ini_out = None
    refuse_outputs_onto_inputs(
        {**run.inputs(), "--moses-ini": moses_ini}, _outputs(output, run.shard, ini_out)
    )
    check_output_paths({"output table": output, "moses.ini": ini_out})
    if not moses_ini:
        return None
    new_table = os.path.abspath(output)
    table = ini_table or run.table
    return IniUpdate(moses_ini, table, new_table, run.new_columns, weight, ini_out)


def _run_torchrun(launch, run: RescoreRun, output: str) -> RescoreResult:
    """One shard per rank, a barrier, then rank 0 merges and removes the parts
    (:func:`phrasescore.runners.shards.run_on_ranks`).

    ``--resume`` goes on with each rank's partial part; a part that was finished (a run stopped
    during the merge) is kept as it is.
    """
    check_files_exist([run.table])
    # every rank reads the table (not a pipe or stdin) and writes a part beside the output
    if output == "-" or is_stream_target(output) or is_pipe(run.table):
        raise InputError("under torchrun give an input file and an output file")
    for k in range(1, launch.world_size + 1):  # every rank refuses what is in any rank's way
        shard = Shard(k, launch.world_size)
        part = shard_part_path(output, shard)
        check_output_path(part, "part")
        check_work_paths(part, shard)
    started = time.monotonic()
    result, merged, (too_long, clamped) = run_on_ranks(
        launch,
        run.device,
        output,
        _RankPart(run, launch.is_main),
        keep_finished=run.resume,
        sums=_rank_sums,
    )
    if merged is None:
        return result
    result = RescoreResult(
        output=output,
        lines=merged.lines,
        # from the parts' chunk records: a source group cut by a chunk edge counts once
        distinct_sources=merged.groups,
        seconds=time.monotonic() - started,
        new_columns=merged.new_columns,
        column_names=merged.column_names,
        signatures=merged.manifest["job"]["models"],
        too_long=too_long,
        scoring=merged.manifest["job"]["options"].get("scoring", "exact"),
        clamped=clamped,
        empty_input=merged.lines == 0,
    )
    log.info(
        "torchrun: %d ranks rescored %d lines in %.1f s, %.0f pairs/s",
        launch.world_size,
        result.lines,
        result.seconds,
        result.pairs_per_second,
    )
    return result


@dataclass
class _RankPart:
    """What a torchrun rank runs: its shard of ``run`` into its part (the progress bar on rank 0
    only)."""

    run: RescoreRun
    is_main: bool

    def __call__(self, part: str, device: str, shard: Shard) -> RescoreResult:
        progress = self.run.progress and self.is_main
        return _score_run(replace(self.run, device=device, shard=shard, progress=progress), part)


def _rank_sums(result: RescoreResult | None) -> list[int]:
    """What the ranks add up for the summary: pairs over the length limit, scores clamped."""
    return [result.too_long, result.clamped] if result else [0, 0]
