"""Tuned n-best re-ranking (Sutskever et al. 2014, §3.6; SPEC §3.6): the weight of a feature
that a model adds to Moses n-best lists, tuned on the fixed dev lists with Moses' own tools.

One tuning is three steps in one working directory:

1. ``extractor`` turns the scored dev n-best list into ``features.dat`` (one row of dense
   feature values per hypothesis) and ``scores.dat`` (BLEU sufficient statistics);
2. ``mert`` (Och's line search with random restarts, seeded) finds the weights that maximise
   dev BLEU over those fixed lists, starting from the decoder's tuned weights with the new
   features at 0; it prints ``Best point: w1 ... wn => BLEU`` and writes ``weights.txt``;
   (or ``kbmira``, batch k-best MIRA, ``--rerank-tuner kbmira``: its ``-o`` file names the
   dense weights ``F0 ..`` in feature order, :func:`read_kbmira_weights`);
3. :func:`read_tuned_weights` maps the weight vector back to feature names (the extractor's
   header names each dense value ``Name_i``) and writes them as ``Name= w ...`` lines, the
   file ``phrasescore nbest --weights`` reads to re-rank the test lists.

:class:`RerankStep` runs these for ``ab``: it scores each tuned run's dev and test n-best lists
with every model (one ``phrasescore nbest`` call, one feature per
:class:`~phrasescore.jobs.nbest_features.FeatureModel`), tunes on dev and re-ranks the tests.

The Moses facts used: the extractor's feature header is ``FEATURES_TXT_BEGIN_0 ID N DIM
NAME_0 NAME_1 ...`` (``mert/FeatureArray.cpp``); mert's starting point file ``init.opt`` holds
three lines, the start, the minima and the maxima of the random restarts (as
``mert-moses.pl`` writes it); ``weights.txt`` is the L1-normalised best point, space-separated.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files import AtomicOutput, check_files_exist, iter_lines
from phrasescore.jobs.nbest_features import FeatureModel, parse_feature_models
from phrasescore.moses.nbest import read_weights
from phrasescore.runners.shards import file_sha256

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


@dataclass
class RerankWeights:
    """What ``phrasescore rerank-weights`` wrote."""

    output: str
    what: str
    features: int

    def lines(self) -> list[str]:
        return [f"phrasescore: {self.what} for {self.features} dense values -> {self.output}"]


def rerank_weights(
    features_dat: str, output: str, start: str | None = None, tuned: str | None = None
) -> RerankWeights:
    """``phrasescore rerank-weights``: the bridge between an extractor's ``features.dat`` and
    named weights, for re-ranking by hand (docs/moses.md). With ``start`` (a moses.ini or
    ``Name= w`` file): mert's ``init.opt`` (:func:`write_start_point`; a feature the file does
    not weigh, e.g. a model's, starts at 0). With ``tuned`` (mert's ``weights.txt`` or kbmira's
    output): ``Name= w ...`` lines (:func:`write_weights_file`)."""
    if (start is None) == (tuned is None):
        raise InputError("give one of --start INI (mert's init.opt) or --tuned WEIGHTS")
    names = dense_feature_names(Path(features_dat))
    if start is not None:
        check_files_exist([start])
        weights = read_weights(start)
        write_start_point(Path(output), weight_vector(names, weights, 0.0))
        return RerankWeights(output, "mert start point (init.opt)", len(names))
    write_weights_file(Path(output), read_tuner_output(Path(tuned), names))
    return RerankWeights(output, "tuned weights (Name= w lines)", len(names))


BLEU_SCORER = ["--sctype", "BLEU", "--scconfig", "case:true"]
"""The extractor's and tuners' metric: case-sensitive BLEU (what ``ab`` reports, as sacrebleu
with ``--tokenize none`` on tokenised text)."""


@dataclass
class MosesTuning:
    """Re-ranking weights tuned on fixed n-best lists with Moses' own tools, the part ``ab
    --rerank`` (:meth:`RerankStep.tune`) and ``rerank-tune``
    (:mod:`phrasescore.jobs.rerank_tune`) share: :meth:`extract` once, then :meth:`tune` once
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


def rerank_models(specs: list[str], inverse_specs: list[str] = ()) -> tuple[FeatureModel, ...]:
    """``[NAME=]MODEL[,MODEL...]`` specs of ``--rerank`` and ``--rerank-inverse`` as features
    (:func:`~phrasescore.jobs.nbest_features.parse_feature_models`: several comma-separated
    models are one feature, their ensemble); unnamed ones ``RNNEncDec<i>`` and
    ``RNNEncDecInv<i>``; every file checked and its path resolved."""
    return parse_feature_models(
        specs,
        inverse_specs,
        options=("--rerank", "--rerank-inverse"),
        default_names=("RNNEncDec", "RNNEncDecInv"),
        resolve=True,
    )


