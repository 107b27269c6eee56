"""A chunk of a phrase table as arrays: the lines' fields found with numpy over the chunk's
bytes, the new columns spliced into those bytes in bulk.

:func:`parse_chunk` reads a chunk (whole lines, as :class:`~phrasescore.files.LineBlocks` cuts
them) into a :class:`TableChunk`: per line its byte span, the spans of its source and target
phrases, and the position after its last score, where new scores go. No Python object is made
per line or per score for that: the ``|||`` of every line are found by one scan of the bytes
(``numpy.searchsorted`` over the positions of ``|||`` gives each line's first three, as
``str.find`` does), and the scores are checked by a vectorised grammar (below).

**Written as read.** A line whose layout is the one :func:`~phrasescore.moses.phrase_table.format_entry`
writes (``src ||| tgt ||| s1 s2 ...`` with single spaces, no space or tab around a phrase) is
written back as its own bytes with ``" " + new scores`` inserted after its last score
(:func:`splice`): the same bytes as ``format_entry(entry, new)``. A line of any other layout
(tabs, runs of spaces, a score the grammar does not take, a bare CR) is parsed by
:func:`~phrasescore.moses.phrase_table.parse_phrase_table_chunk` and written by ``format_entry``,
as the line-by-line path does: the output bytes are that path's for every input.

**Errors.** When any line is not of that layout, or a score is not one the grammar takes, the
whole chunk goes through :func:`~phrasescore.moses.phrase_table.parse_phrase_table_chunk`, which
raises the first error in line order with the file name and line number, as the line-by-line
path does (invalid UTF-8 is found by one ``bytes.decode`` of the chunk,
:func:`~phrasescore.files.decode_text`).

**Scores.** A score is taken by the vectorised check only if it is ``D* [. D*] [(e|E) [+|-] D+]``
with at least one and at most 200 digits before the exponent, one of them not 0, and 1 or 2
exponent digits (checked per exponent letter, sign and point, and one ``reduceat`` per score): such a string is a finite number > 0 for Python's ``float`` (no overflow to
infinity, no underflow to 0), which is what Moses needs (phrase_table.py). Anything else (a
sign before the number, ``nan``, ``1e999``, ``1_0``) is decided by the line-by-line check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from phrasescore.files.reading import decode_text
from phrasescore.moses.phrase_table import (
    PhraseTableEntry,
    format_entry,
    parse_phrase_table_chunk,
)

_LF, _CR, _SP, _TAB, _BAR, _DOT = 10, 13, 32, 9, 124, 46

_FIELD_SPACE = np.zeros(256, dtype=bool)
_FIELD_SPACE[[_SP, _TAB]] = True

MAX_MANTISSA_DIGITS = 200
MAX_EXPONENT_DIGITS = 2


@dataclass
class TableChunk:
    """A chunk of table lines as arrays (see the module docstring). Offsets are into
    :attr:`data`; a line ``i`` in :attr:`entries` (its layout not the written one) has
    meaningless spans and is written by ``format_entry``."""

    data: bytes
    name: str
    first_lineno: int
    num_scores: int
    line_start: np.ndarray  # int64 [n]
    line_end: np.ndarray  # int64 [n]: after the line's ending ("\n" or "\r\n"), or end of data
    src_start: np.ndarray  # int64 [n]
    src_end: np.ndarray
    tgt_start: np.ndarray
    tgt_end: np.ndarray
    insert_at: np.ndarray  # int64 [n]: after the last score
    newline_missing: bool
    """The last line has no line ending (written with ``"\\n"``)."""
    entries: dict[int, PhraseTableEntry] = field(default_factory=dict)
    """The lines parsed one by one (index in the chunk -> entry)."""
    _sources: list[bytes] | None = None
    _targets: list[bytes] | None = None
    _runs: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.line_start)

    # ------------------------------------------------------------------ phrases as bytes
    def sources(self) -> list[bytes]:
        """Each line's source phrase (UTF-8, spaces and tabs around it stripped)."""
        if self._sources is None:
            self._sources = self._phrases(self.src_start, self.src_end, "source")
        return self._sources

    def targets(self) -> list[bytes]:
        """Each line's target phrase."""
        if self._targets is None:
            self._targets = self._phrases(self.tgt_start, self.tgt_end, "target")
        return self._targets

    def _phrases(self, start: np.ndarray, end: np.ndarray, which: str) -> list[bytes]:
        """The bytes of ``[start, end)`` of every line: :meth:`phrase_text`'s text, split."""
        if len(start) == 0:
            return []
        phrases = self._span_text(start, end).split(b"\n")
        phrases.pop()
        for index, entry in self.entries.items():
            phrases[index] = getattr(entry, which).encode("utf-8")
        return phrases

    def phrase_text(self, which: str, rows: np.ndarray | None = None) -> bytes:
        """The ``which`` ("source" or "target") phrases of lines ``rows`` (all lines by
        default), each followed by ``"\\n"``, as one text (what
        :meth:`~phrasescore.text.phrase_ids.PhraseIds.encode` reads)."""
        if self.entries:  # a line parsed one by one: its phrase is in its entry
            phrases = self.sources() if which == "source" else self.targets()
            if rows is not None:
                phrases = [phrases[i] for i in rows.tolist()]
            return b"".join(p + b"\n" for p in phrases)
        start, end = (
            (self.src_start, self.src_end) if which == "source" else (self.tgt_start, self.tgt_end)
        )
        if rows is not None:
            start, end = start[rows], end[rows]
        return self._span_text(start, end) if len(start) else b""

    def _span_text(self, start: np.ndarray, end: np.ndarray) -> bytes:
        """The bytes of ``[start, end)`` of each span, each followed by ``"\\n"``, cut out of
        the chunk in one masked copy (a phrase holds no newline)."""
        buf = np.frombuffer(self.data, dtype=np.uint8)
        # each span and the byte after it (where a "\n" goes), gathered
        length = end - start + 1
        picked = buf[_spans_index(start, length, int(length.sum()))]
        picked[np.cumsum(length) - 1] = _LF
        return picked.tobytes()

    def source_strings(self) -> list[str]:
        return [s.decode("utf-8") for s in self.sources()]

    def target_strings(self) -> list[str]:
        return [t.decode("utf-8") for t in self.targets()]

    def source_runs(self) -> np.ndarray:
        """Indices of the lines that start a run of equal sources (line 0 first)."""
        if self._runs is None:
            sources = self.sources()
            keys = np.empty(len(sources), dtype=object)
            keys[:] = sources
            change = np.flatnonzero(keys[1:] != keys[:-1]) + 1
            self._runs = np.concatenate(([0], change)).astype(np.int64) if sources else change
        return self._runs

    def phrase_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """Bytes of each line's source and target phrase (for the length limit's quick test)."""
        src = self.src_end - self.src_start
        tgt = self.tgt_end - self.tgt_start
        for index, entry in self.entries.items():
            src[index] = len(entry.source.encode("utf-8"))
            tgt[index] = len(entry.target.encode("utf-8"))
        return src, tgt


