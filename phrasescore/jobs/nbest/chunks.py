"""An n-best list's chunks: read as raw lines cut after whole sentence-id groups
(:class:`RawList`, no Python step per line in the reading process), then parsed, scored and
formatted by :class:`ListChunkJob`, in this process, in ``--workers`` processes, or in
``--io-workers`` processes that ask this one for the networks' scores (what
``rescore``'s chunks do with a phrase table).

A chunk ends after the group that brings it to ``chunk_lines`` lines or more: the first
``chunk_lines`` lines, then the lines of the last one's sentence id that follow it (read one by
one, their ids looked at alone). A line whose id cannot be read ends the chunk before it; its
chunk's parse refuses it, naming the line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from phrasescore.errors import InputError
from phrasescore.files.kinds import display_name
from phrasescore.files.reading import LineBlocks, count_lines, decode_lines
from phrasescore.jobs.nbest.features import ChunkFeatures, ModelFeatures
from phrasescore.jobs.nbest.writer import GroupSpan, ListFormat, regroup, spans, with_features
from phrasescore.moses.nbest import (
    NBestEntry,
    iter_nbest_groups,
    line_sentence_id,
    parse_nbest_lines,
)
from phrasescore.runners.partial import chunk_bytes


class RawListChunk(NamedTuple):
    """A chunk of list lines as read: one bytes object travels to a worker instead of
    thousands of parsed entries."""

    index: int
    """Its index among all the list's chunks (a shard's own: ``index % N == K - 1``)."""
    first_lineno: int
    data: bytes
    first: bool = False
    """The first chunk this run scores (the models' direction and the weights are checked on
    it)."""

    @property
    def lines(self) -> int:
        return count_lines(self.data)

    @property
    def source(self) -> bytes:
        """The chunk's lines as a resume proves them the same (their CRC-32): a last line
        without a newline is counted with one, as the output writes it."""
        return self.data if self.data.endswith(b"\n") else self.data + b"\n"


class RawList:
    """The list read as raw lines and cut into :class:`RawListChunk` s after whole sentence-id
    groups (module docstring)."""

    def __init__(self, nbest: str):
        self.blocks = LineBlocks(nbest)
        self.lineno = 0
        """Lines read so far (the line held back included)."""
        self._held = b""
        """The first line of the next chunk, read to find where this one ends."""

    def chunk(self, index: int, size: int) -> RawListChunk | None:
        """The next chunk of ``size`` lines or more; None at the end of the list."""
        first_lineno = self.lineno + 1 - (1 if self._held else 0)
        parts = [self._held] if self._held else []
        self._held = b""
        if size > len(parts):
            parts.append(self._take(size - len(parts)))
        data = b"".join(parts)
        if not data:
            return None
        last_id = line_sentence_id(data[data.rfind(b"\n", 0, len(data) - 1) + 1 :])
        if last_id is not None and data.endswith(b"\n"):
            while line := self._take(1):
                if line_sentence_id(line) != last_id:
                    self._held = line
                    break
                parts.append(line)
            data = b"".join(parts)
        return RawListChunk(index, first_lineno, data)

    def _take(self, count: int) -> bytes:
        data = self.blocks.take(count)
        self.lineno += count_lines(data)
        return data


def list_chunks(raw: RawList, size: int) -> Iterator[RawListChunk]:
    """Every chunk of the list, in order."""
    index = 0
    while chunk := raw.chunk(index, size):
        yield chunk
        index += 1


def parse_groups(chunk: RawListChunk, name: str) -> list[list[NBestEntry]]:
    """The sentence-id groups of a chunk's lines, every line checked (errors name the file and
    line)."""
    lines = decode_lines(chunk.data, name, chunk.first_lineno)
    return list(iter_nbest_groups(parse_nbest_lines(lines, name, chunk.first_lineno)))


class ListChunkOutput(NamedTuple):
    """What one scored chunk gives the run: its output bytes and lines, its groups (for the
    run's :class:`~.writer.ListTally`), the best hypotheses the weights changed and the model
    scores clamped."""

    data: bytes
    lines: int
    groups: list[GroupSpan]
    changed: int
    clamped: int


@dataclass
class ListChunkJob:
    """What is done to each chunk of a run: parsed, each id's source looked up, scored by the
    features (:class:`~.features.ChunkFeatures`; ``ask``: an ``--io-workers`` process's line to
    the process that owns the networks) and formatted (:class:`~.writer.ListFormat`). The same
    function runs in this process and in forked workers."""

    name: str
    """The list's display name."""
    sources: list[str]
    source_path: str
    features: ChunkFeatures
    scorer: ModelFeatures | None
    format: ListFormat
    gzip_level: int | None = None
    """Each chunk's text as one gzip member at this level (a ``.gz`` list); None: as text."""

    def __call__(self, chunk: RawListChunk | None, ask=None) -> ListChunkOutput | None:
        """The chunk's output; None for a chunk another shard scores."""
        if chunk is None:
            return None
        groups = parse_groups(chunk, self.name)
        entries = [entry for group in groups for entry in group]
        # one look-up a sentence: every hypothesis of a group has its id
        srcs = [self.source_of(group[0]) for group in groups for _ in group]
        hyps = [entry.hypothesis for entry in entries]
        if chunk.first and self.scorer is not None:
            self.scorer.warn_direction(srcs, hyps)
        values, clamped = self.features(srcs, hyps, ask)
        entries = with_features(entries, self.format.names, values)
        text, changed = self.format.chunk_text(regroup(entries, groups), chunk.first)
        data = chunk_bytes(text, self.gzip_level)
        return ListChunkOutput(data, text.count("\n"), spans(groups), changed, clamped)

    def groups(self, chunk: RawListChunk) -> list[list[NBestEntry]]:
        """The chunk's groups, each id checked against the source."""
        groups = parse_groups(chunk, self.name)
        for group in groups:
            self.source_of(group[0])
        return groups

    def source_of(self, entry: NBestEntry) -> str:
        """The source sentence of ``entry``'s id; an id beyond the source or an empty source
        line is refused at the entry's line."""
        sources = self.sources
        if entry.id >= len(sources):
            has = f"{len(sources)} lines (ids 0-{len(sources) - 1})" if sources else "no line"
            raise InputError(
                f"sentence id {entry.id} is out of range: the source "
                f"{display_name(self.source_path)} has {has}; the list and the source do not "
                "match",
                entry.path,
                entry.lineno,
            )
        text = sources[entry.id]
        if not text.strip():
            raise InputError(
                f"the source sentence of id {entry.id} (line {entry.id + 1} of "
                f"{display_name(self.source_path)}) is empty; the list and the source do not "
                "match",
                entry.path,
                entry.lineno,
            )
        return text


def chunk_label(index: int, chunk: RawListChunk | None) -> str:
    """A chunk as :class:`~phrasescore.runners.chunk_pool.WorkerDied` names it."""
    if chunk is None:
        return f"chunk {index}"
    return (
        f"chunk {chunk.index} (lines {chunk.first_lineno}-{chunk.first_lineno + chunk.lines - 1})"
    )
