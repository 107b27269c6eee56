"""moses.ini: make a phrase table declare more scores, with one more weight per score.

The Moses facts this module implements:

* **Syntax.** A line ``[name]`` starts a section; every other non-blank line is one value of the
  current section. ``#`` starts a comment *anywhere* on a line; spaces and tabs around a value
  are ignored. We change only the lines we must and keep every other byte (comments, blank
  lines, order, line endings).
* **Modern format.** ``[feature]`` lines are ``ClassName key=value ...`` (split on whitespace,
  each argument split at its first ``=``). A feature without ``name=`` is called ``ClassName`` +
  an index counted per class among the *unnamed* features in order of appearance
  (``PhraseDictionaryMemory0``, ``PhraseDictionaryMemory1``; ``Moses::FeatureFunction``).
  ``num-features=`` is the number of scores (1 when absent). ``[weight]`` lines are
  ``Name= w1 w2 ...``; Moses refuses to start unless there are as many weights as features.
  Adding N columns: ``num-features`` + N, ``path=`` the new table, N more weights at the end of
  the feature's ``[weight]`` line.
* **Old format.** ``[ttable-file]`` lines are ``implementation input-factors output-factors
  nscores path`` (implementation 0 = memory, 1 = binary, 2 = on-disk, 12 = compact; very old
  files omit the implementation field). ``[weight-t]`` holds one weight per line, the weights of
  table k after those of tables 0..k-1. Moses names these tables like the modern format
  (``PhraseDictionaryMemory0`` ...), per implementation. Adding N columns: nscores + N, the new
  path, N weight lines after the last weight of that table.
* **Paths.** Paths may contain ``${VAR}``. A table is found by its path as written, expanded, or
  resolved (relative to the working directory or to the ini's directory; a compact table with or
  without ``.minphr``), or by feature name. The new path is written in the user's style: when the
  new table lies in the old table's directory, the old directory text (``${MODEL_PATH}/...``)
  is kept and only the file name changes.
* **Binarised tables.** Moses reads a ``PhraseDictionaryCompact`` from ``PATH.minphr`` and an
  ``PhraseDictionaryOnDisk`` from a directory; a rescored text table must be binarised again.
  The update then points the ini at the binarised name and returns the command to run:
  ``processPhraseTableMin -in NEW.gz -out NEW -nscores N`` (the tool appends ``.minphr``; its
  default -nscores is 4 and its default -rankscore 2, p(e|f), stays right because new columns
  come last; -threads is left at its default 1 because builds without thread support exit on
  it), or ``CreateOnDiskPt IN_FACTORS OUT_FACTORS N 100 2 NEW.gz NEW``.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from phrasescore.errors import InputError
from phrasescore.files.outputs import AtomicOutput
from phrasescore.files.reading import iter_lines
from phrasescore.moses.numbers import NotANumber, parse_number

DEFAULT_WEIGHT = 0.2
"""The weight ``train-model.perl`` gives every phrase-table score before tuning."""

OLD_IMPLEMENTATIONS = {
    0: "PhraseDictionaryMemory",
    1: "PhraseDictionaryBinary",
    2: "PhraseDictionaryOnDisk",
    6: "PhraseDictionaryMemory",
    8: "PhraseDictionarySuffixArray",
    12: "PhraseDictionaryCompact",
    14: "PhraseDictionaryDynSuffixArray",
    15: "PhraseDictionaryDynamicCacheBased",
}
"""``[ttable-file]`` implementation codes and the feature classes Moses converts them to."""

SINGLE_SCORE_FEATURES = frozenset(
    {"UnknownWordPenalty", "WordPenalty", "PhrasePenalty", "Distortion", "KENLM", "SRILM", "IRSTLM"}
)
"""Features that have one score when their line has no ``num-features=``."""

OLD_WEIGHT_SECTIONS = {
    "weight-d": "d",
    "weight-l": "lm",
    "weight-t": "tm",
    "weight-w": "w",
    "weight-generation": "g",
    "weight-i": "I",
}
"""Old moses.ini weight sections and the labels old decoders print for them in n-best lists."""

OTHER_BINARY_CLASSES = frozenset({"PhraseDictionaryBinary", "ProbingPT"})
"""Binarised tables for which no binarising command is returned (only a note)."""

_TOKEN = re.compile(r"\S+")


@dataclass
class IniTable:
    """A phrase table declared in a moses.ini."""

    name: str
    """Feature name (``TranslationModel0``, or the default ``PhraseDictionaryMemory0``)."""
    class_name: str
    path: str | None
    """The path as written in the ini."""
    num_features: int
    line_index: int
    """0-based index of its ``[feature]`` or ``[ttable-file]`` line."""
    old_format: bool = False
    input_factors: str = "0"
    output_factors: str = "0"


@dataclass
class IniUpdate:
    """What :func:`update_moses_ini_text` changed (the library reports; it never prints)."""

    text: str
    """The new ini text."""
    feature: str
    old_path: str | None
    new_path: str
    """The new path as written into the ini."""
    old_num_features: int
    new_num_features: int
    added_weights: list[float]
    binarise_command: list[str] | None = None
    """A command to run before Moses can read the new table (binarised tables), else None."""
    notes: list[str] = field(default_factory=list)
    line: int = 0
    """1-based line of the table's ``[feature]`` (or ``[ttable-file]``) entry in the ini."""

    @property
    def binarise_command_line(self) -> str | None:
        """:attr:`binarise_command` as a shell command line."""
        return None if self.binarise_command is None else shlex.join(self.binarise_command)