def _at(array: np.ndarray, index: np.ndarray, fill: int = 0) -> np.ndarray:
    """``array[index]`` where ``index`` is in range, ``fill`` elsewhere."""
    ok = (index >= 0) & (index < len(array))
    out = np.full(len(index), fill, dtype=array.dtype)
    out[ok] = array[index[ok]]
    return out


def parse_chunk(
    data: bytes, name: str, first_lineno: int = 1, num_scores: int = -1, validate: bool = True
) -> TableChunk:
    """The :class:`TableChunk` of ``data`` (whole lines of a table, the first of which is line
    ``first_lineno`` of ``name``): errors and accepted input those of
    :func:`~phrasescore.moses.phrase_table.parse_phrase_table_chunk` (module docstring)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    if len(buf) and buf.max() >= 0x80:  # ASCII is UTF-8
        decode_text(data, name, first_lineno)  # invalid UTF-8: the line named
    size = len(buf)
    line_start, line_end, body_end, newline_missing = _lines(buf)
    # the first three "|||" of each line, as str.find finds them
    bars = buf == _BAR
    triples = np.flatnonzero(bars[:-2] & bars[1:-1] & bars[2:]) if size >= 3 else np.zeros(0)
    triples = np.asarray(triples, dtype=np.int64)
    big = np.int64(size + 10)
    padded = np.concatenate((triples, [big]))
    p1 = padded[np.searchsorted(triples, line_start)]
    p2 = padded[np.searchsorted(triples, p1 + 3)]
    p3 = padded[np.searchsorted(triples, p2 + 3)]
    has3 = p3 < body_end
    fast = p2 < body_end
    # the written layout: "src ||| tgt ||| s1 s2 ...[ ||| tail]"
    src_start, src_end = line_start, p1 - 1
    tgt_start, tgt_end = p1 + 4, p2 - 1
    sc_start = p2 + 4
    sc_end = np.where(has3, p3 - 1, body_end)
    fast &= (src_end > src_start) & (tgt_end > tgt_start) & (sc_end > sc_start)
    for position in (p1 - 1, p1 + 3, p2 - 1, p2 + 3):
        fast &= _at(buf, position) == _SP
    fast &= np.where(has3, _at(buf, p3 - 1) == _SP, True)
    for position in (src_start, src_end - 1, tgt_start, tgt_end - 1):
        fast &= ~_FIELD_SPACE[_at(buf, position)]
    fast &= (_at(buf, sc_start) != _SP) & (_at(buf, sc_end - 1) != _SP)
    # a "\r" anywhere but before the final "\n": the line-by-line parser decides
    carriage = np.flatnonzero(buf == _CR)
    if len(carriage):
        bare = carriage[_at(buf, carriage + 1) != _LF]
        if len(bare):
            fast[np.searchsorted(line_start, bare, side="right") - 1] = False
    num_scores = _check_score_fields(buf, fast, sc_start, sc_end, num_scores, validate)
    entries: dict[int, PhraseTableEntry] = {}
    if not fast.all():
        # the line-by-line parser: its errors, and the lines of another layout
        text = decode_text(data, name, first_lineno)
        parsed = parse_phrase_table_chunk(text, name, first_lineno, num_scores, validate)
        entries = {int(i): parsed[i] for i in np.flatnonzero(~fast)}
        if num_scores < 0 and parsed:
            num_scores = len(parsed[0].scores)
    insert_at = np.where(fast, sc_end, line_start)
    # the spans of a line parsed one by one are empty (its entry has the phrases)
    src_start, src_end, tgt_start, tgt_end = (
        np.where(fast, span, line_start) for span in (src_start, src_end, tgt_start, tgt_end)
    )
    return TableChunk(
        data,
        name,
        first_lineno,
        num_scores,
        line_start,
        line_end,
        src_start,
        src_end,
        tgt_start,
        tgt_end,
        insert_at,
        newline_missing,
        entries,
    )


def _lines(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Each line's start, end (after its newline) and body end (before its "\\n" or
    "\\r\\n"), and whether the last line lacks its newline."""
    size = len(buf)
    newlines = np.flatnonzero(buf == _LF)
    newline_missing = bool(size) and buf[-1] != _LF
    line_start = np.concatenate(([0], newlines + 1)).astype(np.int64)
    line_end = np.concatenate((newlines + 1, [size])).astype(np.int64)
    if not newline_missing:
        line_start, line_end = line_start[:-1], line_end[:-1]
    body_end = line_end.copy()
    ends_lf = _at(buf, line_end - 1) == _LF
    body_end[ends_lf] -= 1
    ends_crlf = ends_lf & (body_end > line_start) & (_at(buf, body_end - 1) == _CR)
    body_end[ends_crlf] -= 1
    return line_start, line_end, body_end, bool(newline_missing)


