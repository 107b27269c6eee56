"""Moses n-best lists: read them as a stream, add a feature to a line, recompute totals.

A line is ``id ||| hypothesis ||| features ||| total [||| segmentation] [||| alignment]``. The
Moses facts this module implements:

* **Layout.** Moses writes ``id ||| `` then the hypothesis words each followed by a space, then
  ``" |||"``, then every feature as ``" Name= v1 v2"``, then ``" ||| "`` and the total. So the
  feature field reads ``" Name0= v ... Name1= v "`` with one space at each end. Older decoders
  wrote ``0||| words  ||| d= ... lm= ... tm= ... w= ... ||| total`` (labels ``d lm tm w``), and
  older still ``d: ... lm: ...``. The parser accepts all three; it keeps every field verbatim.
* **Adding a feature.** :func:`add_feature` inserts ``" Name= value"`` right after the last
  feature value, before the field's trailing spaces; every other byte of the line is unchanged.
  The total is left as it is (MERT recomputes scores from features and weights; use
  :func:`total_score` to recompute it). The label is always written ``Name=``: MERT's extractor
  recognises labels by their final ``=`` only. :func:`join_added_features` joins the features
  that several lists added to the same list (each scored by one model) into one list.
* **Feature names.** MERT's extractor takes a name containing ``_`` for a *sparse* feature (it
  then expects exactly one value and gives it no dense weight), so a dense feature name must not
  contain ``_`` (use e.g. ``RNNEncDec0``). A name already in the line is refused too.
* **Values.** Moses prints feature values with C++'s default stream format: ``%g`` with 6
  significant digits (``-2.3502``, ``-17.852``, ``2.99969``); :func:`format_feature_value` writes
  new values the same way (``-0`` is written ``0``), deterministic for a given float.
* **Grouping.** The hypotheses of one sentence id are contiguous; :func:`iter_nbest_groups`
  yields them together and refuses an id that comes back after another id.
* **Weights.** :func:`read_weights` reads the weights of a moses.ini or weights file with
  :func:`phrasescore.moses.ini.read_weights` (modern ``[weight]`` lines and the old per-model
  sections, mapped to the labels of old n-best lists). A moses total is the dot product of
  features and weights (:func:`total_score`); :func:`with_total` writes a new total into a
  line's total field.

Line endings are kept as read; a last line without a newline is written with ``\\n``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from phrasescore.errors import InputError
from phrasescore.files.kinds import display_name
from phrasescore.files.reading import iter_lines
from phrasescore.moses import ini
from phrasescore.moses.numbers import NotANumber, parse_number

DELIMITER = "|||"

_NAME_OK = re.compile(r"[A-Za-z][A-Za-z0-9.\-]*\Z")


class NBestEntry(NamedTuple):
    """One n-best line; the raw fields keep every byte of the line."""

    lineno: int
    id: int
    """Sentence id (0-based in Moses)."""
    hypothesis: str
    """The translation, spaces around it stripped."""
    features: str
    """Raw feature field, between the 2nd and 3rd ``|||`` (e.g. ``" LM0= -22.0 WordPenalty0= -13 "``)."""
    total: str
    """Raw total field, between the 3rd and 4th ``|||`` (or to the end)."""
    rest: str | None
    """Raw text after the 4th ``|||`` (segmentation, alignment), None if there is none."""
    newline: str
    """The line ending as read: ``"\\n"``, ``"\\r\\n"`` or ``""``."""
    head: str
    """Raw text up to and including the 2nd ``|||`` (``"0 ||| words |||"``)."""
    path: str
    """Display name of the file, for messages."""

    def line(self, features: str | None = None) -> str:
        """The line as read (or with another feature field), with its line ending."""
        text = f"{self.head}{self.features if features is None else features}|||{self.total}"
        if self.rest is not None:
            text += "|||" + self.rest
        return text + (self.newline or "\n")

    def parsed_features(self) -> list[tuple[str, list[float]]]:
        """:func:`parse_features` of this line, errors naming the file and line."""
        return parse_features(self.features, self.path, self.lineno)


def read_nbest(path: str) -> Iterator[NBestEntry]:
    """Yield the entries of an n-best list (plain or gzip by magic bytes; ``-`` is stdin)."""
    return parse_nbest_lines(iter_lines(path, keep_ends=True), display_name(path))


def parse_nbest_lines(
    lines: Iterable[str], name: str, first_lineno: int = 1
) -> Iterator[NBestEntry]:
    """The entries of n-best lines (line endings kept, the first being line ``first_lineno``
    of the file ``name``): every field checked, an error naming the file and line."""
    for lineno, line in enumerate(lines, first_lineno):
        if line[-1:] == "\n":
            newline = "\r\n" if line[-2:-1] == "\r" else "\n"
            body = line[: -len(newline)]
        else:
            newline, body = "", line
        positions = []
        start = 0
        while len(positions) < 4:
            found = body.find(DELIMITER, start)
            if found < 0:
                break
            positions.append(found)
            start = found + 3
        if len(positions) < 3:
            raise InputError(
                "expected at least 4 fields separated by '|||' "
                f"(id ||| hypothesis ||| features ||| total), found {len(positions) + 1}",
                name,
                lineno,
            )
        p1, p2, p3 = positions[:3]
        id_text = body[:p1].strip()
        if not (id_text.isascii() and id_text.isdigit()):
            raise InputError(
                f"the sentence id must be a non-negative integer, found {id_text!r}", name, lineno
            )
        end = positions[3] if len(positions) > 3 else len(body)
        parse_features(body[p2 + 3 : p3], name, lineno)  # a non-numeric value is an error here
        total = body[p3 + 3 : end]
        try:
            parse_number(total.strip())
        except NotANumber as exc:
            raise InputError(exc.message("the total score"), name, lineno) from None
        yield NBestEntry(
            lineno=lineno,
            id=int(id_text),
            hypothesis=body[p1 + 3 : p2].strip(),
            features=body[p2 + 3 : p3],
            total=total,
            rest=body[end + 3 :] if len(positions) > 3 else None,
            newline=newline,
            head=body[: p2 + 3],
            path=name,
        )


def line_sentence_id(line: bytes) -> int | None:
    """The sentence id of a raw n-best line (what cuts a list into whole sentences without
    parsing it); None where the line has no valid id (its parse refuses it, naming the line)."""
    head = line.split(DELIMITER.encode(), 1)[0].decode("utf-8", "replace").strip()
    return int(head) if head.isascii() and head.isdigit() else None


def iter_nbest_groups(entries: Iterable[NBestEntry]) -> Iterator[list[NBestEntry]]:
    """Yield the hypotheses of each sentence id together (they must be contiguous)."""
    seen: set[int] = set()
    group: list[NBestEntry] = []
    for entry in entries:
        if group and entry.id != group[0].id:
            yield group
            group = []
        if not group:
            if entry.id in seen:
                raise InputError(
                    f"the hypotheses of sentence {entry.id} are not contiguous "
                    "(the id comes back after another id)",
                    entry.path,
                    entry.lineno,
                )
            seen.add(entry.id)
        group.append(entry)
    if group:
        yield group


def parse_features(
    text: str, path: str | None = None, line: int | None = None
) -> list[tuple[str, list[float]]]:
    """``" A= 1 2 B= 3"`` -> ``[("A", [1.0, 2.0]), ("B", [3.0])]``, in order of appearance.

    Labels end in ``=`` (or ``:`` in old lists); values before any label get the name ``""``.
    """
    features: list[tuple[str, list[float]]] = []
    values: list[float] | None = None
    for token in text.split():
        if token[-1] in "=:":
            values = []
            features.append((token[:-1], values))
            continue
        if values is None:
            values = []
            features.append(("", values))
        try:
            values.append(parse_number(token))
        except NotANumber as exc:
            raise InputError(exc.message("feature value"), path, line) from None
    return features


def check_feature_name(name: str) -> None:
    """Refuse a name MERT or Moses would misread (InputError)."""
    if "_" in name:
        raise InputError(
            f"feature name {name!r} contains '_': MERT takes such a name for a sparse feature; "
            "use a name such as 'RNNEncDec0'"
        )
    if not _NAME_OK.match(name):
        raise InputError(
            f"feature name {name!r} is not valid: it must start with a letter and contain only "
            "letters, digits, '.' and '-'"
        )


def format_feature_value(value: float) -> str:
    """A feature value as Moses prints one: ``%g``, 6 significant digits, ``0`` for -0."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"a feature value must be finite, got {value!r}")
    text = f"{number:g}"
    return "0" if text == "-0" else text


