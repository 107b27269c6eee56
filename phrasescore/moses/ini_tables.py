"""The phrase tables a moses.ini names, paths resolved, as the ``bin/`` scripts loop over them.

``phrasescore ini-tables MOSES_INI`` prints one line per phrase table,
``NAME<TAB>CLASS<TAB>PATH<TAB>NUM_FEATURES`` (``--factors`` adds ``INPUT_FACTORS<TAB>
OUTPUT_FACTORS``), so that a shell script can loop over them with ``IFS=$'\\t' read -r``.

The path is resolved for a script that may run anywhere: ``${VAR}`` and ``~`` are expanded, and a
relative path is joined to the ini's directory (``train-model.perl`` writes absolute paths, and
a hand-written ini next to its tables usually means them relative to itself). A table without a
``path=`` prints ``-`` (a tab-separated empty field would vanish in ``read``). Nothing is checked
on disk: a compact table's ``path=phrase-table`` stands for ``phrase-table.minphr``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from phrasescore.errors import InputError
from phrasescore.files.reading import iter_lines
from phrasescore.moses.ini import IniTable, _Ini, list_phrase_tables

NO_PATH = "-"
"""What :func:`format_table_rows` prints for a phrase table that has no ``path=``."""


@dataclass
class ResolvedTable:
    """A phrase table of a moses.ini, its path resolved (see the module docstring)."""

    table: IniTable
    path: str | None


def resolve_ini_path(path: str, ini_path: str) -> str:
    """``path`` as written in the ini at ``ini_path``, expanded and made absolute."""
    expanded = os.path.expanduser(os.path.expandvars(path))
    if os.path.isabs(expanded) or "$" in expanded:
        return os.path.normpath(expanded)
    base = os.path.dirname(os.path.abspath(ini_path))
    return os.path.normpath(os.path.join(base, expanded))


def read_ini_tables(ini_path: str) -> list[ResolvedTable]:
    """The phrase tables ``ini_path`` declares, in order, with resolved paths."""
    if not os.path.isfile(ini_path):
        raise InputError("no such moses.ini", ini_path)
    text = "".join(iter_lines(ini_path, keep_ends=True))
    try:
        tables = list_phrase_tables(text)
    except InputError as exc:
        raise exc.located(ini_path) from None
    return [
        ResolvedTable(t, None if t.path is None else resolve_ini_path(t.path, ini_path))
        for t in tables
    ]


def format_table_rows(tables: list[ResolvedTable], factors: bool = False) -> list[str]:
    """One tab-separated line per table (no line ending)."""
    rows = []
    for resolved in tables:
        table = resolved.table
        fields = [table.name, table.class_name, resolved.path or NO_PATH, str(table.num_features)]
        if factors:
            fields += [table.input_factors, table.output_factors]
        for value in fields:
            if "\t" in value or "\n" in value:
                raise InputError(f"phrase table {table.name}: a tab or newline in {value!r}")
        rows.append("\t".join(fields))
    return rows


def feature_paths(ini_path: str) -> list[tuple[str, str]]:
    """(feature name, path as written) of every ``[feature]`` line of ``ini_path`` with a
    ``path=``: the files Moses reads to load the system (tables, language models, reordering)."""
    text = "".join(iter_lines(ini_path, keep_ends=True))
    try:
        features = _Ini(text).features
    except InputError as exc:
        raise exc.located(ini_path) from None
    return [(name, args["path"]) for _, name, args, _ in features if args.get("path")]
