"""Moses phrase tables, read and written as a stream (constant memory, any size).

A line is ``source ||| target ||| s1 s2 ... [||| alignment ||| counts ||| sparse ||| {{Key v}}]``.
What this module implements, and the Moses facts behind it:

* **Splitting.** Moses splits a line on ``|||`` and strips spaces and tabs around each field; the
  scores are separated by spaces or tabs. Only the first three fields are required. We find the
  first three ``|||`` with ``str.find`` and keep everything after the third verbatim (the
  :attr:`PhraseTableEntry.tail`): alignment, counts, sparse features, ``{{...}}`` properties and
  the empty ``||| |||`` endings of modern tables come back byte for byte.
* **Writing.** Some Moses tools split on ``" ||| "`` with single spaces (``CreateOnDiskPt``
  tokenises on single spaces), so :func:`format_entry` writes exactly ``" ||| "`` between the first
  three fields and one space between scores. New scores go after the existing ones, so the
  columns Moses' binarisers rank by (``processPhraseTableMin -rankscore 2``, p(e|f)) keep their
  index. A line written by Moses' own tools comes back byte-identical when no score is added.
* **Scores are probabilities.** Every Moses loader takes the natural log of every score:
  feature = max(ln x, -100). A stored 0 becomes -100 and a negative value becomes NaN, which breaks
  decoding without an error. So a score must be a finite number > 0 (values > 1, such as the
  old phrase-penalty column 2.718, are allowed). :func:`format_probability` is the one format for
  values we write; :func:`probability_from_logprob` turns a model's log-probability into one.
* **Number format.** New values are written with Python's shortest round-trip representation
  (``repr`` of a float64, ``"1"`` for 1.0): the value read back is exactly the value computed,
  and no shorter string would do that. Moses stores scores as 32-bit floats, for which 9
  significant digits would be enough; Moses' own tables use 6 (``%g``), which is lossy.
* **Line endings.** The line ending is kept as read: ``\\n`` stays ``\\n`` and ``\\r\\n`` stays
  ``\\r\\n`` (Moses' line reader drops a ``\\r`` before ``\\n``, so a ``\\r`` is never part of a
  score or of the tail). A last line without a newline is written *with* ``\\n``, so that written
  tables can be concatenated (and because Moses' ``util::FilePiece`` documents that a last line
  without a newline may never be read). A ``\\r`` anywhere else (a lone CR: old Mac endings)
  is refused naming its line (:func:`refuse_bare_carriage_return`).
* **Sorted input.** Binarisers need all lines of a source phrase to be contiguous
  (``LC_ALL=C sort``); we keep the input's line order exactly, and :func:`iter_source_groups`
  groups consecutive lines with the same source phrase (one encoder pass per group).

Errors (a line with fewer than 3 fields, a score count different from the first line's, a
non-numeric or non-positive score, an empty phrase, invalid UTF-8, a truncated or corrupt gzip
stream) are :class:`~phrasescore.errors.InputError` with the file name and 1-based line number.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from phrasescore.errors import InputError
from phrasescore.files.kinds import display_name
from phrasescore.files.outputs import AtomicOutput
from phrasescore.files.reading import ReadPosition, iter_lines
from phrasescore.moses.numbers import NotANumber, parse_number

log = logging.getLogger(__name__)

DELIMITER = "|||"
LOWEST_SCORE = -100.0
"""Moses floors every log score at -100 (``LOWEST_SCORE`` in Moses' TypeDef.h)."""

LOGPROB_TOLERANCE = 1e-6
"""Log-probabilities in (0, 1e-6] are rounding errors of a sum of log-probabilities: read as 0."""

_FIELD_SPACE = " \t"


class PhraseTableEntry(NamedTuple):
    """One phrase-table line, split the way Moses splits it."""

    lineno: int
    """1-based line number in the input."""
    source: str
    """Source phrase, spaces and tabs around it stripped."""
    target: str
    """Target phrase, spaces and tabs around it stripped."""
    scores: list[str]
    """The score tokens, verbatim."""
    tail: str | None
    """Raw text after the third ``|||`` (e.g. ``" 0-0 ||| 1 1 1 ||| |||"``), None if there is none."""
    newline: str
    """The line ending as read: ``"\\n"``, ``"\\r\\n"`` or ``""`` (last line without one)."""

    def counts(self) -> list[float] | None:
        """The counts field, the 2nd field after the scores (``count(target) count(source)
        [count(pair)]``, as ``train-model.perl`` writes it), or None when the line has none or
        it is not at least two numbers."""
        if self.tail is None:
            return None
        fields = self.tail.split(DELIMITER)
        if len(fields) < 2:
            return None
        try:
            counts = [parse_number(x) for x in fields[1].split()]
        except NotANumber:
            return None
        return counts if len(counts) >= 2 else None


class TableStats(NamedTuple):
    """What one streaming pass over a table found."""

    lines: int
    source_groups: int
    """Runs of consecutive lines with the same source phrase (= distinct sources when sorted)."""
    num_scores: int


_BARE_CR = re.compile("\r(?!\n)")


def refuse_bare_carriage_return(text: str, name: str, first_lineno: int = 1) -> None:
    """Refuse a carriage return that does not end a line (``\\r`` not followed by ``\\n``) in
    ``text``, lines of a table the first of which is line ``first_lineno``, naming the file and
    the line that holds it. Moses reads up to ``\\n`` only, so a lone ``\\r`` (old Mac line
    endings, a broken conversion) joins two entries into one line: the second pair hides in
    the first one's tail, and ``rescore`` would give it no column. CRLF endings
    are accepted. The one check of it: every table reader calls this, whatever reads the
    lines."""
    if "\r" not in text:
        return
    bare = _BARE_CR.search(text)
    if bare is not None:
        raise InputError(
            "a carriage return (\\r) inside the line: Moses would read it and the next line as "
            "one entry (CRLF endings are fine; turn lone CRs into newlines)",
            name,
            first_lineno + text.count("\n", 0, bare.start()),
        )


def read_phrase_table(
    path: str, validate: bool = True, position: ReadPosition | None = None
) -> Iterator[PhraseTableEntry]:
    """Yield the entries of a phrase table (plain or gzip by magic bytes; ``-`` is stdin).

    With ``validate`` (the default) every score is parsed and must be a finite number > 0;
    without it only the structure is checked (3 fields, the same number of scores on every line,
    non-empty phrases), which is faster when the table is known to be good. ``position``
    reports how far the file has been read (for progress bars).
    """
    lines = iter_lines(path, keep_ends=True, position=position)
    return parse_phrase_table_lines(lines, display_name(path), validate=validate)


def parse_phrase_table_lines(
    lines: Iterable[str],
    name: str,
    first_lineno: int = 1,
    num_scores: int = -1,
    validate: bool = True,
) -> Iterator[PhraseTableEntry]:
    """The entries of phrase-table ``lines`` (line endings kept), the first of which is line
    ``first_lineno`` of the file ``name``; :func:`read_phrase_table` reads a whole file with it.
    ``num_scores``: the scores every line must have (-1: as many as the first line has)."""
    for lineno, line in enumerate(lines, first_lineno):
        if line[-1:] == "\n":
            if line[-2:-1] == "\r":
                newline, body = "\r\n", line[:-2]
            else:
                newline, body = "\n", line[:-1]
        else:
            newline, body = "", line
        refuse_bare_carriage_return(body, name, lineno)
        entry, score_text = _entry(body, newline, name, lineno, num_scores, validate)
        num_scores = len(entry.scores)
        if validate:
            _check_scores(score_text, entry.scores, name, lineno)
        yield entry


def parse_phrase_table_chunk(
    text: str, name: str, first_lineno: int = 1, num_scores: int = -1, validate: bool = True
) -> list[PhraseTableEntry]:
    """The entries of ``text``, lines of a table decoded in one piece (``rescore``'s chunks),
    the first of which is line ``first_lineno``: the entries and errors of
    :func:`parse_phrase_table_lines`, faster: no copy of a line to cut its ending
    off, and the scores of the whole chunk checked in one pass (the lines one by one only to
    name the first bad one, so the first error in line order is the one raised)."""
    refuse_bare_carriage_return(text, name, first_lineno)
    pieces = text.split("\n")
    last = pieces.pop()  # "" when the text ends with a newline
    entries: list[PhraseTableEntry] = []
    score_texts: list[str] = []
    lineno = first_lineno
    try:
        for lineno, piece in enumerate(pieces, first_lineno):  # noqa: B007 - read in except
            if piece[-1:] == "\r":
                entry, score_text = _entry(piece[:-1], "\r\n", name, lineno, num_scores, validate)
            else:
                entry, score_text = _entry(piece, "\n", name, lineno, num_scores, validate)
            num_scores = len(entry.scores)
            entries.append(entry)
            score_texts.append(score_text)
        if last:
            lineno = first_lineno + len(pieces)
            entry, score_text = _entry(last, "", name, lineno, num_scores, validate)
            entries.append(entry)
            score_texts.append(score_text)
    except InputError:
        if validate:  # a bad score on an earlier line comes first
            _check_chunk_scores(entries, score_texts, name, first_lineno)
        raise
    if validate:
        _check_chunk_scores(entries, score_texts, name, first_lineno)
    return entries


def _entry(
    body: str, newline: str, name: str, lineno: int, num_scores: int, validate: bool = True
) -> tuple[PhraseTableEntry, str]:
    """The entry of one line without its ending, and its score field as written (for
    :func:`_check_scores`, which the caller runs); InputError for a line Moses cannot read.
    Errors in this order, whichever path reads the line: the fields, the score count, the
    scores (checked here first only when a phrase is empty, ``validate``), an empty phrase."""
    p1 = body.find(DELIMITER)
    p2 = body.find(DELIMITER, p1 + 3) if p1 >= 0 else -1
    if p2 < 0:
        fields = 1 if p1 < 0 else 2
        raise InputError(
            f"expected at least 3 fields separated by '|||' "
            f"(source ||| target ||| scores), found {fields}",
            name,
            lineno,
        )
    p3 = body.find(DELIMITER, p2 + 3)
    if p3 < 0:
        score_text = body[p2 + 3 :]
        tail = None
    else:
        score_text = body[p2 + 3 : p3]
        tail = body[p3 + 3 :]
    scores = score_text.split()
    if len(scores) != num_scores:
        if num_scores >= 0:
            raise InputError(
                f"expected {num_scores} scores (as on line 1), found {len(scores)}",
                name,
                lineno,
            )
        if not scores:
            raise InputError("no scores: the third field is empty", name, lineno)
    source = body[:p1].strip(_FIELD_SPACE)
    target = body[p1 + 3 : p2].strip(_FIELD_SPACE)
    if not source or not target:
        if validate:
            _check_scores(score_text, scores, name, lineno)
        which = "source" if not source else "target"
        raise InputError(f"empty {which} phrase", name, lineno)
    return PhraseTableEntry(lineno, source, target, scores, tail, newline), score_text


def _check_chunk_scores(
    entries: list[PhraseTableEntry], score_texts: list[str], name: str, first_lineno: int
) -> None:
    """:func:`_check_scores` of every line, in one pass when all are good (the common case)."""
    joined = " ".join(score_texts)
    if "n" not in joined and "N" not in joined and "_" not in joined and joined.isascii():
        try:
            values = list(map(float, joined.split()))
            if not values or (min(values) > 0.0 and max(values) < math.inf):
                return
        except ValueError:
            pass
    for entry, score_text in zip(entries, score_texts, strict=True):
        _check_scores(score_text, entry.scores, name, entry.lineno)


def _check_scores(text: str, scores: list[str], name: str, lineno: int) -> None:
    """Raise InputError unless every score is a finite number > 0, as Moses needs.

    The fast path parses all tokens at once; ``nan``/``inf`` (which contain an ``n``), ``1_0``
    and digits of other scripts (which Python's float() accepts and Moses does not) and a number
    beyond the float range (``1e999``, which float() makes infinity) take the slow path that
    names the token, read by :func:`~phrasescore.moses.numbers.parse_number`.
    """
    if "n" not in text and "N" not in text and "_" not in text and text.isascii():
        try:
            values = list(map(float, scores))
            if min(values) > 0.0 and max(values) < math.inf:
                return
        except ValueError:
            pass
    for index, token in enumerate(scores, 1):
        try:
            value = parse_number(token)
        except NotANumber as exc:
            raise InputError(exc.message(f"score {index}"), name, lineno) from None
        if math.isinf(value) and "n" not in token.lower():
            raise InputError(
                f"score {index} is {token}: beyond the largest number a float holds "
                "(1.8e308), it would be infinity; phrase-table scores must be finite",
                name,
                lineno,
            )
        if not math.isfinite(value):
            raise InputError(
                f"score {index} is not a finite number: {token!r}", name, lineno
            ) from None
        if value == 0.0:
            raise InputError(
                f"score {index} is {token}: Moses takes ln of every score, so 0 becomes -100 "
                "(ln 0, floored); phrase-table scores must be > 0",
                name,
                lineno,
            )
        if value < 0.0:
            raise InputError(
                f"score {index} is {token}: Moses takes ln of every score and ln of a negative "
                "number is NaN; phrase-table scores must be > 0",
                name,
                lineno,
            )


def format_entry(entry: PhraseTableEntry, new_scores: Sequence[str] = ()) -> str:
    """The output line for ``entry`` with ``new_scores`` appended after its scores.

    ``" ||| "`` between the first three fields, single spaces between scores, the tail verbatim,
    the line ending as read (``"\\n"`` when the input's last line had none).
    """
    scores = " ".join([*entry.scores, *new_scores]) if new_scores else " ".join(entry.scores)
    line = f"{entry.source} ||| {entry.target} ||| {scores}"
    if entry.tail is not None:
        line += " |||" + entry.tail
    return line + (entry.newline or "\n")


def format_probability(p: float) -> str:
    """The string written into a phrase-table column for probability ``p``, 0 < p <= 1.

    Shortest round-trip representation of the float64 (``repr``), ``"1"`` for 1.0; e.g.
    ``0.25 -> "0.25"``, ``exp(-100) -> "3.720075976020836e-44"``. Moses parses the exponent form
    (its own tables contain ``6.41067e-07``). Raises ValueError for p <= 0, p > 1 and NaN.
    Values below 1.18e-38 are subnormal as the 32-bit floats Moses stores (and below 1.4e-45
    they become 0, i.e. -100 after Moses' floor); :func:`probability_from_logprob` never goes
    below exp(-100) = 3.7e-44.
    """
    value = float(p)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"a phrase-table probability must be in (0, 1], got {p!r}")
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def probability_from_logprob(logp: float, floor: float = LOWEST_SCORE) -> float:
    """exp(max(logp, floor)): the probability to store for a natural-log score ``logp``.

    The floor is Moses' own (-100), so the stored value is never 0: exp(-100) ~ 3.7e-44 is a
    normal float64 (as a 32-bit float in Moses it is subnormal, which Moses reads correctly).
    A rounding error up to :data:`LOGPROB_TOLERANCE` above 0 gives 1; NaN and larger positive
    values (a probability above 1) raise ValueError.
    """
    value = float(logp)
    if value > 0.0 and value <= LOGPROB_TOLERANCE:
        value = 0.0
    if math.isnan(value) or value > 0.0:
        raise ValueError(f"a log-probability must be <= 0, got {logp!r}")
    return math.exp(max(value, floor))


