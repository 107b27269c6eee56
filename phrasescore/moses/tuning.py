"""The files of Moses' tuners: what ``extractor`` writes and ``mert`` and ``kbmira`` read and
write, and the ``Name= w`` weights files that come out of them.

One tuning (:class:`phrasescore.jobs.tuning.moses_tools.MosesTuning` runs the programs) passes
these files:

1. ``extractor`` turns a scored n-best list into ``features.dat`` (one row of dense feature
   values per hypothesis; :func:`dense_feature_names` reads its header) and ``scores.dat`` (BLEU
   sufficient statistics);
2. ``mert`` starts from ``init.opt`` (:func:`write_start_point`, the weights in the order of the
   extractor's dense values, :func:`weight_vector`) and writes ``weights.txt``
   (:func:`read_tuned_weights`); ``kbmira`` starts from the same ``init.opt`` and writes its
   ``-o`` file (:func:`read_kbmira_weights`); :func:`read_tuner_output` tells the two apart;
3. the tuned vector by feature name (:func:`weights_by_feature`) is written as ``Name= w ...``
   lines (:func:`write_weights_file`), the file ``phrasescore nbest --weights`` reads back with
   :func:`phrasescore.moses.nbest.read_weights`.

The Moses facts used: the extractor's feature header is ``FEATURES_TXT_BEGIN_0 ID N DIM
NAME_0 NAME_1 ...`` (``mert/FeatureArray.cpp``), each dense value named ``Name_i``; mert's
starting point file ``init.opt`` holds three lines, the start, the minima and the maxima of the
random restarts (as ``mert-moses.pl`` writes it); ``weights.txt`` is the L1-normalised best
point, space-separated; kbmira, started from a legacy ``init.opt``, names the dense weights ``F0
.. F(n-1)`` in feature order (``mert/kbmira.cpp``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files.inputs import check_files_exist
from phrasescore.files.outputs import AtomicOutput
from phrasescore.files.reading import iter_lines
from phrasescore.moses.numbers import NotANumber, parse_number

FEATURES_HEADER = "FEATURES_TXT_BEGIN_0"
_VALUE_NAME = re.compile(r"(.+)_(\d+)\Z")
_KBMIRA_NAME = re.compile(r"F(\d+)\Z")
"""kbmira's name of dense weight i when started from a legacy ``init.opt``."""


def dense_feature_names(features_dat: Path) -> list[str]:
    """The dense value names (``LM0_0``, ``TranslationModel0_3``) of an extractor's features.dat."""
    path = str(features_dat)
    check_files_exist([path])
    for lineno, line in enumerate(iter_lines(path), 1):
        if line.startswith(FEATURES_HEADER):
            fields = line.split()
            try:
                dimension = int(fields[3])
            except (IndexError, ValueError):
                raise InputError("feature header without a dimension", path, lineno) from None
            names = fields[4:]
            if len(names) != dimension:
                raise InputError(
                    f"feature header names {len(names)} values, expected {dimension}",
                    path,
                    lineno,
                )
            return names
    raise InputError("no feature header: not an extractor features file", path=path)


def weight_vector(names: list[str], weights: dict[str, list[float]], default: float) -> list[float]:
    """``weights`` (by feature name) in the order of ``names``; ``default`` where none is given."""
    vector = []
    for name in names:
        feature, index = _split_value_name(name)
        values = weights.get(feature, [])
        vector.append(values[index] if index < len(values) else default)
    return vector


def weights_by_feature(names: list[str], vector: list[float]) -> dict[str, list[float]]:
    """The inverse of :func:`weight_vector`: ``Name -> [w_0, w_1, ...]``."""
    grouped: dict[str, list[float]] = {}
    for name, value in zip(names, vector, strict=True):
        feature, index = _split_value_name(name)
        values = grouped.setdefault(feature, [])
        if index != len(values):
            raise InputError(f"feature values out of order at {name!r}")
        values.append(value)
    return grouped


def _split_value_name(name: str) -> tuple[str, int]:
    match = _VALUE_NAME.match(name)
    if not match:
        raise InputError(f"dense feature value name {name!r} is not NAME_INDEX")
    return match.group(1), int(match.group(2))


def write_start_point(path: Path, start: list[float], spread: float = 1.0) -> None:
    """mert's ``init.opt``: the start, then the range [-spread, spread] of random restarts."""
    lines = [start, [-spread] * len(start), [spread] * len(start)]
    with AtomicOutput(str(path)) as out:
        for values in lines:
            out.write(" ".join(repr(float(v)) for v in values) + "\n")


def _finite(text: str, path: str, lineno: int) -> float:
    """A tuned weight: a finite number, else an error at its line."""
    try:
        value = parse_number(text)
    except NotANumber as exc:
        if exc.underflow:
            raise InputError(exc.message("weight"), path, lineno) from None
        raise InputError(f"not a number: {text!r}", path, lineno) from None
    if not math.isfinite(value):
        raise InputError(f"weight {text!r} is not a finite number", path, lineno)
    return value


def _tuner_lines(path: Path) -> list[str]:
    """The lines of a tuner's output (plain or gzip; missing or invalid UTF-8: one line)."""
    check_files_exist([str(path)])
    return list(iter_lines(str(path)))