@dataclass
class RerankStep:
    """Step 4 of ``ab`` for one tuned run: score its n-best lists with every model, tune the
    weights on the dev lists (extractor, then mert or kbmira), re-rank the test lists.

    Layout in the run's folder: ``scored/`` (the dev lists scored by all the models in one
    ``nbest`` call, under a digest of them: another set of models that starts with the same k
    models scores only the rest, from the list of those k) and :attr:`label` (this set of
    models: the extractor's files, the tuned weights, the re-ranked test outputs)."""

    models: tuple[FeatureModel, ...]
    tuner: str
    restarts: int
    threads: int
    program: Callable[[str], str]
    """The path of a Moses program (``extractor``, ``mert``, ``kbmira``)."""
    run: Callable[..., None]
    """``run(command, cwd, log_name)``: runs one command (``ab``'s :class:`Programs`)."""
    nbest_size: int = 100
    """The n-best lists' size (``--nbest-size``): part of every cached file's key, so that
    another size in the same workdir scores and tunes its own lists."""

    @property
    def name(self) -> str:
        """``rerank`` (mert, the name from before kbmira was offered, so that an earlier
        workdir resumes) or ``rerank-kbmira``: the re-ranked systems' suffix and outputs."""
        return "rerank" if self.tuner == "mert" else f"rerank-{self.tuner}"

    @property
    def tuned_weights_name(self) -> str:
        """The tuned weights' file in the re-ranking folder (mert's name as before)."""
        return "weights.txt.ini" if self.tuner == "mert" else f"weights.{self.tuner}.ini"

    @functools.cached_property
    def label(self) -> str:
        """The folder of one set of re-ranking models and one n-best size: the models' names and
        file digests, after ``NBEST-best-`` unless the size is 100 (the name from before
        ``--nbest-size`` was offered, so that an earlier workdir resumes)."""
        return "rerank-" + self._size_key + "+".join(self.model_labels)

    @property
    def _size_key(self) -> str:
        return "" if self.nbest_size == 100 else f"{self.nbest_size}best-"

    def scored_list(self, run_dir: Path, set_name: str, models: int) -> Path:
        """Where the list of ``set_name`` scored by the first ``models`` models is kept: under a
        digest of their labels (and of the n-best size), shared by every set of models that
        starts with the same ones."""
        prefix = self._size_key + "+".join(self.model_labels[:models])
        digest = hashlib.sha256(prefix.encode("utf-8")).hexdigest()[:10]
        return run_dir / "scored" / f"{set_name}.{digest}.nbest"

    @functools.cached_property
    def model_labels(self) -> list[str]:
        """``NAME-[inverse-]DIGEST[.DIGEST...]`` of each re-ranking feature (the first 10 hex
        digits of its model files' SHA-256), in order."""
        return [
            f"{name}-{'inverse-' if inverse else ''}"
            + ".".join(file_sha256(path)[:10] for path in paths)
            for name, paths, inverse in self.models
        ]

    def score(
        self, nbest: Path, set_name: str, source: Path, run_dir: Path, weights: Path | None = None
    ) -> Path:
        """``nbest`` (of the source sentences ``source`` of the set ``set_name``) with every
        model's feature added by one ``phrasescore nbest`` call, started from the list scored
        by the longest run of first models already (``scored/``, :meth:`scored_list`); with
        ``weights``, the re-ranked 1-best texts of that call instead (the whole scored list is
        then not kept)."""
        work = run_dir / self.label
        if weights is not None:
            target = work / f"{set_name}.{self.name}.out"
        else:
            target = self.scored_list(run_dir, set_name, len(self.models))
            target.parent.mkdir(exist_ok=True)
        if target.exists():
            return target
        done = max(
            k for k in range(len(self.models) + 1) if k == 0 or self._scored(run_dir, set_name, k)
        )
        current = nbest if done == 0 else self.scored_list(run_dir, set_name, done)
        command = [sys.executable, "-m", "phrasescore", "nbest", str(current)]
        command += ["--source", str(source)]
        for name, paths, inverse in self.models[done:]:
            command += ["--inverse-model" if inverse else "-m", f"{name}={','.join(paths)}"]
        command += ["-o", str(target), "--no-progress", "--threads", str(self.threads)]
        if weights is not None:
            command += ["--weights", str(weights), "--one-best"]
        self.run(command, work, f"{target.name}.log")
        return target

    def _scored(self, run_dir: Path, set_name: str, models: int) -> bool:
        return self.scored_list(run_dir, set_name, models).exists()

    def tune(
        self,
        run_dir: Path,
        dev_nbest: Callable[[], Path],
        dev: tuple[Path, Path],
        seed: int,
        start: dict[str, list[float]],
    ) -> Path:
        """``Name= w`` lines: the run's features (tuned weights ``start``) and the models'
        tuned on the fixed dev n-best list ``dev_nbest()`` of ``dev`` (source, reference) with
        Moses' extractor and mert or kbmira, seeded with ``seed``."""
        work = run_dir / self.label
        tuned = work / self.tuned_weights_name
        if tuned.exists():
            return tuned
        work.mkdir(parents=True, exist_ok=True)
        source, reference = dev
        scored = self.score(dev_nbest(), "dev", source, run_dir)
        tuning = MosesTuning(self.program, self.run, self.tuner, self.restarts)
        names = tuning.extract(scored, reference, work)
        write_weights_file(tuned, tuning.tune(work, names, start, seed))
        return tuned

    def rerank(
        self, nbest: Path, set_name: str, source: Path, run_dir: Path, weights: Path
    ) -> Path:
        """The list ``nbest`` of test set ``set_name`` re-ranked with the tuned ``weights``:
        its 1-best texts."""
        return self.score(nbest, set_name, source, run_dir, weights)
