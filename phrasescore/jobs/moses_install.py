"""A Moses installation as the jobs find it: MOSES_HOME (or --moses-home, or $MOSES) checked for
the programs a job runs, before the job starts (``ab``, ``rerank-tune`` and ``recipe``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from phrasescore.errors import InputError

RERANK_TUNERS = {"mert": "bin/mert", "kbmira": "bin/kbmira"}
"""The tuners of ``--rerank-tuner``: Och's MERT (line search with random restarts) or batch
k-best MIRA (Cherry & Foster 2012), each run on the fixed dev lists."""


#: What a MERT-tuned system needs from a Moses installation, relative to MOSES_HOME.
MOSES_PROGRAMS = {
    "decoder": "bin/moses",
    "mert": "bin/mert",
    "extractor": "bin/extractor",
    "mert-moses.pl": "scripts/training/mert-moses.pl",
    "filter-model-given-input.pl": "scripts/training/filter-model-given-input.pl",
}


def named_moses_home(home: str | None) -> str | None:
    """--moses-home, else $MOSES_HOME, else $MOSES; None when none is named."""
    return home or os.environ.get("MOSES_HOME") or os.environ.get("MOSES")


@dataclass(frozen=True)
class MosesInstall:
    """Paths of the Moses programs a job runs."""

    home: Path

    @classmethod
    def find(cls, home: str | None, needs: list[str] | None = None) -> MosesInstall:
        """The Moses installation at ``home`` (else $MOSES_HOME, else $MOSES), checked for the
        programs ``needs`` (names in :data:`MOSES_PROGRAMS` or ``RERANK_TUNERS``; default:
        every one of :data:`MOSES_PROGRAMS`)."""
        programs = {**MOSES_PROGRAMS, **RERANK_TUNERS}
        wanted = list(MOSES_PROGRAMS.values()) if needs is None else [programs[n] for n in needs]
        home = named_moses_home(home)
        if not home:
            raise InputError(
                "Moses not found: set MOSES_HOME (or --moses-home) to a mosesdecoder build "
                "with " + ", ".join(wanted)
            )
        install = cls(Path(home).resolve())
        missing = [rel for rel in wanted if not (install.home / rel).is_file()]
        if missing:
            raise InputError(f"Moses at {install.home} lacks {', '.join(missing)}")
        return install

    def program(self, name: str) -> str:
        return str(self.home / {**MOSES_PROGRAMS, **RERANK_TUNERS}[name])

    def check_has(self, name: str) -> None:
        """Refuse an install without ``name`` (a program only some commands need)."""
        if not Path(self.program(name)).is_file():
            raise InputError(f"Moses at {self.home} lacks {RERANK_TUNERS.get(name, name)}")