def format_nbest_line(
    sentence_id: int, hypothesis: str, features: Iterable[tuple[str, float]], total: float
) -> str:
    """A new n-best line ``id ||| hypothesis ||| Name= v ... ||| total`` (with ``\\n``), values
    in Moses' format (:func:`format_feature_value`); what ``phrasescore translate --nbest``
    writes. Check feature names once with :func:`check_feature_name`."""
    fields = " ".join(f"{name}= {format_feature_value(value)}" for name, value in features)
    return f"{sentence_id} ||| {hypothesis} ||| {fields} ||| {format_feature_value(total)}\n"


def with_sentence_id(entry: NBestEntry, sentence_id: int) -> NBestEntry:
    """``entry`` as a line of sentence ``sentence_id`` (a part of a list numbered from 0, as
    Moses' ``extractor`` reads it against the part's reference lines); every byte after the id
    field kept."""
    after = entry.head.split(DELIMITER, 1)[1]
    return entry._replace(id=sentence_id, head=f"{sentence_id} {DELIMITER}{after}")


def add_feature(entry: NBestEntry, name: str, value: float) -> str:
    """The line of ``entry`` with ``name= value`` added after its last feature value.

    Everything else is byte-identical, the total included. Raises InputError for a name with
    ``_`` or a name already in the line.
    """
    return with_feature(entry, name, value).line()