@dataclass
class _Line:
    """Line ``index`` split into code (before ``#``), comment and line ending."""

    index: int
    code: str
    rest: str
    newline: str

    @property
    def text(self) -> str:
        return self.code.strip()

    def tokens(self) -> list[re.Match[str]]:
        return list(_TOKEN.finditer(self.code))


def _split_line(index: int, line: str) -> _Line:
    body = line.rstrip("\r\n")
    newline = line[len(body) :]
    hash_at = body.find("#")
    if hash_at < 0:
        return _Line(index, body, "", newline)
    return _Line(index, body[:hash_at], body[hash_at:], newline)


class _Ini:
    """A moses.ini parsed just enough to find and change phrase tables and weights."""

    def __init__(self, text: str):
        self.lines = text.splitlines(keepends=True)
        self.sections: dict[str, list[_Line]] = {}
        self.headers: dict[str, int] = {}
        section = None
        for index, raw in enumerate(self.lines):
            line = _split_line(index, raw)
            value = line.text
            if not value:
                continue
            if value.startswith("["):
                section = value[1:].split("]", 1)[0]
                self.headers.setdefault(section, index)
                self.sections.setdefault(section, [])
            elif section is not None:
                self.sections[section].append(line)
        self.features = self._modern_features()
        self.weights = self._modern_weights()
        self.old_tables = self._old_tables()

    def _modern_features(self) -> list[tuple[str, str, dict[str, str], _Line]]:
        """(class, name, args, line) for every ``[feature]`` line, names as Moses gives them."""
        unnamed: dict[str, int] = {}
        features = []
        for line in self.sections.get("feature", []):
            tokens = line.text.split()
            args: dict[str, str] = {}
            for token in tokens[1:]:
                key, _, value = token.partition("=")
                args.setdefault(key, value)
            class_name = tokens[0]
            name = args.get("name", "")
            if not name:
                name = f"{class_name}{unnamed.get(class_name, 0)}"
                unnamed[class_name] = unnamed.get(class_name, 0) + 1
            features.append((class_name, name, args, line))
        return features

    def _modern_weights(self) -> dict[str, tuple[_Line, int]]:
        """Feature name -> (its ``[weight]`` line, number of weights)."""
        weights = {}
        for line in self.sections.get("weight", []):
            tokens = line.text.split()
            weights[tokens[0][:-1]] = (line, len(tokens) - 1)
        return weights

    def _old_tables(self) -> list[IniTable]:
        tables = []
        per_class: dict[str, int] = {}
        for line in self.sections.get("ttable-file", []):
            tokens = line.text.split()
            if len(tokens) == 4:  # very old: input-factors output-factors nscores path
                implementation, (inputs, outputs, nscores, path) = 0, tokens
            elif len(tokens) >= 5:
                inputs, outputs, nscores, path = tokens[1:5]
                implementation = _int(tokens[0], line, "implementation")
            else:
                raise InputError(
                    f"[ttable-file] line {line.text!r} has {len(tokens)} fields; expected "
                    "'implementation input-factors output-factors nscores path'",
                    None,
                    line.index + 1,
                )
            class_name = OLD_IMPLEMENTATIONS.get(
                implementation, f"PhraseDictionary{implementation}"
            )
            index = per_class.get(class_name, 0)
            per_class[class_name] = index + 1
            tables.append(
                IniTable(
                    name=f"{class_name}{index}",
                    class_name=class_name,
                    path=path,
                    num_features=_int(nscores, line, "nscores"),
                    line_index=line.index,
                    old_format=True,
                    input_factors=inputs,
                    output_factors=outputs,
                )
            )
        return tables

    def phrase_tables(self) -> list[IniTable]:
        tables = [
            IniTable(
                name=name,
                class_name=class_name,
                path=args.get("path"),
                num_features=_num_features(class_name, args, line) or 0,
                line_index=line.index,
                input_factors=args.get("input-factor", "0"),
                output_factors=args.get("output-factor", "0"),
            )
            for class_name, name, args, line in self.features
            if _is_phrase_table(class_name)
        ]
        return tables + self.old_tables


