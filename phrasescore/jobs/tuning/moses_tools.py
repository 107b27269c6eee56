"""Moses' own programs as the jobs run them: an installation found and checked
(:class:`MosesInstall`), its programs run in process groups with their logs (:class:`Programs`),
and weights tuned on fixed n-best lists (Sutskever et al. 2014, §3.6; SPEC §3.6) with its
``extractor`` and ``mert`` or ``kbmira`` (:class:`MosesTuning`), the part ``ab --rerank`` and
``rerank-tune`` share.

One tuning is three steps in one working directory:

1. ``extractor`` turns the scored dev n-best list into ``features.dat`` (one row of dense
   feature values per hypothesis) and ``scores.dat`` (BLEU sufficient statistics);
2. ``mert`` (Och's line search with random restarts, seeded) finds the weights that maximise
   dev BLEU over those fixed lists, starting from the decoder's tuned weights with the new
   features at 0; it prints ``Best point: w1 ... wn => BLEU`` and writes ``weights.txt``
   (or ``kbmira``, batch k-best MIRA: its ``-o`` file names the dense weights ``F0 ..`` in
   feature order, :func:`read_kbmira_weights`);
3. :func:`read_tuned_weights` maps the weight vector back to feature names (the extractor's
   header names each dense value ``Name_i``) and writes them as ``Name= w ...`` lines, the
   file ``phrasescore nbest --weights`` reads to re-rank the test lists.

The Moses facts used: the extractor's feature header is ``FEATURES_TXT_BEGIN_0 ID N DIM
NAME_0 NAME_1 ...`` (``mert/FeatureArray.cpp``); mert's starting point file ``init.opt`` holds
three lines, the start, the minima and the maxima of the random restarts (as
``mert-moses.pl`` writes it); ``weights.txt`` is the L1-normalised best point, space-separated.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files import AtomicOutput, check_files_exist, iter_lines

log = logging.getLogger(__name__)

FEATURES_HEADER = "FEATURES_TXT_BEGIN_0"
_VALUE_NAME = re.compile(r"(.+)_(\d+)\Z")
_KBMIRA_NAME = re.compile(r"F(\d+)\Z")
"""kbmira's name of dense weight i when started from a legacy ``init.opt``."""
RERANK_TUNERS = {"mert": "bin/mert", "kbmira": "bin/kbmira"}
"""The tuners of ``--rerank-tuner``: Och's MERT (line search with random restarts) or batch
k-best MIRA (Cherry & Foster 2012), each run on the fixed dev lists."""


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
        value = float(text)
    except ValueError:
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


def write_weights_file(path: Path, weights: dict[str, list[float]]) -> None:
    """``Name= w1 w2`` lines: what ``phrasescore nbest --weights`` and ``moses
    -weight-overwrite`` read."""
    with AtomicOutput(str(path)) as out:
        for name, values in weights.items():
            out.write(f"{name}= " + " ".join(repr(v) for v in values) + "\n")


def read_tuner_output(path: Path, names: list[str]) -> dict[str, list[float]]:
    """mert's ``weights.txt`` or kbmira's ``-o`` file (``F0 w`` lines), told apart by their
    first field, by feature name."""
    first = next((line.split()[0] for line in _tuner_lines(path) if line.split()), None)
    if first and _KBMIRA_NAME.match(first):
        return read_kbmira_weights(path, names)
    return read_tuned_weights(path, names)


#: What the job needs from a Moses installation, relative to MOSES_HOME.
MOSES_PROGRAMS = {
    "decoder": "bin/moses",
    "mert": "bin/mert",
    "extractor": "bin/extractor",
    "mert-moses.pl": "scripts/training/mert-moses.pl",
    "filter-model-given-input.pl": "scripts/training/filter-model-given-input.pl",
}


@dataclass(frozen=True)
class MosesInstall:
    """Paths of the Moses programs the A/B job runs."""

    home: Path

    @classmethod
    def find(cls, home: str | None, needs: list[str] | None = None) -> MosesInstall:
        """The Moses installation at ``home`` (else $MOSES_HOME, else $MOSES), checked for the
        programs ``needs`` (names in :data:`MOSES_PROGRAMS` or ``RERANK_TUNERS``; default:
        everything ``ab`` runs)."""
        programs = {**MOSES_PROGRAMS, **RERANK_TUNERS}
        wanted = list(MOSES_PROGRAMS.values()) if needs is None else [programs[n] for n in needs]
        home = home or os.environ.get("MOSES_HOME") or os.environ.get("MOSES")
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
    """``mert`` or ``kbmira`` (:data:`RERANK_TUNERS`)."""
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
    ) -> dict[str, list[float]]:
        """One run of mert (``restarts`` random restarts) or kbmira seeded with ``seed``, in
        ``work``, on the extractor's files in ``data`` (default ``work``), from ``start`` (a
        feature it does not weigh starts at 0, :func:`write_start_point`); the tuned weights
        by feature name."""
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
        self.run(mert, work, "mert.log")
        return read_tuned_weights(work / "weights.txt", names)