def with_feature(entry: NBestEntry, name: str, value: float) -> NBestEntry:
    """``entry`` with ``name= value`` added after its last feature value (see
    :func:`add_feature`); an entry again, so that several features can be added."""
    check_feature_name(name)
    labels = {token[:-1] for token in entry.features.split() if token[-1] in "=:"}
    if name in labels:
        raise InputError(f"feature {name!r} is already in this line", entry.path, entry.lineno)
    features = entry.features
    end = len(features.rstrip())
    features = f"{features[:end]} {name}= {format_feature_value(value)}{features[end:]}"
    return entry._replace(features=features)


def added_features(base: NBestEntry, scored: NBestEntry) -> str:
    """The ``" Name= v"`` text that ``scored`` carries after ``base``'s last feature value:
    ``scored`` must be ``base``'s line with features added (:func:`with_feature`), every other
    byte the same; any other line is an :class:`InputError` naming ``scored``'s file and line."""
    end = len(base.features.rstrip())
    head, tail = base.features[:end], base.features[end:]
    features = scored.features
    added = features[end : len(features) - len(tail)]
    if (
        scored.head != base.head
        or scored.total != base.total
        or scored.rest != base.rest
        or not features.startswith(head)
        or not features.endswith(tail)
        or not added.startswith(" ")
        or len(features) != end + len(added) + len(tail)
    ):
        raise InputError(
            f"not line {base.lineno} of {base.path} with features added",
            scored.path,
            scored.lineno,
        )
    return added


def join_added_features(base: str, scored: list[str]) -> Iterator[str]:
    """The lines of the n-best list ``base`` with the features that each list of ``scored``
    (``base`` with one or more features added, e.g. by ``phrasescore nbest -m``) adds to it, in
    the order of ``scored``: the bytes that adding them all to ``base`` one after the other
    writes. A list of ``scored`` that is not ``base`` with features added, line for line, is an
    :class:`InputError` naming its file and line."""
    readers = [read_nbest(path) for path in scored]
    lineno = 0
    for entry in read_nbest(base):
        lineno = entry.lineno
        added = []
        for path, reader in zip(scored, readers, strict=True):
            other = next(reader, None)
            if other is None:
                raise InputError(
                    f"ends before line {lineno} of {display_name(base)}", display_name(path)
                )
            added.append(added_features(entry, other))
        end = len(entry.features.rstrip())
        yield entry.line(entry.features[:end] + "".join(added) + entry.features[end:])
    for path, reader in zip(scored, readers, strict=True):
        if next(reader, None) is not None:
            raise InputError(
                f"has more lines than {display_name(base)} ({lineno})", display_name(path)
            )