def _check_score_fields(
    buf: np.ndarray,
    fast: np.ndarray,
    sc_start: np.ndarray,
    sc_end: np.ndarray,
    num_scores: int,
    validate: bool,
) -> int:
    """Clear ``fast`` (in place) for the lines whose score field is not only score bytes and
    single spaces, ``num_scores`` numbers (-1: as many as the first line has), each one a
    number where ``validate``; returns ``num_scores``."""
    n = len(fast)
    field_len = np.where(fast, sc_end - sc_start, 0)
    field_at = np.concatenate(([0], np.cumsum(field_len)))
    scores = buf[_spans_index(sc_start, field_len, int(field_at[-1]))]
    kind = _CLASS[scores]

    def line_of(positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(field_at, positions, side="right") - 1

    other = np.flatnonzero(kind == _OTHER)
    if len(other):
        fast[line_of(other)] = False
    spaces = np.flatnonzero(kind == _SPACE)
    per_line = np.bincount(line_of(spaces), minlength=n)
    if num_scores < 0 and n and fast[0]:
        num_scores = int(per_line[0]) + 1
    fast &= per_line + 1 == num_scores
    double = spaces[1:][np.diff(spaces) == 1]
    if len(double):
        fast[line_of(double)] = False
    if validate and fast.any():
        bad = _bad_scores(kind, field_at, field_len, spaces)
        if len(bad):
            fast[line_of(bad)] = False
    return num_scores


def _spans_index(start: np.ndarray, length: np.ndarray, total: int) -> np.ndarray:
    """The indices of the spans ``[start, start + length)`` laid end to end."""
    at = np.cumsum(length) - length
    return np.repeat(start - at, length) + np.arange(total, dtype=np.int64)


# the bytes of a score field, by class
_OTHER, _SPACE, _ZERO, _NONZERO_DIGIT, _POINT, _EXPONENT, _PLUS_MINUS = range(7)
_CLASS = np.full(256, _OTHER, dtype=np.uint8)
_CLASS[_SP] = _SPACE
_CLASS[ord("0")] = _ZERO
_CLASS[ord("1") : ord("9") + 1] = _NONZERO_DIGIT
_CLASS[_DOT] = _POINT
_CLASS[[ord("e"), ord("E")]] = _EXPONENT
_CLASS[[ord("+"), ord("-")]] = _PLUS_MINUS


def _bad_scores(
    kind: np.ndarray, field_at: np.ndarray, field_len: np.ndarray, spaces: np.ndarray
) -> np.ndarray:
    """Positions (in the score fields laid end to end, classes ``kind``; field i at
    ``field_at[i]``, single spaces ``spaces`` between scores) in scores that the grammar of
    the module docstring does not take: ``M [e [+|-] D [D]]`` where the mantissa ``M`` is
    digits with at most one point and a digit that is not 0, all of it at most 200 bytes.
    Checked per exponent letter, sign and point (few), and per score only the mantissa's
    nonzero digits (one ``reduceat``)."""
    size = len(kind)
    if not size:
        return np.zeros(0, dtype=np.int64)
    # a score ends at a space or at its field's end
    boundary = np.zeros(size + 8, dtype=bool)
    boundary[spaces] = True
    boundary[field_at[1:][field_len > 0]] = True
    boundary[size:] = True
    padded = np.concatenate((kind, np.full(8, _OTHER, dtype=np.uint8)))
    starts = np.zeros(size, dtype=bool)
    starts[field_at[:-1][field_len > 0]] = True
    starts[spaces + 1] = True  # a field never ends with a space
    tok_start = np.flatnonzero(starts)
    bad = [tok_start[np.diff(np.concatenate((tok_start, [size]))) > MAX_MANTISSA_DIGITS + 8]]
    # each exponent letter: [+|-] then 1 or 2 digits, then the score's end
    exps = np.flatnonzero(kind == _EXPONENT)
    exp_nonzero = np.zeros(len(exps), dtype=np.int64)
    if len(exps):
        q = exps + 1 + (padded[exps + 1] == _PLUS_MINUS)
        digit = (padded == _ZERO) | (padded == _NONZERO_DIGIT)
        one = digit[q] & boundary[q + 1]
        two = digit[q] & digit[q + 1] & boundary[q + 2]
        bad.append(exps[~(one | two)])
        exp_nonzero = (padded[q] == _NONZERO_DIGIT).astype(np.int64) + (
            two & (padded[q + 1] == _NONZERO_DIGIT)
        )
    # each sign right after an exponent letter
    signs = np.flatnonzero(kind == _PLUS_MINUS)
    if len(signs):
        bad.append(signs[starts[signs] | (padded[signs - 1] != _EXPONENT)])
    # at most one point a score (a point after the exponent fails the exponent's check)
    points = np.flatnonzero(kind == _POINT)
    if len(points) > 1:
        score_of = np.searchsorted(tok_start, points, side="right")
        bad.append(points[1:][np.diff(score_of) == 0])
    # a nonzero digit in the mantissa: value > 0
    nonzero = np.add.reduceat((kind == _NONZERO_DIGIT).view(np.uint8), tok_start, dtype=np.int64)
    if len(exps):
        np.subtract.at(nonzero, np.searchsorted(tok_start, exps, side="right") - 1, exp_nonzero)
    bad.append(tok_start[nonzero < 1])
    return np.concatenate(bad)


# ---------------------------------------------------------------------------- writing
def splice(chunk: TableChunk, columns: list[list[str]]) -> bytes:
    """The chunk's output lines: each line with ``" " + " ".join(new)`` after its last score
    (``new``: its values in ``columns``, one list per column, ASCII), the same bytes as
    :func:`~phrasescore.moses.phrase_table.format_entry` writes; lines parsed one by one are
    written by it.

    One ``bytes.join`` of the chunk's pieces between insertion points and the inserts: on the
    2-core machine 0.27 us/line against 0.80 for the same splice as numpy scatters (two index
    arrays as long as the chunk; docs/benchmarks.md "Ids as arrays")."""
    n = len(chunk)
    data = chunk.data
    if n == 0:
        return b""
    if not columns:
        inserts = [b""] * n
    elif len(columns) == 1:  # b" v" each, cut from one text (values hold no NUL)
        inserts = ("\0 " + "\0 ".join(columns[0])).encode("ascii").split(b"\0")[1:]
    else:
        inserts = [(" " + " ".join(row)).encode("ascii") for row in zip(*columns, strict=True)]
    at = chunk.insert_at.tolist()
    after = at  # where the piece after each line's insert starts
    if chunk.entries:  # a line of another layout: written whole by format_entry
        after = list(at)
        line_end = chunk.line_end
        for index, entry in chunk.entries.items():
            inserts[index] = format_entry(entry, [column[index] for column in columns]).encode(
                "utf-8"
            )
            after[index] = int(line_end[index])
    pieces: list = [None] * (2 * n + 1)
    pieces[0::2] = list(map(data.__getitem__, map(slice, [0, *after], [*at, len(data)])))
    pieces[1::2] = inserts
    if chunk.newline_missing and (n - 1) not in chunk.entries:
        pieces.append(b"\n")
    return b"".join(pieces)
