"""The rescoring job: stream a phrase table and append the models' scores to every line.

For each input line, exactly one output line in the same order, with only the score field
changed: the new values are appended after the existing scores (``phrasescore.moses``).

Per model, the new column holds p(target | source) = exp(max(log p, -100)) — a probability,
because Moses takes ln of every value it loads and floors it at -100. ``normalize`` writes the
per-token geometric mean exp(log p / n) instead (n target tokens, end-of-sequence included),
``logprob`` the raw log p for consumers other than Moses. ``unk_column`` appends
exp(-(unknown source words + unknown target words)), the unknown-word feature of Cho et al. §4.2
(counted with the first model's vocabularies).

Chunks and resume
-----------------
The table is read in chunks of ``chunk_lines`` lines. Each chunk is scored (distinct sources
encoded once, targets batched by length: ``phrasescore.engine.scoring``), formatted and appended to a
partial file next to the output (``.NAME.partial``; for a ``.gz`` output every chunk is one
complete gzip member, and a file of several members is a valid gzip file that zlib, Moses and
``zcat`` read as one stream). After each chunk the partial file is synced and a small JSON state
file (``.NAME.partial.json``) records the lines and bytes done and the size and CRC-32 of the last
chunk. Only when the whole table was written is the partial file renamed to the output name.
``resume`` checks the partial file against its state (at least as many bytes, the last chunk's
CRC-32), truncates it to the last recorded chunk and goes on from the next input line, so the
result is byte-identical to an uninterrupted run with the same flags. With nothing to resume it
starts from the beginning; a ``--shard`` part that is complete with its manifest is left as it is.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple

import numpy as np

from phrasescore import __version__
from phrasescore.bundle import TrainedLM, TrainedModel, load_lm, load_model
from phrasescore.engine.lm_scoring import LMScorer
from phrasescore.engine.scoring import (
    SELF_NORMALIZED,
    PairScorer,
    ScoredPairs,
    check_scoring,
    phrase_tokens,
)
from phrasescore.errors import InputError, RunStopped
from phrasescore.files import (
    DISK_ERRORS,
    AtomicOutput,
    ReadPosition,
    StagedFile,
    check_files_exist,
    check_output_path,
    check_output_paths,
    decode_lines,
    disk_errors,
    display_name,
    gzip_writer,
    is_pipe,
    iter_lines,
    iter_raw_lines,
)
from phrasescore.hardware import resolve_device, resolve_dtype
from phrasescore.moses.ini import update_moses_ini_text
from phrasescore.moses.phrase_table import (
    PhraseTableEntry,
    format_entry,
    format_probability,
    parse_phrase_table_lines,
    probability_from_logprob,
)
from phrasescore.progress import progress_bar
from phrasescore.runners import distributed
from phrasescore.runners.chunk_pool import ChunkPool, WorkerDied, single_threaded_parent
from phrasescore.runners.shards import (
    PHRASE_TABLE,
    Shard,
    check_parts,
    chunk_record,
    file_sha256,
    input_identity,
    joined_runs,
    manifest_path,
    merge_shards,
    run_on_ranks,
    shard_part_path,
    write_manifest,
)

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

    def key(self) -> dict:
        return dict(self.__dict__)


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

    @property
    def pairs_per_second(self) -> float:
        return (self.lines - self.resumed_from_line) / max(self.seconds, 1e-9)


def default_output_path(table: str, shard: Shard | None = None) -> str:
    """``phrase-table.gz`` -> ``phrase-table.rescored.gz``; ``pt`` -> ``pt.rescored``; with
    ``--shard 2/3`` -> ``phrase-table.rescored.part-2-of-3.gz`` (each shard its own part)."""
    if table == "-":
        return "-"
    part = f".part-{shard.index}-of-{shard.count}" if shard is not None else ""
    if table.endswith(".gz"):
        return table[: -len(".gz")] + f".rescored{part}.gz"
    return table + f".rescored{part}"


def is_too_long(source: str, target: str, limit: int) -> bool:
    """Whether a pair has a phrase of more than ``limit`` tokens (never given to a model)."""
    return len(source.split()) > limit or len(target.split()) > limit


def too_long_pairs(sources, targets, limit: int) -> np.ndarray:
    """:func:`is_too_long` for each pair of a block."""
    return np.array(
        [is_too_long(s, t, limit) for s, t in zip(sources, targets, strict=True)], dtype=bool
    )


def score_within_limit(scorer, sources, targets, too_long: np.ndarray):
    """Score the pairs that are not too long; the others get log p = LOGPROB_FLOOR (Moses' own
    floor, -100), so that time per line stays bounded and no line is lost."""
    if not too_long.any():
        return scorer.score_phrases(sources, targets)
    keep = np.flatnonzero(~too_long)
    part = scorer.score_phrases([sources[i] for i in keep], [targets[i] for i in keep])
    model = scorer.model
    n = len(sources)
    logprob = np.full(n, LOGPROB_FLOOR)
    eos = 1 if scorer.include_eos else 0  # counted as the scorer counts (only --normalize uses it)
    n_tokens = np.array([len(t.split()) + eos for t in targets], dtype=np.int64)
    src_unk = np.array(
        [model.src_vocab.count_unknown(phrase_tokens(model.src_text, s)) for s in sources],
        dtype=np.int64,
    )
    tgt_unk = np.array(
        [model.tgt_vocab.count_unknown(phrase_tokens(model.tgt_text, t)) for t in targets],
        dtype=np.int64,
    )
    logprob[keep], n_tokens[keep] = part.logprob, part.n_tokens
    src_unk[keep], tgt_unk[keep] = part.src_unknown, part.tgt_unknown
    return ScoredPairs(logprob, n_tokens, src_unk, tgt_unk)


def floor_value(logprob: bool = False) -> str:
    """The value of a pair that is not scored: exp(-100), or -100 with ``logprob``."""
    if logprob:
        return repr(LOGPROB_FLOOR)
    return format_probability(probability_from_logprob(LOGPROB_FLOOR))


def lm_values_within_limit(lm_column, sources, targets, too_long: np.ndarray) -> list[str]:
    """A CSLM column: pairs marked ``too_long`` get the floor value unscored."""
    if not too_long.any():
        return lm_column.values(sources, targets)
    keep = np.flatnonzero(~too_long)
    scored = iter(lm_column.values([sources[i] for i in keep], [targets[i] for i in keep]))
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
        return [repr(float(v)) for v in np.maximum(scored.logprob, LOGPROB_FLOOR)]
    if options.normalize:
        per_token = np.maximum(scored.logprob, LOGPROB_FLOOR) / scored.n_tokens
        return [format_probability(probability_from_logprob(float(v))) for v in per_token]
    return [format_probability(probability_from_logprob(float(v))) for v in scored.logprob]


def unknown_values(scored) -> list[str]:
    counts = scored.src_unknown + scored.tgt_unknown
    return [format_probability(probability_from_logprob(-float(c))) for c in counts]


def chunk_bytes(text: str, compress: bool) -> bytes:
    """A chunk's output lines as written: UTF-8, and for a ``.gz`` output one complete gzip
    member (a file of members is one valid gzip stream)."""
    data = text.encode("utf-8")
    if not compress:
        return data
    buffer = io.BytesIO()
    with gzip_writer(buffer) as gz:
        gz.write(data)
    return buffer.getvalue()


@dataclass
class ChunkOutput:
    """What scoring one chunk gives: its bytes and the model scores it clamped (``--scoring
    self-normalized``; counted here because a worker process's scorers are not the parent's)."""

    data: bytes
    clamped: int
    record: dict
    """:func:`~phrasescore.runners.shards.chunk_record`: lines, runs of one source, first/last source."""
    too_long: int
    """Pairs with a phrase over ``max_phrase_length`` tokens (given the floor value)."""


def partial_paths(output: str) -> tuple[str, str]:
    """The hidden partial file beside ``output`` and its JSON state (``--resume``)."""
    directory, name = os.path.split(os.path.abspath(output))
    partial = os.path.join(directory, f".{name}.partial")
    return partial, partial + ".json"


def check_work_paths(output: str, shard: Shard | None = None) -> None:
    """Refuse, before any work, a directory where the run will write a file of its own beside
    ``output``: the partial file, its state, a shard's manifest."""
    if output == "-":
        return
    partial, state = partial_paths(output)
    paths = {partial: "partial output", state: "partial output's state"}
    if shard is not None:
        paths[manifest_path(output)] = "part's manifest"
    for path, what in paths.items():
        if os.path.isdir(path):
            raise InputError(f"is a directory where the {what} goes: remove it", path)