def with_total(entry: NBestEntry, total: float) -> NBestEntry:
    """``entry`` with ``total`` in its total field, written as Moses writes a number
    (:func:`format_feature_value`), the field's spaces kept (one space before it when it had
    none)."""
    raw = entry.total
    lead = raw[: len(raw) - len(raw.lstrip())] or " "
    trail = raw[len(raw.rstrip()) :]
    return entry._replace(total=f"{lead}{format_feature_value(total)}{trail}")


def read_weights(path: str) -> dict[str, list[float]]:
    """Weights by feature name from a moses.ini or a file of ``Name= w1 w2`` lines (``-`` is
    stdin), read by :func:`phrasescore.moses.ini.read_weights`, the one moses.ini reader."""
    text = "".join(iter_lines(path, keep_ends=True))
    return ini.read_weights(text, display_name(path))


def total_score(features: list[tuple[str, list[float]]], weights: dict[str, list[float]]) -> float:
    """Sum over features of values x weights, as Moses computes the total of a hypothesis.

    A sparse feature (name with ``_``) without a weight counts 0, as in Moses; a dense feature
    without weights, or with a different number of weights, is an InputError.
    """
    values_by_name: dict[str, list[float]] = {}
    for name, values in features:
        values_by_name.setdefault(name, []).extend(values)
    total = 0.0
    for name, values in values_by_name.items():
        feature_weights = weights.get(name)
        if feature_weights is None:
            if "_" in name:
                continue
            raise InputError(f"no weight for feature {name!r}")
        if len(feature_weights) != len(values):
            raise InputError(
                f"feature {name!r} has {len(values)} values but {len(feature_weights)} weights"
            )
        total += math.fsum(v * w for v, w in zip(values, feature_weights, strict=True))
    return total


def gap_ids(last_id: int, next_id: int) -> range:
    """The sentence ids a list skips between ``last_id`` and ``next_id`` (none when they
    follow each other)."""
    return range(last_id + 1, next_id)


def missing_ids_message(path: str, missing: list[int], sentences: int) -> str:
    """The warning for sentence ids without a hypothesis in the middle of a list: Moses writes
    every id of its input (an empty hypothesis for a sentence it could not translate), so such
    a list was filtered, cut or joined by hand."""
    shown = ", ".join(str(i) for i in missing[:10]) + (", ..." if len(missing) > 10 else "")
    return (
        f"{display_name(path)}: {len(missing)} of {sentences} sentence ids have no hypothesis "
        f"(id {shown}): Moses lists every id; was the list filtered or cut?"
    )


def first_non_finite(features: list[tuple[str, list[float]]]) -> tuple[str, float] | None:
    """The first feature value that is not finite (``nan``, ``inf``), with its feature's name;
    None when every value is finite (no order or tuning can be drawn from such a value)."""
    for name, values in features:
        for value in values:
            if not math.isfinite(value):
                return name, value
    return None


def best_index(totals: list[float]) -> int:
    """The index of the best of one sentence's hypotheses by ``totals``: the highest, the first
    listed among equals (the hypothesis Moses itself would output first)."""
    return max(range(len(totals)), key=lambda i: (totals[i], -i))


def weighted_totals(group: list[NBestEntry], weights: dict, weights_path: str) -> list[float]:
    """Each entry's total under ``weights`` (read from ``weights_path``):
    :func:`total_score`. A feature value that is not finite (``nan``,
    ``inf``), a feature without its weights, or a total that overflows is an error at the
    entry's line: no order could be drawn from it."""
    totals = []
    for entry in group:
        features = parse_features(entry.features, entry.path, entry.lineno)
        bad = first_non_finite(features)
        if bad is not None:
            raise InputError(
                f"feature {bad[0]} has a value that is not finite ({bad[1]}): the hypotheses "
                "cannot be re-ranked",
                entry.path,
                entry.lineno,
            )
        try:
            total = total_score(features, weights)
        except InputError as exc:
            raise InputError(
                f"{exc.message} in {display_name(weights_path)}", entry.path, entry.lineno
            ) from None
        if not math.isfinite(total):
            raise InputError(
                f"the weighted total is not finite ({total}) under the weights of "
                f"{display_name(weights_path)}: a weight times a feature value overflows",
                entry.path,
                entry.lineno,
            )
        totals.append(total)
    return totals