def format_logprobs(logprobs: Iterable[float]) -> list[str]:
    """``format_probability(probability_from_logprob(v))`` of each natural-log score, the same
    strings in one loop (a table's whole column at once); ValueError as they raise it."""
    out = []
    append = out.append
    exp = math.exp
    for value in logprobs:
        value = float(value)
        if value > 0.0:
            if value > LOGPROB_TOLERANCE:
                raise ValueError(f"a log-probability must be <= 0, got {value!r}")
            value = 0.0
        elif value != value:
            raise ValueError(f"a log-probability must be <= 0, got {value!r}")
        text = repr(exp(value if value > LOWEST_SCORE else LOWEST_SCORE))
        append(text[:-2] if text.endswith(".0") else text)
    return out


def format_logprob_column(logprobs) -> list[str]:
    """:func:`format_logprobs` of an array, the same strings from C loops (a table's column at a time): the
    checks on the whole array (the first bad value raises as :func:`format_logprobs` raises),
    ``math.exp`` over the list, the floats' shortest round-trip text from one ``repr`` of the
    list (the ``repr`` of each float), ``"1.0"`` written ``"1"``."""
    import numpy as np

    values = np.asarray(logprobs, dtype=np.float64)
    if not len(values):
        return []
    if np.isnan(values).any() or (values > LOGPROB_TOLERANCE).any():
        return format_logprobs(values.tolist())  # raises for the first bad value
    values = np.where(values > 0.0, 0.0, values)
    values = np.where(values > LOWEST_SCORE, values, LOWEST_SCORE)
    return _float_texts(list(map(math.exp, values.tolist())), strip_one=True)