def _int(text: str, line: _Line, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(
            f"{what} is not an integer in {line.text!r}", None, line.index + 1
        ) from None


def _num_features(class_name: str, args: dict[str, str], line: _Line) -> int | None:
    if "num-features" in args:
        return _int(args["num-features"], line, "num-features")
    if _is_phrase_table(class_name) or class_name in SINGLE_SCORE_FEATURES:
        return 1
    return None


def _is_phrase_table(class_name: str) -> bool:
    return class_name.startswith("PhraseDictionary") or class_name == "ProbingPT"


def list_phrase_tables(ini_text: str) -> list[IniTable]:
    """The phrase tables an ini declares, modern ``[feature]`` lines first."""
    return _Ini(ini_text).phrase_tables()


def count_features_and_weights(ini_text: str) -> dict[str, tuple[int | None, int | None]]:
    """Feature name -> (number of features, number of weights), as Moses would count them.

    The number of features is None when the ini does not say and Moses' default is not known
    here; the number of weights is None when the feature has no ``[weight]`` line (Moses then
    uses the feature's default weights if it has any, e.g. UnknownWordPenalty's 1). Moses refuses
    to start unless the two numbers are equal for every feature. For the old format the
    ``[weight-t]`` weights are handed out to the tables in order (surplus weights are reported
    under ``"[weight-t]"``).
    """
    ini = _Ini(ini_text)
    counts: dict[str, tuple[int | None, int | None]] = {}
    for class_name, name, args, line in ini.features:
        weight = ini.weights.get(name)
        counts[name] = (_num_features(class_name, args, line), weight[1] if weight else None)
    old_weights = len(ini.sections.get("weight-t", []))
    offset = 0
    for table in ini.old_tables:
        available = max(0, min(table.num_features, old_weights - offset))
        counts[table.name] = (table.num_features, available)
        offset += table.num_features
    if ini.old_tables and old_weights > offset:
        counts["[weight-t]"] = (offset, old_weights)
    return counts


def _path_keys(path: str, base_dirs: Sequence[str]) -> set[str]:
    """Forms under which ``path`` may be written: as is, expanded, resolved, without .minphr."""
    keys = {path, os.path.normpath(path)}
    expanded = os.path.expandvars(path)
    keys.add(os.path.normpath(expanded))
    if "$" not in expanded:
        for base in base_dirs:
            keys.add(os.path.realpath(os.path.join(base, expanded)))
    return keys | {key[: -len(".minphr")] for key in keys if key.endswith(".minphr")}


def _find_table(tables: list[IniTable], table: str | None, base_dirs: Sequence[str]) -> IniTable:
    def listing() -> str:
        return "; ".join(f"{t.name} (path={t.path})" for t in tables) or "none"

    if not tables:
        raise InputError("the ini declares no phrase table")
    if table is None:
        if len(tables) == 1:
            return tables[0]
        raise InputError(f"the ini declares several phrase tables, choose one: {listing()}")
    by_name = [t for t in tables if t.name == table]
    if by_name:
        return by_name[0]
    wanted = _path_keys(table, base_dirs)
    by_path = [t for t in tables if t.path is not None and _path_keys(t.path, base_dirs) & wanted]
    if len(by_path) == 1:
        return by_path[0]
    if by_path:
        names = ", ".join(t.name for t in by_path)
        raise InputError(f"several phrase tables use path {table!r} ({names}): choose by name")
    raise InputError(f"phrase table {table!r} is not in the ini; phrase tables found: {listing()}")


def _render_path(old: str | None, new: str, base_dirs: Sequence[str]) -> str:
    """Write ``new`` in the style of ``old``: keep old's directory text when it is the same."""
    if old is None:
        return new
    old_dir, new_dir = os.path.dirname(old), os.path.dirname(new)
    if old_dir == new_dir:
        return new
    expanded_dir = os.path.expandvars(old_dir)
    if "$" in expanded_dir:
        return new
    new_real = os.path.realpath(new_dir or ".")
    for base in base_dirs:
        if os.path.realpath(os.path.join(base, expanded_dir or ".")) == new_real:
            return (
                os.path.join(old_dir, os.path.basename(new)) if old_dir else os.path.basename(new)
            )
    return new


def _binarised(table: IniTable, new_text_path: str, n_total: int) -> tuple[str, list[str] | None]:
    """(path for the ini, command that makes it) for binarised tables; text tables unchanged."""
    base = new_text_path[:-3] if new_text_path.endswith(".gz") else new_text_path
    if table.class_name == "PhraseDictionaryCompact" or (table.path or "").endswith(".minphr"):
        command = ["processPhraseTableMin", "-in", new_text_path, "-out", base]
        command += ["-nscores", str(n_total)]
        suffix = ".minphr" if (table.path or "").endswith(".minphr") else ""
        return base + suffix, command
    if table.class_name == "PhraseDictionaryOnDisk":
        if base == new_text_path:
            base += ".bin"
        factors = [str(len(f.split(","))) for f in (table.input_factors, table.output_factors)]
        command = ["CreateOnDiskPt", *factors, str(n_total), "100", "2", new_text_path, base]
        return base, command
    return new_text_path, None


def _replace_token(line: _Line, match: re.Match[str], text: str) -> None:
    line.code = line.code[: match.start()] + text + line.code[match.end() :]


def _with_new_weights(line: _Line, values: list[str]) -> str:
    code = line.code.rstrip()
    spaces = line.code[len(code) :]
    return code + " " + " ".join(values) + spaces + line.rest + line.newline


def format_weight(weight: float) -> str:
    """A weight as written into moses.ini: shortest round-trip form, ``1`` for 1.0."""
    text = repr(float(weight))
    return text[:-2] if text.endswith(".0") else text


def update_moses_ini_text(
    text: str,
    table: str | None,
    new_table_path: str,
    n_new: int = 1,
    weights: Sequence[float] | None = None,
    comment: str | None = None,
    ini_path: str | None = None,
) -> IniUpdate:
    """Return the ini ``text`` with phrase table ``table`` declaring ``n_new`` more scores.

    ``table`` is a feature name or the table's path (None: the only phrase table); its path
    becomes ``new_table_path`` (or the binarised name, see :class:`IniUpdate`); ``weights`` are
    the ``n_new`` new weights (default :data:`DEFAULT_WEIGHT` each); ``comment`` is written on a
    line of its own just above the changed table line. ``ini_path`` only serves to resolve
    relative paths.
    """
    if n_new < 1:
        raise ValueError("n_new must be at least 1")
    new_weights = [DEFAULT_WEIGHT] * n_new if weights is None else [float(w) for w in weights]
    if len(new_weights) != n_new:
        raise ValueError(f"{len(new_weights)} weights given for {n_new} new scores")
    if comment is not None and ("\n" in comment or "\r" in comment):
        raise ValueError("the comment must be a single line")

    base_dirs = [os.getcwd()]
    if ini_path is not None and ini_path != "-":
        base_dirs.append(os.path.dirname(os.path.abspath(ini_path)))
    ini = _Ini(text)
    target = _find_table(ini.phrase_tables(), table, base_dirs)
    _refuse_multimodel_component(ini, target)
    if target.path is None:
        raise InputError(f"phrase table {target.name} has no path= to replace")

    n_total = target.num_features + n_new
    ini_path_value, command = _binarised(target, new_table_path, n_total)
    new_path = _render_path(target.path, ini_path_value, base_dirs)
    weight_texts = [format_weight(w) for w in new_weights]
    prefix = ""
    if comment is not None:
        prefix = comment if comment.lstrip().startswith("#") else f"# {comment}"
        prefix += _split_line(0, ini.lines[target.line_index]).newline or "\n"
    lines = list(ini.lines)
    update = _update_old_format if target.old_format else _update_modern_format
    update(ini, target, lines, new_path, n_total, weight_texts, prefix)

    notes = []
    if command is not None:
        notes.append(
            f"{target.name} is a binarised {target.class_name}: run "
            f"'{shlex.join(command)}' before starting Moses"
        )
    elif target.class_name in OTHER_BINARY_CLASSES:
        notes.append(
            f"{target.name} is a binarised {target.class_name}: binarise {new_table_path} "
            f"with the tool that made {target.path}, as {new_path}, before starting Moses"
        )
    return IniUpdate(
        text="".join(lines),
        feature=target.name,
        old_path=target.path,
        new_path=new_path,
        old_num_features=target.num_features,
        new_num_features=n_total,
        added_weights=new_weights,
        binarise_command=command,
        notes=notes,
        line=target.line_index + 1,
    )


def _update_modern_format(
    ini: _Ini,
    target: IniTable,
    lines: list[str],
    path: str,
    n_total: int,
    weights: list[str],
    prefix: str,
) -> None:
    """``num-features`` and ``path=`` on the ``[feature]`` line, weights on the ``[weight]`` line.

    ``prefix`` (a comment line or "") is written before the feature line.
    """
    table_line = _split_line(target.line_index, lines[target.line_index])
    _update_feature_line(table_line, n_total)
    path_token = next(m for m in table_line.tokens() if m.group().startswith("path="))
    _replace_token(table_line, path_token, "path=" + path)
    lines[target.line_index] = prefix + table_line.code + table_line.rest + table_line.newline
    if target.name not in ini.weights:
        raise InputError(f"the ini has no [weight] line for {target.name}")
    weight_line, count = ini.weights[target.name]
    if count != target.num_features:
        raise InputError(
            f"{target.name} declares {target.num_features} features but has {count} weights",
            None,
            weight_line.index + 1,
        )
    lines[weight_line.index] = _with_new_weights(weight_line, weights)


def _update_old_format(
    ini: _Ini,
    target: IniTable,
    lines: list[str],
    path: str,
    n_total: int,
    weights: list[str],
    prefix: str,
) -> None:
    """nscores and path on the ``[ttable-file]`` line, weight lines after the table's last one.

    ``prefix`` (a comment line or "") is written before the ``[ttable-file]`` line.
    """
    table_line = _split_line(target.line_index, lines[target.line_index])
    tokens = table_line.tokens()
    nscores_at, path_at = (2, 3) if len(tokens) == 4 else (3, 4)
    _replace_token(table_line, tokens[path_at], path)  # the later token first: spans stay valid
    _replace_token(table_line, tokens[nscores_at], str(n_total))
    lines[target.line_index] = prefix + table_line.code + table_line.rest + table_line.newline
    weight_line = _old_weight_line(ini, target)
    newline = weight_line.newline or "\n"
    if not weight_line.newline:  # the last line of the file had no newline
        lines[weight_line.index] += newline
    lines[weight_line.index + 1 : weight_line.index + 1] = [w + newline for w in weights]


def _update_feature_line(line: _Line, n_total: int) -> None:
    tokens = line.tokens()
    for match in tokens:
        if match.group().startswith("num-features="):
            _replace_token(line, match, f"num-features={n_total}")
            return
    last = tokens[-1]
    _replace_token(line, last, f"{last.group()} num-features={n_total}")


def _old_weight_line(ini: _Ini, target: IniTable) -> _Line:
    """The ``[weight-t]`` line holding the last weight of ``target``."""
    offset = 0
    for table in ini.old_tables:
        if table is target:
            break
        offset += table.num_features
    weights = ini.sections.get("weight-t", [])
    last = offset + target.num_features - 1
    if last >= len(weights) or target.num_features < 1:
        raise InputError(
            f"[weight-t] has {len(weights)} weights, too few for {target.name} "
            f"(its weights are numbers {offset + 1} to {last + 1})"
        )
    return weights[last]


def _refuse_multimodel_component(ini: _Ini, target: IniTable) -> None:
    for class_name, name, args, _line in ini.features:
        if class_name.startswith("PhraseDictionaryMultiModel"):
            if target.name == name or target.name in args.get("components", "").split(","):
                raise InputError(
                    f"{target.name} belongs to {class_name} {name}: its component tables must "
                    "all have the same scores; adding a column to such a model is not supported"
                )


def update_moses_ini(
    ini_path: str,
    table: str | None = None,
    *,
    new_table_path: str,
    n_new: int = 1,
    weights: Sequence[float] | None = None,
    out_path: str | None = None,
    comment: str | None = None,
) -> IniUpdate:
    """Read ``ini_path``, update it (see :func:`update_moses_ini_text`), write ``out_path``.

    ``out_path`` defaults to ``ini_path`` (replaced atomically: the old file stays whole until
    the new one is complete).
    """
    text = "".join(iter_lines(ini_path, keep_ends=True))
    update = update_moses_ini_text(
        text,
        table,
        new_table_path,
        n_new=n_new,
        weights=weights,
        comment=comment,
        ini_path=ini_path,
    )
    with AtomicOutput(out_path or ini_path, compress=False) as out:
        out.write(update.text)
    return update


def read_weights(ini_text: str, path: str | None = None) -> dict[str, list[float]]:
    """Feature name -> its weights, in file order: what ``moses -weight-overwrite`` takes and
    what MERT tuned. The one weights reader of the package (n-best totals use it too).

    ``[weight]`` lines give ``Name -> [w1, w2, ...]``; the old sections ``[weight-d]``,
    ``[weight-l]``, ``[weight-t]``, ``[weight-w]`` (one weight per line) give ``d``, ``lm``,
    ``tm``, ``w`` (the labels of old n-best lists, :data:`OLD_WEIGHT_SECTIONS`); other
    ``[weight-x]`` sections give ``x``. Lines before any section are read as ``[weight]`` lines,
    so a plain file of ``Name= w1 w2`` lines is a weights file too. As in Moses, ``#`` starts a
    comment and blank lines are ignored. ``path`` names the file in errors.
    """
    weights: dict[str, list[float]] = {}
    section = "weight"
    for index, raw in enumerate(ini_text.splitlines(keepends=True)):
        line = _split_line(index, raw)
        text = line.text
        if not text:
            continue
        if text.startswith("["):
            section = text[1:].split("]", 1)[0].strip()
            continue
        tokens = text.split()
        if section == "weight":
            if not tokens[0].endswith("=") or len(tokens) < 2:
                raise InputError(
                    f"cannot read weights in [{section}]: {text!r} (expected 'Name= w1 w2 ...')",
                    path,
                    index + 1,
                )
            name = tokens[0][:-1]
            weights[name] = _floats(tokens[1:], f"{name}: weights must be numbers", path, index)
        elif section.startswith("weight-") and section != "weight-file":
            label = OLD_WEIGHT_SECTIONS.get(section, section[len("weight-") :])
            message = f"cannot read weights in [{section}]: {text!r} (expected numbers)"
            weights.setdefault(label, []).extend(_floats(tokens, message, path, index))
    return weights


def _floats(tokens: list[str], message: str, path: str | None, index: int) -> list[float]:
    """The weights ``tokens`` as numbers; a non-number (``message``) or a non-finite weight
    (``nan``, ``inf``, ``1e999``: no total could be computed with it) is an error at its line."""
    try:
        values = [parse_number(token) for token in tokens]
    except NotANumber as exc:
        if exc.underflow or not exc.text.isascii() or "_" in exc.text:
            raise InputError(exc.message("weight"), path, index + 1) from None
        raise InputError(message, path, index + 1) from None
    for token, value in zip(tokens, values, strict=True):
        if not math.isfinite(value):
            raise InputError(f"weight {token!r} is not a finite number", path, index + 1)
    return values
