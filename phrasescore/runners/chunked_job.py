"""The chunked job that ``rescore`` and ``nbest`` both are: one runner, driven by the job.

Each job reads its input in chunks, scores every chunk on its own (here, in ``--workers`` forked
processes, or in this process fed by ``--io-workers``) and appends the scored chunks to its
output in input order. :class:`ChunkedRun` is everything such a run does the same way whatever
it scores; the job calls it step by step, top to bottom::

    with ChunkedRun(flags) as run:              # one run at a time on the output; stale temporaries removed
        device = run.device()                   # --device, --workers and --io-workers checked together
        with run.loading():                     # one PyTorch thread when workers will fork
            ...                                 # the job loads its models
        if run.finished_part(job_key) is not None:
            ...                                 # --resume --shard: the part is done already
        start_line = run.open(sink)             # a PartialOutput (resumable) or a stream
        ...                                     # the job reads past the lines done, then
        run.check_input(input_crc)              # proves them the input they were made from
        with run.scoring(score) as scoring:     # WorkerMap: here or in forked workers
            for chunk, scored in scoring.results(chunks):
                run.append(...)                 # the chunk's bytes, in input order
            scoring.finish()
        run.complete()
        run.publish(part_plan)                  # a shard's manifest, then the output's name

Leaving the block with an error keeps what ``--resume`` needs (the partial output and its state),
except after a bad input line met while scoring (:class:`~phrasescore.errors.InputError`), which
resuming cannot help: then nothing is left behind.

Under torchrun every rank runs the job on one shard into a hidden part and rank 0 merges the
parts (:class:`RankRun`, a block around the job's run of its shard).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from typing import NamedTuple

from phrasescore.errors import InputError
from phrasescore.files import (
    check_files_exist,
    check_output_path,
    display_name,
    is_pipe,
    is_stream_target,
    output_lock,
    remove_stale_temporaries,
)
from phrasescore.hardware import resolve_device
from phrasescore.runners import distributed
from phrasescore.runners.chunk_pool import frozen_heap
from phrasescore.runners.merge import MergeResult, merge_shards
from phrasescore.runners.partial import check_work_paths, partial_paths
from phrasescore.runners.shards import (
    Shard,
    file_sha256,
    input_identity,
    manifest_path,
    shard_part_path,
    write_manifest,
)
from phrasescore.runners.workers import (
    WorkerMap,
    check_io_workers,
    check_workers_device,
    loading_for_workers,
)

log = logging.getLogger(__name__)


@dataclass
class RunFlags:
    """How a chunked job runs: the flags ``rescore`` and ``nbest`` share."""

    output: str
    device: str = "auto"
    resume: bool = False
    progress: bool = True
    shard: Shard | None = None
    workers: int = 1
    io_workers: int = 0
    """Processes that parse and write while this process scores (0: this process does it all,
    or the ``workers``)."""

    @property
    def stream(self) -> bool:
        """Standard output, a named pipe or a device: written as a stream, nothing to resume."""
        return self.output == "-" or is_stream_target(self.output)


class Written(NamedTuple):
    """One scored chunk as the job writes it."""

    data: bytes
    """Its bytes in the output."""
    lines: int
    """Its lines in the output (what ``--resume`` counts)."""
    source: bytes = b""
    """The input bytes it was made from (their CRC-32 proves a resume's input the same)."""
    record: dict | None = None
    """:func:`~.shards.chunk_record` of the chunk, for a shard's manifest."""
    totals: dict | None = None
    """The job's running totals after the chunk, kept with the resume state (a resume goes on
    from them: :attr:`~.partial.PartialOutput.totals`)."""


class PartKey(NamedTuple):
    """What a shard's part is made from, as its manifest records it: what a finished part must
    match to be kept (``--resume --shard``), and what a new part's manifest says."""

    kind: str
    """:data:`~.shards.PHRASE_TABLE` or :data:`~.shards.NBEST`."""
    input: str
    """The input file the chunks are read from."""
    chunk_lines: int
    job: dict
    """The models and the flags that change the bytes (what every part of one job shares)."""


class PartPlan(NamedTuple):
    """A part's manifest as a job knows it once every chunk is written."""

    key: PartKey
    input_lines: int
    part_lines: int
    chunk_sizes: list[int] | None = None
    """The lines of every input chunk where chunks are cut at groups (n-best lists)."""


class ChunkedRun(AbstractContextManager):
    """One run of a chunked job into ``flags.output`` (see the module docstring)."""

    def __init__(self, flags: RunFlags):
        self.flags = flags
        self.sink = None
        self.records: list[dict] = []
        """A shard's chunk records (:func:`~.shards.chunk_record`), for its manifest: those a
        resume read again (the job appends them) and those written."""
        self._scoring_started = False
        self._device_type = "cpu"
        self._stack = ExitStack()

    def __enter__(self) -> ChunkedRun:
        # one run at a time on an output: a second is refused before it loads anything
        self._stack.enter_context(output_lock(self.flags.output))
        if not self.flags.stream:  # of a run killed before (kill -9)
            for path in (self.flags.output, *partial_paths(self.flags.output)):
                remove_stale_temporaries(path)
            remove_stale_temporaries(manifest_path(self.flags.output))
        return self

    def device(self):
        """The device, after ``--workers`` and ``--io-workers`` are checked against it."""
        device = resolve_device(self.flags.device)
        check_workers_device(self.flags.workers, device)
        check_io_workers(self.flags.workers, self.flags.io_workers)
        self._device_type = device.type  # what a shard's manifest records
        return device

    def loading(self) -> AbstractContextManager:
        """Where the job loads its models: at one PyTorch thread when workers will fork."""
        return loading_for_workers(max(self.flags.workers, self.flags.io_workers + 1))

    def finished_part(self, key: PartKey) -> dict | None:
        """``--resume --shard``: the manifest of a part an earlier run finished for this job,
        or None when there is work to do (:func:`finished_part`)."""
        if not (self.flags.resume and self.flags.shard is not None):
            return None
        return finished_part(key, self.flags.output, self.flags.shard)

    def open(self, sink) -> int:
        """Open the output ``sink``; the output lines an earlier run did (``--resume``)."""
        self.sink = sink
        return sink.open(self.flags.resume)

    def resumed_totals(self) -> dict:
        """The job's running totals after the chunks an earlier run wrote (:attr:`Written.
        totals`; empty when nothing was resumed)."""
        return dict(self.sink.totals or {})

    def check_input(self, input_crc: int, before_refusal=None, provable: bool = True) -> None:
        """Refuse a resume whose input lines read again (their CRC-32) are not those the
        partial output was made from (:meth:`~.partial.PartialOutput.check_input`)."""
        self.sink.check_input(input_crc, before_refusal, provable=provable)

    def scoring(
        self, score, warm_up=None, label=None, serve=None
    ) -> AbstractContextManager[WorkerMap]:
        """The chunks' map over ``score``: in this process, in ``--workers`` forked processes,
        or fed by ``--io-workers`` processes whose requests ``serve`` answers here
        (:class:`~.workers.WorkerMap`); the heap of what is loaded kept out of the collector's
        scans meanwhile (:func:`~.chunk_pool.frozen_heap`)."""
        self._scoring_started = True
        flags = self.flags
        again = "rerun with --resume" if self.sink.resumable else "run again"
        if flags.io_workers:  # they parse and write; this process scores (serve)
            scoring = WorkerMap(score, flags.io_workers, warm_up, label, again, serve)
        else:
            scoring = WorkerMap(score, flags.workers, warm_up, label, again)
        return _frozen_heap_map(scoring)

    def append(self, written: Written | None) -> None:
        """Append one chunk's bytes to the output (a shard: its record to the manifest's)."""
        if written is None:
            return
        self.sink.append_chunk(written.data, written.lines, written.source, written.totals)
        if self.flags.shard is not None and written.record is not None:
            self.records.append(written.record)

    def complete(self) -> None:
        """Every chunk is written: the output is complete, not yet under its name."""
        self.sink.complete()

    def publish(self, plan: PartPlan | None = None) -> None:
        """Give the output its name; a shard's manifest (of ``plan``) is written just before."""
        manifest = None
        if self.flags.shard is not None:
            manifest = _PartManifest(
                plan, self.flags.shard, self.records, self.flags.output, self._device_type
            )
        self.sink.publish(manifest)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc is not None and self.sink is not None:
                if isinstance(exc, InputError) and self._scoring_started:
                    self.sink.discard()  # a bad input line: resuming cannot help
                else:
                    self.sink.close_incomplete()  # kept for --resume
        finally:
            self._stack.close()


@contextlib.contextmanager
def _frozen_heap_map(scoring: WorkerMap) -> Iterator[WorkerMap]:
    """A :class:`~.workers.WorkerMap` run inside :func:`~.chunk_pool.frozen_heap`."""
    with scoring, frozen_heap():
        yield scoring


@dataclass
class _PartManifest:
    """A shard's manifest, written beside its part just before the part takes its name."""

    plan: PartPlan
    shard: Shard
    records: list[dict]
    output: str
    device: str

    def __call__(self, written: str) -> None:
        plan, key = self.plan, self.plan.key
        write_manifest(
            self.output,
            written,
            self.shard,
            key.input,
            plan.input_lines,
            key.chunk_lines,
            plan.part_lines,
            key.job,
            device=self.device,
            kind=key.kind,
            chunk_sizes=plan.chunk_sizes,
            chunks=self.records,
        )


def finished_part(key: PartKey, output: str, shard: Shard) -> dict | None:
    """The manifest of a part finished by an earlier run (the part and its manifest, which
    matches ``key``, are complete), or None when there is work to do. A part of another input,
    model or flags is refused; one that does not match its own manifest (changed since, or a
    run stopped between the two) is scored again."""
    path = manifest_path(output)
    if not (os.path.isfile(output) and os.path.isfile(path)):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
        part = manifest["part"]
        same = (
            manifest.get("kind") == key.kind
            and [manifest.get("shard"), manifest.get("of")] == [shard.index, shard.count]
            and manifest["plan"]["chunk_lines"] == key.chunk_lines
            and manifest["job"] == key.job
            and manifest["input"] == input_identity(key.input, manifest["input"]["lines"])
        )
        list(part["chunks"])
        int(part["lines"])
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
    return manifest


# ---------------------------------------------------------------------------- torchrun
class RankRun(AbstractContextManager):
    """This rank's share of a torchrun launch, as a block around the job's run of its shard::

        with RankRun(launch, flags, table) as rank:
            result = None if rank.finished else run_the_job(rank.flags)
            merged, totals = rank.merge(counts_of(result))

    Rank r runs shard r+1 of the world size into a hidden part beside the output
    (:func:`~.shards.shard_part_path`; ``rank.flags``: the part, this rank's device, the
    progress bar on rank 0 only); :meth:`merge` adds up the ranks' counts, waits for every rank,
    and rank 0 merges the parts into the output and removes them. With ``--resume`` each rank
    goes on with its partial part, and a part finished by an earlier run (stopped during the
    merge) is kept as it is (``rank.finished``).

    Every rank reads the input ``input_path`` (a file, not a pipe or standard input) and writes
    a part beside the output (a file): what is in any rank's way is refused on every rank before
    any work. The process group (gloo: the shards exchange no tensors) is left at the end.
    """

    def __init__(self, launch, flags: RunFlags, input_path: str):
        check_files_exist([input_path])
        if flags.stream or is_pipe(input_path):
            raise InputError("under torchrun give an input file and an output file")
        for k in range(1, launch.world_size + 1):
            shard = Shard(k, launch.world_size)
            part = shard_part_path(flags.output, shard)
            check_output_path(part, "part")
            check_work_paths(part, shard)
        self.launch = launch
        self.output = flags.output
        self.shard = Shard(launch.rank + 1, launch.world_size)
        self._flags = flags
        self.flags: RunFlags | None = None
        self.finished = False

    def __enter__(self) -> RankRun:
        launch, shard = self.launch, self.shard
        dev = distributed.rank_device(launch, self._flags.device)
        distributed.init(launch, dev, backend="gloo")
        part = shard_part_path(self.output, shard)
        progress = self._flags.progress and launch.is_main
        self.flags = replace(
            self._flags, output=part, device=str(dev), shard=shard, progress=progress
        )
        self.finished = self._flags.resume and os.path.exists(manifest_path(part))
        if self.finished:
            log.info("shard %s: finished in an earlier run (%s)", shard, display_name(part))
        return self

    def merge(self, counts: list[int]) -> tuple[MergeResult | None, list[int]]:
        """After this rank's part: the sums of ``counts`` over the ranks (a list of the same
        length on every rank) and, on rank 0, the merge of the parts into the output."""
        totals = [distributed.all_sum(value) for value in counts]
        distributed.barrier()
        merged = None
        if self.launch.is_main:
            count = self.shard.count
            parts = [shard_part_path(self.output, Shard(k, count)) for k in range(1, count + 1)]
            merged = merge_shards(parts, self.output)
            for path in parts:
                os.unlink(manifest_path(path))
                os.unlink(path)
        distributed.barrier()
        return merged, totals

    def __exit__(self, exc_type, exc, tb) -> None:
        distributed.shutdown()