class _PartialOutput:
    """The partial output file and its JSON state (see the module docstring)."""

    def __init__(self, output: str, identity: dict):
        self.output = output
        self.path, self.state_path = partial_paths(output)
        self.identity = identity
        self.compress = output.endswith(".gz")
        self.lines_done = 0
        self.bytes_done = 0
        self.last_chunk: list[int] | None = None
        """[size, CRC-32] of the last chunk written: checked against the file on resume."""
        self.handle = None

    @contextlib.contextmanager
    def _writing(self):
        """A disk's write error (full, quota, I/O) in the block, writing the partial file or
        its state: one line naming the output, the partial output kept for ``--resume``."""
        try:
            yield
        except (OSError, RunStopped) as exc:
            if isinstance(exc, OSError) and exc.errno not in DISK_ERRORS:
                raise
            reason = exc.strerror if isinstance(exc, OSError) else exc.reason
            if reason is None:
                raise
            raise RunStopped(
                f"cannot write the partial output {os.path.basename(self.path)}: {reason}; it "
                "is kept: free space, then rerun with --resume",
                self.output,
            ) from None

    def open(self, resume: bool) -> int:
        if resume:
            here = [os.path.exists(p) for p in (self.path, self.state_path)]
            if all(here):
                self._resume()
                return self.lines_done
            log.info(
                "nothing to resume for %s (%s): starting from the beginning",
                self.output,
                "no partial output of an earlier run"
                if not any(here)
                else f"{os.path.basename(self.state_path if here[0] else self.path)} is missing",
            )
        if os.path.exists(self.state_path):
            log.info("starting again: %s held an earlier partial run", self.path)
        try:
            self.handle = open(self.path, "wb")
        except OSError as exc:
            raise InputError(
                f"cannot write the partial output ({exc.strerror})", self.path
            ) from None
        self._write_state()
        return 0

    def _resume(self) -> None:
        """Go on with the partial file after checking it against its state."""
        again = "; run without --resume to start again"
        try:
            with open(self.state_path, encoding="utf-8") as fh:
                state = json.load(fh)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise InputError(
                f"unreadable resume state ({reason}){again}", self.state_path
            ) from None
        if not isinstance(state, dict) or not _valid_state(state):
            raise InputError(
                f"invalid resume state (lines, bytes or last chunk missing or out of range){again}",
                self.state_path,
            )
        if state.get("identity") != self.identity:
            raise InputError(
                "cannot resume: the partial output was made from another input, model or "
                "flags (run without --resume to start again)",
                self.output,
            )
        lines, size, last = state["lines"], state["bytes"], state["last_chunk"]
        actual = os.path.getsize(self.path)
        if actual < size:
            raise InputError(
                f"partial output has {actual} bytes, its state {os.path.basename(self.state_path)}"
                f" records {size}: truncated or changed since{again}",
                self.path,
            )
        try:
            self.handle = open(self.path, "r+b")
        except OSError as exc:
            raise InputError(
                f"cannot resume the partial output ({exc.strerror})", self.path
            ) from None
        if last is not None:
            self.handle.seek(size - last[0])
            if zlib.crc32(self.handle.read(last[0])) != last[1]:
                self.handle.close()
                raise InputError(
                    "partial output does not match its state (the CRC-32 of its last chunk "
                    f"differs): changed since it was written{again}",
                    self.path,
                )
        self.lines_done, self.bytes_done, self.last_chunk = lines, size, last
        self.handle.truncate(size)
        self.handle.seek(size)

    def append_chunk(self, data: bytes, n_lines: int) -> None:
        """Append a chunk's bytes (:func:`chunk_bytes`: one gzip member for a ``.gz`` output)."""
        with self._writing():
            self.handle.write(data)
            self.handle.flush()
            os.fsync(self.handle.fileno())
        self.lines_done += n_lines
        self.bytes_done += len(data)
        self.last_chunk = [len(data), zlib.crc32(data)] if data else self.last_chunk
        with self._writing():
            self._write_state()

    def _write_state(self) -> None:
        with AtomicOutput(self.state_path, compress=False) as fh:
            json.dump(
                {
                    "identity": self.identity,
                    "lines": self.lines_done,
                    "bytes": self.bytes_done,
                    "last_chunk": self.last_chunk,
                },
                fh,
            )

    def complete(self) -> None:
        """Close the partial file, complete (still under its partial name, resumable)."""
        with self._writing():
            if self.compress and self.bytes_done == 0:
                with gzip_writer(self.handle):
                    pass
            self.handle.close()

    def publish(self) -> None:
        os.replace(self.path, self.output)
        os.unlink(self.state_path)

    def close_incomplete(self) -> None:
        """Leave the partial file and state for ``--resume`` (never under the final name)."""
        if self.handle is not None and not self.handle.closed:
            # bytes a full disk refused are past the state's count: --resume cuts them off
            with contextlib.suppress(OSError):
                self.handle.close()

    def discard(self) -> None:
        self.close_incomplete()
        for path in (self.path, self.state_path):
            if os.path.exists(path):
                os.unlink(path)


