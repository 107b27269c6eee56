"""The moses.ini of a rescored (or merged) table: one more feature and weight per new column,
pointing at the new table, with a comment naming the columns; checked before the table is
written and renamed into place together with it.
"""

from __future__ import annotations

import logging
import os

from phrasescore import __version__
from phrasescore.errors import InputError
from phrasescore.files.kinds import display_name
from phrasescore.files.outputs import StagedFile
from phrasescore.files.reading import iter_lines
from phrasescore.moses.ini import update_moses_ini_text
from phrasescore.moses.phrase_table import read_phrase_table

log = logging.getLogger(__name__)


def default_ini_out(ini_path: str) -> str:
    """``model/moses.ini`` -> ``model/moses.rescored.ini``."""
    stem = ini_path[: -len(".ini")] if ini_path.endswith(".ini") else ini_path
    return stem + ".rescored.ini"


def ini_report_lines(ini_out: str | None, update) -> list[str]:
    """The moses.ini a rescore or merge wrote, and the binarisation command it needs, if any."""
    if not ini_out:
        return []
    lines = [f"phrasescore: moses.ini for the new table: {ini_out}"]
    if update.binarise_command_line:
        lines.append(f"phrasescore: now run: {update.binarise_command_line}")
    return lines


class IniUpdate:
    """The moses.ini of the rescored table: checked before the table is rescored (a table the
    ini does not name is refused before any output is written), written after."""

    def __init__(
        self,
        ini_path: str,
        table: str,
        new_table: str,
        n_new: int,
        weight: float,
        ini_out: str | None = None,
    ):
        self.ini_path = ini_path
        self.ini_out = ini_out or default_ini_out(ini_path)
        self.staged: tuple[StagedFile, object] | None = None
        """The new ini under its temporary name and the update (:meth:`before_publish`)."""
        self.table = table
        # An absolute path: the ini module keeps the old table's directory text (relative,
        # absolute or ${VAR}) when the new table is beside the old one, whatever the current
        # directory.
        self.new_table = new_table
        self.n_new = n_new
        self.weights = [weight] * n_new
        self.text = "".join(iter_lines(ini_path, keep_ends=True))
        self._warn_score_count(self._update())

    def _warn_score_count(self, update) -> None:
        """Warn when the ini declares another number of scores than the table's lines have
        (read from its first line; a table on standard input or a pipe is not read twice):
        the new ini would carry the wrong count over, and Moses would refuse it or misread the
        scores."""
        if not os.path.isfile(self.table):
            return
        try:
            first = next(read_phrase_table(self.table, validate=False), None)
        except InputError:
            return  # the rescoring reports the table's own error
        if first is None or len(first.scores) == update.old_num_features:
            return
        log.warning(
            "%s:%d: %s declares %d features but %s has %d scores per line (line %d): the new "
            "ini carries that over (%d + %d); fix num-features= in %s",
            display_name(self.ini_path),
            update.line,
            update.feature,
            update.old_num_features,
            self.table,
            len(first.scores),
            first.lineno,
            update.old_num_features,
            self.n_new,
            display_name(self.ini_path),
        )

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

    def stage(self, ini_out: str, result):
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

    def before_publish(self, result) -> None:
        """Once the table is complete, before it is renamed into place: the new ini written
        complete under a temporary name (what fails here leaves neither file published)."""
        self.staged = self.stage(self.ini_out, result)

    def discard(self) -> None:
        """The run failed: remove the staged ini, if any."""
        if self.staged is not None:
            self.staged[0].discard()

    def publish(self):
        """Rename the staged ini into place (after the table) and log it; returns the update."""
        staged_file, update = self.staged
        staged_file.publish()
        self.log_written(self.ini_out, update)
        return update
