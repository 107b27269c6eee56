"""The Moses-file jobs: ``check-table``, ``copy-table`` and ``ini-tables``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from phrasescore.errors import InputError
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.locks import output_lock
from phrasescore.files.outputs import check_output_path
from phrasescore.moses.ini_tables import format_table_rows, read_ini_tables
from phrasescore.moses.phrase_table import check_phrase_table, copy_phrase_table

log = logging.getLogger(__name__)


def check_table(table: str):
    """Read and validate a Moses phrase table in one pass; logs and returns its statistics."""
    stats = check_phrase_table(table)
    log.info(
        "%s: %d lines, %d source phrases (runs of equal sources), %d scores per line",
        table,
        stats.lines,
        stats.source_groups,
        stats.num_scores,
    )
    return stats


def copy_table(table: str, output: str):
    """Copy a phrase table through phrasescore's reader and writer (validating it)."""
    refuse_outputs_onto_inputs({"input table": table}, {"-o": output})
    check_output_path(output)
    with output_lock(output):  # as every writer of -o: a second run is refused, not raced
        stats = copy_phrase_table(table, output)
    log.info(
        "%s: %d lines, %d scores per line, written to %s",
        table,
        stats.lines,
        stats.num_scores,
        output,
    )
    return stats


@dataclass
class IniTables:
    """The phrase tables of a moses.ini, one formatted row each."""

    rows: list[str]

    def lines(self) -> list[str]:
        """``NAME<TAB>CLASS<TAB>PATH<TAB>NUM_FEATURES`` (and the factors) per table."""
        return list(self.rows)


def ini_tables(moses_ini: str, factors: bool = False) -> IniTables:
    """``NAME<TAB>CLASS<TAB>PATH<TAB>NUM_FEATURES`` (and the factors) of each phrase table of
    ``moses_ini``."""
    try:
        return IniTables(format_table_rows(read_ini_tables(moses_ini), factors=factors))
    except InputError as exc:
        raise exc.located(moses_ini) from None