def _valid_state(state: dict) -> bool:
    """Whether a resume state's numbers are whole and consistent: lines and bytes >= 0, none
    of either without the other, and the last chunk's [size, CRC-32] within the bytes."""
    lines, size, last = state.get("lines"), state.get("bytes"), state.get("last_chunk", False)

    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not (count(lines) and count(size)) or (lines == 0) != (size == 0):
        return False
    if last is None:
        return size == 0
    return (
        isinstance(last, list)
        and len(last) == 2
        and all(count(v) for v in last)
        and 0 < last[0] <= size
    )


class _StdoutOutput:
    compress = False  # standard output is written as it is, never gzip

    def __init__(self):
        import sys

        self.stream = sys.stdout.buffer

    def open(self, resume: bool) -> int:
        if resume:
            raise InputError("--resume needs an output file, not standard output")
        return 0

    def append_chunk(self, data: bytes, n_lines: int) -> None:
        with disk_errors("-"):
            self.stream.write(data)
            self.stream.flush()

    def complete(self) -> None:
        with disk_errors("-"):
            self.stream.flush()

    def publish(self) -> None:
        pass

    def close_incomplete(self) -> None:
        pass

    def discard(self) -> None:
        pass


def _input_identity(table: str) -> dict:
    if table == "-":
        return {"path": "-"}
    st = os.stat(table)
    return {"path": os.path.abspath(table), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


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


def rescore_table(
    table: str,
    model_paths: list[str],
    output: str | None = None,
    options: RescoreOptions | None = None,
    device: str = "auto",
    resume: bool = False,
    progress: bool = True,
    models: list[TrainedModel] | None = None,
    inverse_model_paths: list[str] | None = None,
    lm_paths: list[str] | None = None,
    before_publish: Callable[[RescoreResult], None] | None = None,
    shard: Shard | None = None,
    workers: int = 1,
) -> RescoreResult:
    """Append one column per model (and optionally the unknown-word column) to ``table``.

    Models in ``model_paths`` give p(target | source); models in ``inverse_model_paths`` were
    trained in the other direction (target language -> source language) and give
    p(source | target), the neural counterpart of the table's inverse φ(f|e); their columns
    follow the direct ones. Each CSLM of ``lm_paths`` adds p(target phrase) after those
    (:class:`phrasescore.engine.lm_scoring.LMPhraseColumn`: the phrase scored with sentence-boundary
    context off), then comes the unknown-word column.

    ``before_publish`` runs once the whole table is written but before it is renamed to
    ``output``: what it raises leaves the output unpublished (and resumable).

    With ``shard`` only that shard's chunks are scored, and a manifest is written beside the
    output (:mod:`phrasescore.runners.shards`); ``merge-shards`` puts the parts together.

    ``workers`` > 1 (CPU only): the chunks are scored in that many forked processes of one
    PyTorch thread each (:mod:`phrasescore.runners.chunk_pool`); the output bytes are those of one
    process with one thread.
    """
    options = options or RescoreOptions()
    output = output or default_output_path(table, shard)
    _check_request(table, output, options, resume, shard)
    # Load everything before writing anything: a bad model leaves no output behind.
    dev = resolve_device(device)
    if workers > 1 and dev.type != "cpu":
        raise InputError(f"--workers is for scoring on the CPU; on {dev.type} use one process")
    options.dtype = resolve_dtype(options.dtype, dev)  # 'auto' fixed here: part of the resume key
    with single_threaded_parent(workers > 1):  # loaded at one thread, to fork from: chunk_pool
        columns = NewColumns.load(
            model_paths, models, inverse_model_paths or [], lm_paths or [], options, dev
        )
    log.info("device %s, dtype %s, scoring %s", dev, options.dtype, options.scoring)
    identity = columns.identity(table)
    if shard is not None:
        identity["shard"] = [shard.index, shard.count]
        log.info(
            "shard %s: chunks i of %d lines with i %% %d == %d",
            shard,
            options.chunk_lines,
            shard.count,
            shard.index - 1,
        )
    if resume and shard is not None:
        done = _complete_part(table, output, shard, options, columns)
        if done is not None:
            return done
    sink = _StdoutOutput() if output == "-" else _PartialOutput(output, identity)
    start_line = sink.open(resume)
    position = ReadPosition()
    reader = RawTable(table, position)
    started = time.monotonic()
    counter = _Progress(progress, position, start_line, started, options.max_phrase_length)
    records: list[dict] = []  # a shard's chunk records (shards.chunk_record), for its manifest
    chunk_index = _skip_done_lines(reader, counter, start_line, shard, options, table, records)
    pool = None
    try:
        score = functools.partial(score_chunk, columns, sink.compress, reader.name)
        if workers > 1:
            with single_threaded_parent(True):
                columns.warm_up()  # compiled here once: the forked workers inherit the kernels
                pool = ChunkPool(score, workers, label=_chunk_label)
        try:
            input_lines, clamped = _write_chunks(
                reader,
                score,
                sink,
                counter,
                shard,
                options.chunk_lines,
                chunk_index,
                records,
                pool,
            )
        except WorkerDied as exc:
            again = "rerun with --resume" if output != "-" else "run again"
            raise RunStopped(f"{exc}; {again}") from None
        sink.complete()
        counter.close()
        if shard is not None:
            write_manifest(
                output,
                sink.path,
                shard,
                table,
                input_lines,
                options.chunk_lines,
                counter.lines,
                columns.job(),
                device=dev.type,
                chunks=records,
            )
        result = RescoreResult(
            output=output,
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
        if pool is not None:
            pool.terminate()  # stopped already after the last chunk; at once after an error
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
    _log_result(result)
    return result


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


def _chunk_label(index: int, raw: RawChunk) -> str:
    """A chunk as :class:`~phrasescore.runners.chunk_pool.WorkerDied` names it."""
    last = raw.first_lineno + raw.data.count(b"\n") - (raw.data.endswith(b"\n"))
    return f"chunk {raw.index} (lines {raw.first_lineno}-{last})"


def _check_request(
    table: str, output: str, options: RescoreOptions, resume: bool, shard: Shard | None
) -> None:
    """Everything about the input, output and flags that can be refused before any work."""
    if shard is not None and (output == "-" or table == "-"):
        raise InputError("--shard needs an input file and an output file (for the manifest)")
    if output != "-" and table != "-" and os.path.abspath(output) == os.path.abspath(table):
        raise InputError("the output would overwrite the input table", output)
    check_files_exist([table])
    if resume and table != "-" and is_pipe(table):
        raise InputError(
            "--resume reads the table again from its start: give the file, not a pipe", table
        )
    if shard is not None and is_pipe(table):
        raise InputError("--shard reads the table again for its manifest: give the file", table)
    check_output_path(output, "output table")
    check_work_paths(output, shard)
    if options.chunk_lines < 1 or options.batch_tokens < 1:
        raise InputError("chunk_lines and batch_tokens must be at least 1")
    if options.logprob:
        log.warning(
            "--logprob writes log p values: Moses takes ln of every phrase-table value, so this "
            "table is NOT for Moses (a negative value becomes NaN)"
        )


def _skip_done_lines(
    reader, counter, start_line: int, shard: Shard | None, options, table, records: list[dict]
):
    """After ``--resume``: read past the input lines the partial output already has; returns
    the index of the next input chunk. A shard appends the records of its chunks done earlier
    to ``records``."""
    if start_line and shard is not None:
        # this shard's first chunks are done: skip to the input chunk after them
        log.info("resuming after line %d of the part", start_line)
        chunk_index = shard.first_unscored_chunk(-(-start_line // options.chunk_lines))
        input_lines = 0
        for i in range(chunk_index):
            chunk = reader.entries(options.chunk_lines)
            input_lines += len(chunk)
            if chunk and shard.owns(i):
                records.append(chunk_record(i, [e.source for e in chunk]))
                counter.count(chunk)  # the summary counts the whole part, as one run does
        if input_lines < chunk_index * options.chunk_lines and not start_line % options.chunk_lines:
            counter.close()
            raise InputError("cannot resume: the input is shorter than the partial output", table)
        return chunk_index
    if start_line:
        log.info("resuming after line %d", start_line)
        # the lines done count in the summary too (distinct sources of the whole table)
        skipped = 0
        while skipped < start_line:  # a chunk at a time: memory stays that of one chunk
            done = counter.count(reader.entries(min(options.chunk_lines, start_line - skipped)))
            if not done:
                break
            skipped += done
        if skipped < start_line:
            counter.close()
            raise InputError(
                f"cannot resume: the input has only {skipped} lines, the partial output {start_line}",
                table,
            )
        if start_line % options.chunk_lines and reader.entries(1):
            # only the table's last chunk is short: a partial output that ends with a short
            # chunk before the end of the input is not one this run wrote
            counter.close()
            raise InputError(
                f"cannot resume: the partial output ends after line {start_line}, within a "
                f"chunk of {options.chunk_lines} lines (run without --resume to start again)",
                table,
            )
    return 0


class RawChunk(NamedTuple):
    """A chunk of table lines as read, for :func:`score_chunk` (in this process or a worker's:
    one bytes object travels to a worker instead of thousands of parsed entries)."""

    index: int
    first_lineno: int
    data: bytes
    num_scores: int
    """The scores every line must have (line 1's count)."""
    first: bool
    """The first chunk this run scores (the table's direction is checked on it)."""


class RawTable:
    """A phrase table read as raw lines, cut into :class:`RawChunk` s; line 1 is parsed here, so
    that every chunk knows the number of scores a line must have."""

    def __init__(self, table: str, position: ReadPosition):
        self.name = display_name(table)
        self.lines = iter_raw_lines(table, position)
        self.lineno = 0  # lines read so far
        self.num_scores = -1

    def _read(self, count: int) -> list[bytes]:
        lines = list(islice(self.lines, count))
        if lines and self.lineno == 0:
            first = parse_phrase_table_lines(decode_lines(lines[0], self.name), self.name)
            self.num_scores = len(next(first).scores)
        self.lineno += len(lines)
        return lines

    def entries(self, count: int) -> list[PhraseTableEntry]:
        """The next ``count`` lines, parsed (lines skipped by ``--resume``)."""
        first = self.lineno + 1
        data = b"".join(self._read(count))
        return parse_raw(self.name, first, data, self.num_scores)

    def chunk(self, index: int, count: int) -> RawChunk | None:
        """The next ``count`` lines as chunk ``index``; None at the end of the table."""
        first_lineno = self.lineno + 1
        lines = self._read(count)
        if not lines:
            return None
        return RawChunk(index, first_lineno, b"".join(lines), self.num_scores, False)


def parse_raw(name: str, first_lineno: int, data: bytes, num_scores: int) -> list:
    """The entries of raw table lines (UTF-8 and every field checked, errors naming the line)."""
    lines = decode_lines(data, name, first_lineno)
    return list(parse_phrase_table_lines(lines, name, first_lineno, num_scores))


def _write_chunks(
    reader: RawTable,
    score: Callable[[RawChunk], ChunkOutput],
    sink,
    counter,
    shard,
    chunk_lines: int,
    chunk_index: int,
    records: list[dict],
    pool: ChunkPool | None = None,
) -> tuple[int, int]:
    """Score and write the remaining chunks (a shard: only its own, each one's record appended
    to ``records``), in this process or in ``pool``'s workers; returns (input lines read, model
    scores clamped)."""

    def own_chunks():
        index, first = chunk_index, True
        while chunk := reader.chunk(index, chunk_lines):
            if shard is None or shard.owns(index):
                yield chunk._replace(first=first)  # the table's direction is checked on it
                first = False
            index += 1

    done = ((c, score(c)) for c in own_chunks()) if pool is None else pool.imap(own_chunks())
    clamped = 0
    for _, out in done:
        sink.append_chunk(out.data, out.record["lines"])
        clamped += out.clamped
        counter.update(out.record, out.too_long)
        if shard is not None:
            records.append(out.record)
    if pool is not None:
        pool.close()
    return reader.lineno, clamped


def score_chunk(columns: NewColumns, compress: bool, name: str, raw: RawChunk) -> ChunkOutput:
    """Parse, score and format one chunk: its bytes as written, its record
    (:func:`~phrasescore.runners.shards.chunk_record`), its pairs over the length limit and the scores
    it clamped. The same function runs in this process and in ``--workers`` processes."""
    chunk = parse_raw(name, raw.first_lineno, raw.data, raw.num_scores)
    if raw.first:
        columns.warn_direction(chunk)
    before = columns.clamped()
    text, too_long = columns.format_chunk(chunk)
    record = chunk_record(raw.index, [e.source for e in chunk])
    return ChunkOutput(chunk_bytes(text, compress), columns.clamped() - before, record, too_long)


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

    def values(self, sources: Sequence[str], targets: Sequence[str]) -> list[str]:
        return [
            format_probability(probability_from_logprob(float(v))) for v in self.logprobs(targets)
        ]


DIRECTION_MARGIN = 0.2
"""How much better the model's vocabularies must know the table read backwards (fraction of
known tokens) before :func:`direction_evidence` calls it reversed."""


def direction_evidence(model, sources: list[str], targets: list[str]) -> tuple[float, float] | None:
    """(coverage as given, coverage swapped) when ``model`` looks trained target->source on
    these phrases, else None.

    Coverage is the mean over both sides of the fraction of tokens the model's vocabulary knows:
    as given, sources by its source vocabulary and targets by its target vocabulary; swapped,
    the other way round. Reversed means swapped is at least :data:`DIRECTION_MARGIN` higher and
    twice as high: words the languages share (numbers, names, punctuation) count on both sides,
    and a model of other languages altogether knows little either way.
    """
    if not sources or not targets:
        return None
    src_as_src = [phrase_tokens(model.src_text, p) for p in sources]
    tgt_as_tgt = [phrase_tokens(model.tgt_text, p) for p in targets]
    src_as_tgt = [phrase_tokens(model.tgt_text, p) for p in sources]
    tgt_as_src = [phrase_tokens(model.src_text, p) for p in targets]
    given = (model.src_vocab.coverage(src_as_src) + model.tgt_vocab.coverage(tgt_as_tgt)) / 2
    swapped = (model.tgt_vocab.coverage(src_as_tgt) + model.src_vocab.coverage(tgt_as_src)) / 2
    if swapped >= given + DIRECTION_MARGIN and swapped >= 2 * given:
        return given, swapped
    return None


class NewColumns:
    """The columns added to each line: one per model (direct, then inverse), one per CSLM, and
    the unknown-word column."""

    def __init__(self, models, directions, lm_columns, options: RescoreOptions, device):
        self.options = options
        self.directions = directions
        self.lm_columns = lm_columns
        self.scorers = [
            PairScorer(
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
        if options.unk_column:
            if not models:
                raise InputError("--unk-column counts with a model's vocabularies: give a --model")
            self.names.append("unknown-words")

    @classmethod
    def load(cls, model_paths, models, inverse_paths, lm_paths, options, device) -> NewColumns:
        """Load the models and CSLMs (``models``: the direct ones, already loaded)."""
        lm_columns = [LMPhraseColumn(load_lm(path, device), device) for path in lm_paths]
        if models is None:
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
        columns = cls(list(models) + inverse_models, directions, lm_columns, options, device)
        paths = list(model_paths) + list(inverse_paths)
        all_models = list(models) + inverse_models
        columns.paths = paths if len(paths) == len(all_models) else [""] * len(all_models)
        for model, path in zip(all_models, paths or [""] * len(all_models), strict=False):
            log.info("model %s: %s, signature %s", path, model.config.arch, model.signature)
        return columns

    def warn_direction(self, chunk) -> None:
        """Warn when the table looks reversed for a model (see :func:`direction_evidence`).

        A lone model cannot be checked against another's direction, and neither the table nor
        the moses.ini records its languages; what can be seen is which of the model's
        vocabularies knows the table's words.
        """
        sources = list(dict.fromkeys(e.source for e in chunk))
        targets = list(dict.fromkeys(e.target for e in chunk))
        for model, inverse, path in zip(self.models, self.directions, self.paths, strict=True):
            src, tgt = (targets, sources) if inverse else (sources, targets)
            evidence = direction_evidence(model, src, tgt)
            if evidence is None:
                continue
            given, swapped = evidence
            lang = f"{model.src_text.lang}->{model.tgt_text.lang}"
            hint = "--model" if inverse else "--inverse-model"
            log.warning(
                "%s (%s) looks trained in the other direction: its vocabularies know "
                "%.0f%% of the table's words read the other way round, %.0f%% as given; if it "
                "translates the table's target language into its source language, give it as %s",
                path or model.signature,
                lang,
                100 * swapped,
                100 * given,
                hint,
            )

    def warm_up(self) -> None:
        """Compile every model's kernels before ``--workers`` processes are forked from this
        one (:meth:`PairScorer.warm_up`): they inherit them."""
        for scorer in self.scorers:
            scorer.warm_up()

    def clamped(self) -> int:
        """Model scores clamped at log p = 0 so far (self-normalized scoring)."""
        return sum(scorer.clamped for scorer in self.scorers)

    def identity(self, table: str) -> dict:
        """What a partial output was made from: input, models, flags (the resume key)."""
        identity = {
            "input": _input_identity(table),
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

    def format_chunk(self, chunk) -> tuple[str, int]:
        """The output lines of a chunk of table entries, and how many pairs have a phrase over
        ``max_phrase_length`` tokens (they get the floor value without being scored)."""
        sources = [e.source for e in chunk]
        targets = [e.target for e in chunk]
        too_long = too_long_pairs(sources, targets, self.options.max_phrase_length)
        columns = []
        first_scored = None
        for scorer, inverse in zip(self.scorers, self.directions, strict=True):
            if inverse:
                scored = score_within_limit(scorer, targets, sources, too_long)
            else:
                scored = score_within_limit(scorer, sources, targets, too_long)
            first_scored = first_scored or scored
            columns.append(column_values(scored, self.options, too_long))
        for lm_column in self.lm_columns:
            columns.append(lm_values_within_limit(lm_column, sources, targets, too_long))
        if self.options.unk_column:
            columns.append(unknown_values(first_scored))
        text = "".join(
            format_entry(entry, [col[i] for col in columns]) for i, entry in enumerate(chunk)
        )
        return text, int(too_long.sum())


class _Progress:
    """Lines, distinct sources and pairs over ``max_phrase_length`` done (of the whole table,
    with ``--resume`` too), and the progress bar: in bytes of the input file (compressed bytes
    for gzip, so that it ends at 100%), so that tqdm can show an ETA; lines and pairs/s in the
    postfix."""

    def __init__(
        self,
        enabled: bool,
        position: ReadPosition,
        start_line: int,
        started: float,
        max_phrase_length: int,
    ):
        self.position = position
        self.start_line = start_line
        self.started = started
        self.max_phrase_length = max_phrase_length
        self.lines = start_line
        self.distinct_sources = 0
        self.too_long = 0
        self.last_source = None  # SHA-256 of the last source counted (a chunk record's "last")
        self.bar = progress_bar(
            enabled, total=position.size, unit="B", unit_scale=True, desc="rescore"
        )

    def _add(self, record: dict, too_long: int) -> None:
        """Count a chunk by its :func:`~phrasescore.runners.shards.chunk_record`: a source whose lines
        began in the chunk before counts once."""
        if record["lines"]:
            self.distinct_sources += record["runs"] - (record["first"] == self.last_source)
            self.last_source = record["last"]
        self.too_long += too_long

    def count(self, entries: list) -> int:
        """Count the distinct sources of lines done earlier (``--resume``); their number."""
        limit = self.max_phrase_length
        too_long = sum(is_too_long(e.source, e.target, limit) for e in entries)
        self._add(chunk_record(0, [e.source for e in entries]), too_long)
        return len(entries)

    def update(self, record: dict, too_long: int) -> None:
        """A chunk written: its record and its pairs over the length limit."""
        self._add(record, too_long)
        self.lines += record["lines"]
        elapsed = time.monotonic() - self.started
        bar = self.bar
        if bar.total is None and self.position.size:
            bar.total = self.position.size
        bar.update(self.position.bytes_read() - bar.n)
        bar.set_postfix(
            lines=str(self.lines),
            pairs_s=f"{(self.lines - self.start_line) / max(elapsed, 1e-9):.0f}",
            refresh=False,
        )

    def close(self) -> None:
        self.bar.close()


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


@dataclass
class RescoreJobResult:
    rescore: RescoreResult
    ini_out: str | None = None
    ini_update: object | None = None


def default_ini_out(ini_path: str) -> str:
    """``model/moses.ini`` -> ``model/moses.rescored.ini``."""
    stem = ini_path[: -len(".ini")] if ini_path.endswith(".ini") else ini_path
    return stem + ".rescored.ini"


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
) -> RescoreJobResult:
    """``phrasescore rescore``: check the moses.ini first, rescore, then write the new ini.

    The new ini declares one more feature and weight per added column, points at the new
    table, and carries a comment with the models' signatures, so that a score can be traced.

    Under torchrun (``WORLD_SIZE`` > 1) each rank scores one shard into a hidden part beside
    the output and rank 0 merges the parts after a barrier (:func:`_run_torchrun`).
    """
    output = output or default_output_path(table, shard)
    n_new = len(model_paths) + len(inverse_model_paths or []) + len(lm_paths or [])
    n_new += 1 if options.unk_column else 0
    launch = distributed.from_env()
    if launch is not None and shard is not None:
        raise InputError("--shard and torchrun exclude each other (torchrun gives each rank one)")
    if launch is not None and workers > 1:
        raise InputError(
            "--workers and torchrun exclude each other (torchrun starts the processes)"
        )
    ini = None
    if moses_ini:
        if output == "-":
            raise InputError("--moses-ini needs an output file, not standard output")
        if shard is not None:
            raise InputError(
                "with --shard give --moses-ini to merge-shards, which writes the table"
            )
        ini_out = ini_out or default_ini_out(moses_ini)
        if os.path.abspath(ini_out) == os.path.abspath(table):
            raise InputError("the moses.ini would overwrite the input table", ini_out)
    else:
        ini_out = None
    # The table and its ini are one result: both locations are checked before any scoring, both
    # are written under temporary names, and both renamed into place only once both are complete.
    check_output_paths({"output table": output, "moses.ini": ini_out})
    if moses_ini:
        ini = _IniUpdate(moses_ini, ini_table or table, os.path.abspath(output), n_new, weight)
    staged: dict = {}

    def stage_ini(result: RescoreResult) -> None:
        staged["ini"] = ini.stage(ini_out, result)

    score = functools.partial(
        rescore_table,
        table,
        model_paths,
        options=options,
        resume=resume,
        inverse_model_paths=inverse_model_paths,
        lm_paths=lm_paths,
        workers=workers,
    )
    try:
        if launch is not None:
            result = _run_torchrun(launch, score, table, output, device, progress)
            if not launch.is_main:
                return RescoreJobResult(result)
            if ini is not None:
                stage_ini(result)
        else:
            result = score(
                output,
                device=device,
                progress=progress,
                shard=shard,
                before_publish=stage_ini if ini is not None else None,
            )
    except BaseException:
        if "ini" in staged:
            staged["ini"][0].discard()
        raise
    if ini is None:
        return RescoreJobResult(result)
    staged_file, update = staged["ini"]
    staged_file.publish()
    ini.log_written(ini_out, update)
    return RescoreJobResult(result, ini_out, update)


def _run_torchrun(launch, score, table, output, device, progress) -> RescoreResult:
    """One shard per rank, a barrier, then rank 0 merges and removes the parts
    (:func:`phrasescore.runners.shards.run_on_ranks`).

    ``--resume`` goes on with each rank's partial part; a part that was finished (a run stopped
    during the merge) is kept as it is.
    """
    check_files_exist([table])
    if output == "-" or is_pipe(table):  # every rank reads the table: not a pipe or stdin
        raise InputError("under torchrun give an input file and an output file")
    for k in range(1, launch.world_size + 1):  # every rank refuses what is in any rank's way
        shard = Shard(k, launch.world_size)
        part = shard_part_path(output, shard)
        check_output_path(part, "part")
        check_work_paths(part, shard)
    started = time.monotonic()

    def score_part(part: str, dev: str, shard: Shard) -> RescoreResult:
        return score(part, device=dev, progress=progress and launch.is_main, shard=shard)

    result, merged, (too_long, clamped) = run_on_ranks(
        launch,
        device,
        output,
        score_part,
        keep_finished=score.keywords["resume"],
        sums=lambda result: [result.too_long, result.clamped] if result else [0, 0],
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
class MergeJobResult:
    merge: object
    ini_out: str | None = None
    ini_update: object | None = None


def run_merge(
    parts: list[str],
    output: str,
    moses_ini: str | None = None,
    ini_out: str | None = None,
    ini_table: str | None = None,
    weight: float = 0.2,
) -> MergeJobResult:
    """``phrasescore merge-shards``: check and merge the parts (of ``rescore --shard`` or
    ``nbest --shard``), then write the new moses.ini (checked before anything is written; its
    table is the input the shards read)."""
    ini = None
    if moses_ini:
        if output == "-":
            raise InputError("--moses-ini needs an output file, not standard output")
        ini_out = ini_out or default_ini_out(moses_ini)
    check_output_paths({"output table": output, "moses.ini": ini_out if moses_ini else None})
    if moses_ini:
        manifest = check_parts(parts)[0][1]
        if manifest["kind"] != PHRASE_TABLE:
            raise InputError("--moses-ini is for the parts of a phrase table, not an n-best list")
        n_new = len(manifest["job"]["columns"])
        table = ini_table or manifest["input_path"]
        ini = _IniUpdate(moses_ini, table, os.path.abspath(output), n_new, weight)
    merged = merge_shards(parts, output)
    if ini is None:
        return MergeJobResult(merged)
    staged_file, update = ini.stage(ini_out, merged)
    staged_file.publish()
    ini.log_written(ini_out, update)
    return MergeJobResult(merged, ini_out, update)


class _IniUpdate:
    """The moses.ini of the rescored table: checked before the table is rescored (a table the
    ini does not name is refused before any output is written), written after."""

    def __init__(self, ini_path: str, table: str, new_table: str, n_new: int, weight: float):
        self.ini_path = ini_path
        self.table = table
        # An absolute path: the ini module keeps the old table's directory text (relative,
        # absolute or ${VAR}) when the new table is beside the old one, whatever the current
        # directory.
        self.new_table = new_table
        self.n_new = n_new
        self.weights = [weight] * n_new
        self.text = "".join(iter_lines(ini_path, keep_ends=True))
        self._update()

    def _update(self, comment: str | None = None):
        try:
            return update_moses_ini_text(
                self.text,
                self.table,
                self.new_table,
                n_new=self.n_new,
                weights=self.weights,
                comment=comment,
                ini_path=self.ini_path,
            )
        except InputError as exc:
            raise exc.located(display_name(self.ini_path)) from None

    def stage(self, ini_out: str, result: RescoreResult):
        """(the new ini written complete under a temporary name beside ``ini_out``, the update);
        :meth:`StagedFile.publish` renames it into place."""
        comment = (
            f"# phrasescore {__version__}: {result.new_columns} column(s) "
            f"added to {self.table}: {', '.join(result.column_names)}"
        )
        update = self._update(comment)
        return StagedFile(ini_out, update.text), update

    @staticmethod
    def log_written(ini_out: str, update) -> None:
        log.info(
            "wrote %s: %s now has %d scores (weights %s added)",
            ini_out,
            update.feature,
            update.new_num_features,
            " ".join(str(w) for w in update.added_weights),
        )
        for note in update.notes:
            log.warning("%s", note)