def _float_texts(values: list[float], strip_one: bool = False) -> list[str]:
    """``repr`` of each float, from one ``repr`` of the list; ``strip_one``: values in (0, 1],
    of which only 1.0 is written with ``.0`` (``"1"``)."""
    text = repr(values)[1:-1]
    if strip_one and "1.0" in text:
        text = f", {text},".replace(", 1.0,", ", 1,").replace(", 1.0,", ", 1,")[2:-1]
    return text.split(", ")


def format_float_column(values) -> list[str]:
    """``repr(float(v))`` of each value of an array (``rescore --logprob``'s column)."""
    import numpy as np

    return _float_texts(np.asarray(values, dtype=np.float64).tolist())


def iter_source_groups(entries: Iterable[PhraseTableEntry]) -> Iterator[list[PhraseTableEntry]]:
    """Yield lists of consecutive entries with the same source phrase, in input order."""
    group: list[PhraseTableEntry] = []
    for entry in entries:
        if group and entry.source != group[0].source:
            yield group
            group = []
        group.append(entry)
    if group:
        yield group


class PhraseTableWriter:
    """Write phrase-table lines atomically (``-`` is stdout, a ``.gz`` name is gzip).

    ``with PhraseTableWriter(path) as out: out.write(entry, [format_probability(p)])``; the file
    appears under ``path`` only when the ``with`` block completes without an exception.
    """

    def __init__(self, path: str):
        self.path = path
        self.lines = 0
        self._atomic = AtomicOutput(path)
        self._out = None

    def __enter__(self) -> PhraseTableWriter:
        self._out = self._atomic.__enter__()
        return self

    def write(self, entry: PhraseTableEntry, new_scores: Sequence[str] = ()) -> None:
        self._out.write(format_entry(entry, new_scores))
        self.lines += 1

    def __exit__(self, exc_type, exc, tb):
        return self._atomic.__exit__(exc_type, exc, tb)


def write_phrase_table(path: str, items: Iterable[tuple[PhraseTableEntry, Sequence[str]]]) -> int:
    """Write ``(entry, new_scores)`` pairs to ``path`` atomically; return the number of lines."""
    with PhraseTableWriter(path) as out:
        for entry, new_scores in items:
            out.write(entry, new_scores)
    return out.lines


def check_phrase_table(path: str) -> TableStats:
    """Read and validate a whole table in one streaming pass."""
    return _count(read_phrase_table(path), None)


def copy_phrase_table(path: str, out_path: str) -> TableStats:
    """Copy a table through the reader and writer (the format round trip), validating it.

    The output appears only if the whole input was valid.
    """
    with PhraseTableWriter(out_path) as out:
        stats = _count(read_phrase_table(path), out)
    return stats


def _count(entries: Iterable[PhraseTableEntry], out: PhraseTableWriter | None) -> TableStats:
    lines = groups = num_scores = 0
    previous = None
    for entry in entries:
        lines += 1
        if entry.source != previous:
            groups += 1
            previous = entry.source
            num_scores = len(entry.scores)
        if out is not None:
            out.write(entry)
    log.debug("%d lines, %d source groups, %d scores", lines, groups, num_scores)
    return TableStats(lines, groups, num_scores)
