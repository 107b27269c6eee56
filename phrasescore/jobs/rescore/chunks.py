"""The phrase table read in chunks for ``rescore``: raw lines cut into chunks, each parsed,
scored and formatted by :func:`score_chunk` (in this process or a ``--workers`` process), the
lines done counted for the progress bar and the summary, and the lines a ``--resume`` skips.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from phrasescore.errors import InputError
from phrasescore.files.kinds import display_name
from phrasescore.files.reading import (
    LineBlocks,
    ReadPosition,
    count_lines,
    decode_lines,
    decode_text,
)
from phrasescore.jobs.rescore.columns import NewColumns, is_too_long
from phrasescore.moses.columnar import parse_chunk
from phrasescore.moses.phrase_table import (
    PhraseTableEntry,
    parse_phrase_table_chunk,
    parse_phrase_table_lines,
)
from phrasescore.progress import progress_bar
from phrasescore.runners.partial import chunk_bytes
from phrasescore.runners.shards import (
    Shard,
    chunk_record,
    runs_record,
)

log = logging.getLogger(__name__)


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
    """A phrase table read as raw lines, cut into :class:`RawChunk` s (:class:`LineBlocks`: no
    Python step per line here); line 1 is parsed here, so that every chunk knows the number of
    scores a line must have."""

    def __init__(self, table: str, position: ReadPosition):
        self.name = display_name(table)
        self.blocks = LineBlocks(table, position)
        self.lineno = 0  # lines read so far
        self.num_scores = -1
        self.last_data = b""

    def _read(self, count: int) -> bytes:
        data = self.blocks.take(count)
        if data and self.lineno == 0:
            line = data[: data.find(b"\n") + 1] or data
            first = parse_phrase_table_lines(decode_lines(line, self.name), self.name)
            self.num_scores = len(next(first).scores)
        self.lineno += count_lines(data)
        return data

    def entries(self, count: int) -> list[PhraseTableEntry]:
        """The next ``count`` lines, parsed (lines skipped by ``--resume``); their bytes stay in
        :attr:`last_data` (the CRC-32 of the input a resume proves)."""
        first = self.lineno + 1
        data = self._read(count)
        self.last_data = data
        return parse_raw(self.name, first, data, self.num_scores)

    def chunk(self, index: int, count: int) -> RawChunk | None:
        """The next ``count`` lines as chunk ``index``; None at the end of the table."""
        first_lineno = self.lineno + 1
        data = self._read(count)
        if not data:
            return None
        return RawChunk(index, first_lineno, data, self.num_scores, False)


def parse_raw(name: str, first_lineno: int, data: bytes, num_scores: int) -> list:
    """The entries of raw table lines (UTF-8 and every field checked, errors naming the line)."""
    text = decode_text(data, name, first_lineno)
    return parse_phrase_table_chunk(text, name, first_lineno, num_scores)


def own_chunks(
    reader: RawTable, shard: Shard | None, chunk_lines: int, chunk_index: int
) -> Iterator[RawChunk]:
    """The chunks left to score from input chunk ``chunk_index`` on (a shard: only its own);
    the first one is marked, the table's direction is checked on it."""
    index, first = chunk_index, True
    while chunk := reader.chunk(index, chunk_lines):
        if shard is None or shard.owns(index):
            yield chunk._replace(first=first)
            first = False
        index += 1


@dataclass
class ChunkScorer:
    """:func:`score_chunk` with the columns and the output's format of one run: the function
    run on each chunk, here or in a ``--workers``/``--io-workers`` process (which inherits it by
    ``fork``). ``gzip_level``: None for a plain output."""

    columns: NewColumns
    gzip_level: int | None
    name: str

    def __call__(self, raw: RawChunk, score: Callable | None = None) -> ChunkOutput:
        return score_chunk(self.columns, self.gzip_level, self.name, raw, score)


def score_chunk(
    columns: NewColumns,
    gzip_level: int | None,
    name: str,
    raw: RawChunk,
    score: Callable | None = None,
) -> ChunkOutput:
    """Parse (:func:`~phrasescore.moses.columnar.parse_chunk`: arrays over the chunk's
    bytes), score and format one chunk: its bytes as written, its record
    (:func:`~phrasescore.runners.shards.chunk_record`), its pairs over the length limit and the scores
    it clamped. The same function runs in this process and in ``--workers`` processes; with
    ``score`` (an ``--io-workers`` process) the chunk's ids are scored by ``score`` (the process
    that owns the networks) instead of here (:meth:`NewColumns.format_chunk`)."""
    chunk = parse_chunk(raw.data, name, raw.first_lineno, raw.num_scores)
    if raw.first:
        columns.warn_direction(chunk)
    data, too_long, clamped = columns.format_chunk(chunk, score)
    sources = chunk.sources()
    record = runs_record(
        raw.index,
        len(sources),
        len(chunk.source_runs()),
        sources[0] if sources else None,
        sources[-1] if sources else None,
    )
    return ChunkOutput(chunk_bytes(data, gzip_level), clamped, record, too_long)


def chunk_label(index: int, raw: RawChunk) -> str:
    """A chunk as :class:`~phrasescore.runners.chunk_pool.WorkerDied` names it."""
    last = raw.first_lineno + raw.data.count(b"\n") - (raw.data.endswith(b"\n"))
    return f"chunk {raw.index} (lines {raw.first_lineno}-{last})"


class Progress:
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


def skip_done_lines(
    reader, counter, start_line: int, shard: Shard | None, options, table, records: list[dict]
):
    """After ``--resume``: read past the input lines the partial output already has; returns
    the index of the next input chunk and the CRC-32 of the input bytes the partial output was
    made from (a shard: of its own chunks), for :meth:`PartialOutput.check_input`. A shard
    appends the records of its chunks done earlier to ``records``."""
    if start_line and shard is not None:
        # this shard's first chunks are done: skip to the input chunk after them
        log.info("resuming after line %d of the part", start_line)
        chunk_index = shard.first_unscored_chunk(-(-start_line // options.chunk_lines))
        input_lines = input_crc = 0
        for i in range(chunk_index):
            chunk = reader.entries(options.chunk_lines)
            input_lines += len(chunk)
            if chunk and shard.owns(i):
                records.append(chunk_record(i, [e.source for e in chunk]))
                counter.count(chunk)  # the summary counts the whole part, as one run does
                input_crc = zlib.crc32(reader.last_data, input_crc)
        if input_lines < chunk_index * options.chunk_lines and not start_line % options.chunk_lines:
            counter.close()
            raise InputError("cannot resume: the input is shorter than the partial output", table)
        return chunk_index, input_crc
    if start_line:
        log.info("resuming after line %d", start_line)
        # the lines done count in the summary too (distinct sources of the whole table)
        skipped = input_crc = 0
        while skipped < start_line:  # a chunk at a time: memory stays that of one chunk
            done = counter.count(reader.entries(min(options.chunk_lines, start_line - skipped)))
            if not done:
                break
            skipped += done
            input_crc = zlib.crc32(reader.last_data, input_crc)
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
        return 0, input_crc
    return 0, 0
