"""Moses' own programs as the jobs run them: an installation's programs (found and checked by
:class:`~phrasescore.jobs.moses_install.MosesInstall`) run in process groups with their logs
(:class:`Programs`), and weights tuned on fixed n-best lists (Sutskever et al. 2014, §3.6) with its
``extractor`` and ``mert`` or ``kbmira`` (:class:`MosesTuning`), the part ``ab --rerank`` and
``rerank-tune`` share.

One tuning is three steps in one working directory: ``extractor`` turns the scored dev n-best
list into ``features.dat`` and ``scores.dat``; ``mert`` (Och's line search with random restarts,
seeded) or ``kbmira`` (batch k-best MIRA) finds the weights that maximise dev BLEU over those
fixed lists, starting from the decoder's tuned weights with the new features at 0; the weight
vector is mapped back to feature names. The files they pass, and the ``Name= w ...`` lines that
``phrasescore nbest --weights`` reads, are :mod:`phrasescore.moses.tuning`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files.disk import disk_errors, disk_full_error
from phrasescore.moses.tuning import (
    dense_feature_names,
    read_kbmira_weights,
    read_tuned_weights,
    weight_vector,
    write_start_point,
)

log = logging.getLogger(__name__)


class Programs:
    """Runs the Moses programs of an A/B, each in a process group of its own, its stderr (and
    stdout unless redirected) in a log file; :meth:`stop` ends every group that runs (a
    ``mert-moses.pl`` with the decoders it started), so that an interrupted ``ab`` (Ctrl-C,
    SIGTERM) stops at once instead of finishing its queue of MERT runs."""

    def __init__(self) -> None:
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def run(
        self,
        command: list[str],
        cwd: Path,
        log_name: str,
        stdin: Path | None = None,
        stdout: Path | None = None,
    ) -> None:
        log_path = cwd / log_name
        log.debug("running in %s: %s", cwd, shlex.join(command))
        with contextlib.ExitStack() as files:
            with disk_errors(str(log_path)):
                log_file = files.enter_context(open(log_path, "wb"))
            stdin_file = files.enter_context(open(stdin, "rb")) if stdin else subprocess.DEVNULL
            stdout_file = files.enter_context(open(stdout, "wb")) if stdout else log_file
            with self._lock:
                if self._stopped:
                    raise InputError(f"stopped before {Path(command[0]).name}")
                process = subprocess.Popen(
                    command,
                    cwd=cwd,
                    stdin=stdin_file,
                    stdout=stdout_file,
                    stderr=log_file,
                    start_new_session=True,
                )
                self._running.add(process)
            try:
                returncode = process.wait()
            finally:
                with self._lock:
                    self._running.discard(process)
        full = disk_full_error(cwd)
        if full is not None:  # the tools do not all check their writes (extractor exits 0)
            full.message += (
                f" (the disk filled up while {Path(command[0]).name} ran: its files here are "
                "incomplete)"
            )
            raise full
        if returncode != 0:
            raise InputError(
                f"{Path(command[0]).name} failed with exit code {returncode}; see {log_path}"
            )

    def stop(self) -> None:
        """SIGTERM to the process group of every program that runs; none starts after this."""
        with self._lock:
            self._stopped = True
            for process in self._running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)


BLEU_SCORER = ["--sctype", "BLEU", "--scconfig", "case:true"]
"""The extractor's and tuners' metric: case-sensitive BLEU (what ``ab`` reports, as sacrebleu
with ``--tokenize none`` on tokenised text)."""


@dataclass
class MosesTuning:
    """Re-ranking weights tuned on fixed n-best lists with Moses' own tools, the part ``ab
    --rerank`` (:meth:`RerankStep.tune`) and ``rerank-tune``
    (:mod:`phrasescore.jobs.tuning.rerank_tune`) share: :meth:`extract` once, then :meth:`tune` once
    per seed."""

    program: Callable[[str], str]
    """The path of a Moses program (``extractor``, ``mert``, ``kbmira``)."""
    run: Callable[..., None]
    """``run(command, cwd, log_name)``: runs one command (``ab``'s ``Programs.run``)."""
    tuner: str = "mert"
    """``mert`` or ``kbmira`` (:data:`~phrasescore.jobs.moses_install.RERANK_TUNERS`)."""
    restarts: int = 20
    """mert's random restarts (``-n``)."""

    def extract(self, scored: Path, reference: Path, work: Path) -> list[str]:
        """``extractor`` on the scored list ``scored`` and its ``reference``: ``features.dat``
        and ``scores.dat`` in ``work``; returns the dense value names (``LM0_0``, ...)."""
        extract = [self.program("extractor"), *BLEU_SCORER, "-r", str(reference)]
        extract += ["-n", str(scored), "--scfile", "scores.dat", "--ffile", "features.dat"]
        self.run(extract, work, "extract.log")
        return dense_feature_names(work / "features.dat")

    def tune(
        self,
        work: Path,
        names: list[str],
        start: dict[str, list[float]],
        seed: int,
        data: Path | None = None,
        keep_start: bool = False,
    ) -> dict[str, list[float]]:
        """One run of mert (``restarts`` random restarts) or kbmira seeded with ``seed``, in
        ``work``, on the extractor's files in ``data`` (default ``work``), from ``start`` (a
        feature it does not weigh starts at 0, :func:`write_start_point`); the tuned weights
        by feature name. ``keep_start`` (mert only): mert moves only the features ``start`` does
        not weigh (:meth:`new_values`), every other weight kept at its start (mert's ``-o``,
        mert-moses.pl's ``--activate-features``)."""
        rel = os.path.relpath(data or work, work)
        rel = "" if rel == "." else rel
        scores, features = (os.path.join(rel, name) for name in ("scores.dat", "features.dat"))
        write_start_point(work / "init.opt", weight_vector(names, start, 0.0))
        if self.tuner == "kbmira":
            mira = [self.program("kbmira"), *BLEU_SCORER, "-r", str(seed)]
            mira += ["-S", scores, "-F", features, "-d", "init.opt", "-o", "mira.out"]
            self.run(mira, work, "kbmira.log")
            return read_kbmira_weights(work / "mira.out", names)
        mert = [self.program("mert"), "-d", str(len(names)), *BLEU_SCORER]
        mert += ["-n", str(self.restarts), "-r", str(seed)]
        mert += ["--scfile", scores, "--ffile", features, "--ifile", "init.opt"]
        if keep_start:
            mert += ["-o", ",".join(self.new_values(names, start))]
        self.run(mert, work, "mert.log")
        return read_tuned_weights(work / "weights.txt", names)

    @staticmethod
    def new_values(names: list[str], start: dict[str, list[float]]) -> list[str]:
        """The value names (``L2R_0``) of the features ``start`` does not weigh."""
        return [name for name in names if name.rsplit("_", 1)[0] not in start]