def read_tuned_weights(weights_txt: Path, names: list[str]) -> dict[str, list[float]]:
    """mert's ``weights.txt`` (one line, one weight per dense value) by feature name; every
    weight a finite number."""
    path = str(weights_txt)
    vector = []
    for lineno, line in enumerate(_tuner_lines(weights_txt), 1):
        for field in line.split():
            try:
                vector.append(_finite(field, path, lineno))
            except InputError as exc:
                if "not a number" not in exc.message:
                    raise
                raise InputError("not a mert weights file", path, lineno) from None
    if len(vector) != len(names):
        raise InputError(f"{len(vector)} weights for {len(names)} features", path=path)
    return weights_by_feature(names, vector)


def read_kbmira_weights(output: Path, names: list[str]) -> dict[str, list[float]]:
    """kbmira's ``-o`` file by feature name, L1-normalised as mert's ``weights.txt`` is.

    Started from a legacy ``init.opt`` (:func:`write_start_point`), kbmira names the dense
    weights ``F0 .. F(n-1)`` in the order of the extractor's features (``mert/kbmira.cpp``);
    lines of sparse features (other names) are not expected from dense feature files. Each
    weight is given once, a finite number.
    """
    path = str(output)
    vector: list[float | None] = [None] * len(names)
    lines: dict[int, int] = {}  # dense value index -> the line that gave it
    for lineno, line in enumerate(_tuner_lines(output), 1):
        fields = line.split()
        if not fields:
            continue
        match = _KBMIRA_NAME.match(fields[0])
        if len(fields) != 2 or not match or int(match.group(1)) >= len(names):
            raise InputError(f"not a dense kbmira weight: {line!r}", path=path, line=lineno)
        index = int(match.group(1))
        if index in lines:
            raise InputError(
                f"{fields[0]} given twice (first on line {lines[index]})", path, lineno
            )
        lines[index] = lineno
        vector[index] = _finite(fields[1], path, lineno)
    if any(value is None for value in vector):
        raise InputError(f"kbmira gave {sum(v is not None for v in vector)} of {len(names)} weights",
                         path=path)  # fmt: skip
    total = sum(abs(value) for value in vector) or 1.0
    return weights_by_feature(names, [value / total for value in vector])


def weight_line(name: str, values: list[float]) -> str:
    """``Name= w1 w2``, each weight written exactly (``repr``): one line of a weights file, one
    feature of ``moses -weight-overwrite``."""
    return f"{name}= " + " ".join(repr(value) for value in values)


def write_weights_file(path: Path, weights: dict[str, list[float]]) -> None:
    """``Name= w1 w2`` lines (:func:`weight_line`): what ``phrasescore nbest --weights`` reads
    (:func:`phrasescore.moses.nbest.read_weights`)."""
    with AtomicOutput(str(path)) as out:
        for name, values in weights.items():
            out.write(weight_line(name, values) + "\n")


def read_tuner_output(path: Path, names: list[str]) -> dict[str, list[float]]:
    """mert's ``weights.txt`` or kbmira's ``-o`` file (``F0 w`` lines), told apart by their
    first field, by feature name."""
    first = next((line.split()[0] for line in _tuner_lines(path) if line.split()), None)
    if first and _KBMIRA_NAME.match(first):
        return read_kbmira_weights(path, names)
    return read_tuned_weights(path, names)


_BEST_POINT = re.compile(rb"(?:^|\r)Best point:[^\r\n]*=>[ \t]*([^\s]+)", re.MULTILINE)


def mert_best_bleu(work: Path) -> float | None:
    """The dev BLEU (0-1) of a ``mert-moses.pl`` working folder's last tuning iteration: the
    ``Best point: w ... => BLEU`` line of the highest ``runN.mert.log`` that has one (mert's
    BLEU of its best weights on the n-best lists gathered so far, ``mert/mert.cpp``); None when
    no iteration has one. The logs are read as bytes: mert writes its progress to them with
    carriage returns and non-UTF-8 bytes."""
    logs = []
    for log in work.glob("run*.mert.log"):
        number = log.name[3 : -len(".mert.log")]
        if number.isdigit():
            logs.append((int(number), log))
    for _, log in sorted(logs, reverse=True):
        found = _BEST_POINT.findall(log.read_bytes())
        if found:
            try:
                return float(found[-1])
            except ValueError:
                return None
    return None


def read_reference(path: str) -> list[str]:
    """The lines of a reference translation that Moses' tuning tools read (``extractor``,
    ``mert-moses.pl``), without their ``\\n``; a carriage return in a line (CRLF endings) is an
    :class:`InputError` naming its line. ``extractor`` splits lines on spaces only, so the
    ``\\r`` of a Windows line ending is part of the last word of every sentence: it would tune
    on other n-gram statistics than the BLEU phrasescore reports (which reads the line
    without it), with nothing to tell. The one check of a reference before any tool sees it."""
    lines = []
    for lineno, line in enumerate(iter_lines(path, keep_ends=True), 1):
        body = line[:-1] if line.endswith("\n") else line
        if "\r" in body:
            where = "ends with a carriage return (CRLF, Windows line endings)"
            if not body.endswith("\r"):
                where = "holds a carriage return (\\r)"
            raise InputError(
                f"the reference line {where}: Moses' extractor would read it as part of a word; "
                "convert the file (dos2unix, or tr -d '\\r')",
                path,
                lineno,
            )
        lines.append(body)
    return lines
