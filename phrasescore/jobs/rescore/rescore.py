"""``phrasescore rescore``: stream a phrase table and append the models' scores to every line.

The job checks everything it can before any work (input, output, moses.ini, models), then reads
the table in chunks (:mod:`.chunks`), scores each chunk's new columns
(:mod:`.columns`) in this process or in ``--workers`` processes
(:mod:`phrasescore.runners.workers`), appends it to a partial output that ``--resume`` goes on
with (:mod:`phrasescore.runners.partial`), renames the output into place once complete, and writes the new
moses.ini beside it (:mod:`.ini_update`). With ``--shard`` it scores one shard and writes a
manifest (``merge-shards`` joins the parts); under torchrun every rank scores one shard and rank
0 merges them.

Two entry points: :func:`run_rescore`, the command (the moses.ini too, torchrun), and
:func:`rescore_table`, the table alone for a caller in Python (the tests, ``tools/bench-io``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from phrasescore.errors import InputError
from phrasescore.files import (
    check_files_exist,
    check_output_path,
    check_output_paths,
    display_name,
    is_pipe,
    is_stream_target,
    refuse_outputs_onto_inputs,
)
from phrasescore.jobs.rescore.columns import RescoreOptions
from phrasescore.jobs.rescore.ini_update import IniUpdate, default_ini_out, ini_report_lines
from phrasescore.jobs.rescore.job import RescoreResult, RescoreRun, score_table
from phrasescore.runners import distributed
from phrasescore.runners.chunked_job import RankRun, RunFlags
from phrasescore.runners.partial import check_resume_input, check_work_paths, run_outputs
from phrasescore.runners.shards import Shard
from phrasescore.runners.workers import check_torchrun_options

log = logging.getLogger(__name__)

__all__ = ["RescoreOptions", "RescoreResult", "RescoreRun", "rescore_table", "run_rescore"]


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
    return {**run_outputs(output, shard), "--ini-out": ini_out}


def _check_request(run: RescoreRun, flags: RunFlags) -> None:
    """Everything about the input, output and flags that can be refused before any work."""
    table, options, shard, output = run.table, run.options, flags.shard, flags.output
    stream = is_stream_target(output)
    if shard is not None and (output == "-" or table == "-" or stream):
        raise InputError("--shard needs an input file and an output file (for the manifest)")
    check_files_exist([table])
    refuse_outputs_onto_inputs(run.inputs(), _outputs(output, shard))
    if flags.resume:
        check_resume_input(table, "table")
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


_FLAG_NAMES = frozenset(f.name for f in fields(RunFlags)) - {"output"}


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
    other fields of :class:`RescoreRun` and those of
    :class:`~phrasescore.runners.chunked_job.RunFlags` (``device``, ``resume``, ``progress``,
    ``shard``, ``workers``, ``io_workers``).

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
    flags = {key: settings.pop(key) for key in list(settings) if key in _FLAG_NAMES}
    run = RescoreRun(table, model_paths, options or RescoreOptions(), **settings)
    shard = flags.get("shard")
    flags = RunFlags(output or default_output_path(table, shard), **{"device": "auto", **flags})
    return _score_run(run, flags, before_publish)


def _score_run(
    run: RescoreRun,
    flags: RunFlags,
    before_publish: Callable[[RescoreResult], None] | None = None,
) -> RescoreResult:
    """:func:`rescore_table` of a :class:`RescoreRun`: what the two entry points, and each
    torchrun rank, run (:func:`~phrasescore.jobs.rescore.job.score_table`)."""
    _check_request(run, flags)
    result = score_table(run, flags, before_publish)
    if not result.complete_already:
        _log_warnings(result, run.options, run.table)
        _log_result(result)
    return result


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
        table, model_paths, options, inverse_model_paths=inverse_model_paths, lm_paths=lm_paths
    )
    output = output or default_output_path(table, shard)
    flags = RunFlags(output, device, resume, progress, shard, workers, io_workers)
    launch = distributed.from_env()
    check_torchrun_options(launch, shard, workers)
    ini = _prepare_ini(run, shard, output, moses_ini, ini_out, ini_table, weight)
    try:
        if launch is not None:
            result = _run_torchrun(launch, run, flags)
            if not launch.is_main:
                return RescoreJobResult(result)
            if ini is not None:
                ini.before_publish(result)
        else:
            result = _score_run(run, flags, ini.before_publish if ini is not None else None)
    except BaseException:
        if ini is not None:
            ini.discard()
        raise
    if ini is None:
        return RescoreJobResult(result)
    return RescoreJobResult(result, ini.ini_out, ini.publish())


def _prepare_ini(
    run: RescoreRun, shard: Shard | None, output: str, moses_ini, ini_out, ini_table, weight: float
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
        if shard is not None:
            raise InputError(
                "with --shard give --moses-ini to merge-shards, which writes the table"
            )
        ini_out = ini_out or default_ini_out(moses_ini)
    else:
        ini_out = None
    refuse_outputs_onto_inputs(
        {**run.inputs(), "--moses-ini": moses_ini}, _outputs(output, shard, ini_out)
    )
    check_output_paths({"output table": output, "moses.ini": ini_out})
    if not moses_ini:
        return None
    new_table = os.path.abspath(output)
    table = ini_table or run.table
    return IniUpdate(moses_ini, table, new_table, run.new_columns, weight, ini_out)


def _run_torchrun(launch, run: RescoreRun, flags: RunFlags) -> RescoreResult:
    """One shard per rank, a barrier, then rank 0 merges and removes the parts
    (:class:`~phrasescore.runners.chunked_job.RankRun`)."""
    started = time.monotonic()
    with RankRun(launch, flags, run.table) as rank:
        result = None if rank.finished else _score_run(run, rank.flags)
        merged, (too_long, clamped) = rank.merge(_rank_sums(result))
    if merged is None:
        return result
    result = RescoreResult(
        output=flags.output,
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


def _rank_sums(result: RescoreResult | None) -> list[int]:
    """What the ranks add up for the summary: pairs over the length limit, scores clamped."""
    return [result.too_long, result.clamped] if result else [0, 0]
