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
with every model (``phrasescore nbest``, one feature per :class:`RerankModel`), tunes on dev and
re-ranks the tests.

The Moses facts used: the extractor's feature header is ``FEATURES_TXT_BEGIN_0 ID N DIM
NAME_0 NAME_1 ...`` (``mert/FeatureArray.cpp``); mert's starting point file ``init.opt`` holds
three lines, the start, the minima and the maxima of the random restarts (as
``mert-moses.pl`` writes it); ``weights.txt`` is the L1-normalised best point, space-separated.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from phrasescore.errors import InputError
from phrasescore.files import AtomicOutput, check_input_file, refuse_outputs_onto_inputs
from phrasescore.moses.ini import read_weights
from phrasescore.moses.nbest import check_feature_name
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
    with open(features_dat, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(FEATURES_HEADER):
                fields = line.split()
                dimension = int(fields[3])
                names = fields[4:]
                if len(names) != dimension:
                    raise InputError(
                        f"feature header names {len(names)} values, expected {dimension}",
                        path=str(features_dat),
                    )
                return names
    raise InputError("no feature header: not an extractor features file", path=str(features_dat))


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


def read_tuned_weights(weights_txt: Path, names: list[str]) -> dict[str, list[float]]:
    """mert's ``weights.txt`` (one line, one weight per dense value) by feature name."""
    text = weights_txt.read_text(encoding="utf-8").split()
    try:
        vector = [float(value) for value in text]
    except ValueError:
        raise InputError("not a mert weights file", path=str(weights_txt)) from None
    if len(vector) != len(names):
        raise InputError(f"{len(vector)} weights for {len(names)} features", path=str(weights_txt))
    return weights_by_feature(names, vector)


def read_kbmira_weights(output: Path, names: list[str]) -> dict[str, list[float]]:
    """kbmira's ``-o`` file by feature name, L1-normalised as mert's ``weights.txt`` is.

    Started from a legacy ``init.opt`` (:func:`write_start_point`), kbmira names the dense
    weights ``F0 .. F(n-1)`` in the order of the extractor's features (``mert/kbmira.cpp``);
    lines of sparse features (other names) are not expected from dense feature files.
    """
    vector: list[float | None] = [None] * len(names)
    for lineno, line in enumerate(output.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        match = _KBMIRA_NAME.match(fields[0])
        if len(fields) != 2 or not match or int(match.group(1)) >= len(names):
            raise InputError(f"not a dense kbmira weight: {line!r}", path=str(output), line=lineno)
        try:
            vector[int(match.group(1))] = float(fields[1])
        except ValueError:
            raise InputError(
                f"not a number: {fields[1]!r}", path=str(output), line=lineno
            ) from None
    if any(value is None for value in vector):
        raise InputError(f"kbmira gave {sum(v is not None for v in vector)} of {len(names)} weights",
                         path=str(output))  # fmt: skip
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
    first = path.read_text(encoding="utf-8").split(maxsplit=1)[:1]
    if first and _KBMIRA_NAME.match(first[0]):
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
    refuse_outputs_onto_inputs(
        {"FEATURES_DAT": features_dat, "--start": start, "--tuned": tuned}, {"-o": output}
    )
    names = dense_feature_names(Path(features_dat))
    if start is not None:
        weights = read_weights(Path(start).read_text(encoding="utf-8"), start)
        write_start_point(Path(output), weight_vector(names, weights, 0.0))
        return RerankWeights(output, "mert start point (init.opt)", len(names))
    write_weights_file(Path(output), read_tuner_output(Path(tuned), names))
    return RerankWeights(output, "tuned weights (Name= w lines)", len(names))


class RerankModel(NamedTuple):
    """One re-ranking feature: its name, its model files (several: their ensemble, ``nbest -m A
    -m B``) and its direction."""

    name: str
    paths: tuple[str, ...]
    inverse: bool = False
    """A target->source model: the feature is log p(source | hypothesis) (``nbest --inverse``)."""


def rerank_models(specs: list[str], inverse_specs: list[str] = ()) -> tuple[RerankModel, ...]:
    """``[NAME=]MODEL[,MODEL...]`` specs of ``--rerank`` and ``--rerank-inverse`` as features
    (several comma-separated models: one feature, their ensemble); unnamed ones
    ``RNNEncDec<i>`` and ``RNNEncDecInv<i>``."""
    models: list[RerankModel] = []
    for inverse, option, default, given in (
        (False, "--rerank", "RNNEncDec", specs),
        (True, "--rerank-inverse", "RNNEncDecInv", inverse_specs),
    ):
        for index, spec in enumerate(given):
            name, sep, path = spec.partition("=")
            if not sep:
                name, path = f"{default}{index}", spec
            check_feature_name(name)
            if name in {known.name for known in models}:
                raise InputError(f"{option} {spec}: feature name {name} given twice")
            checked = tuple(
                str(check_input_file(Path(one), f"{option} {name} model"))
                for one in path.split(",")
            )
            models.append(RerankModel(name, checked, inverse))
    return tuple(models)


@dataclass
class RerankStep:
    """Step 4 of ``ab`` for one tuned run: score its n-best lists with every model, tune the
    weights on the dev lists (extractor, then mert or kbmira), re-rank the test lists.

    Layout in the run's folder: ``scored/`` (lists scored by the first k models, under a digest
    of those k: another set of models with the same first k scores only the rest) and
    :attr:`label` (this set of models: the extractor's files, the tuned weights, the re-ranked
    test outputs)."""

    models: tuple[RerankModel, ...]
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
        model's feature added (``phrasescore nbest``, one feature after the other); with
        ``weights``, the re-ranked 1-best texts of the last call instead."""
        current = nbest
        work = run_dir / self.label
        for index, (name, paths, inverse) in enumerate(self.models):
            rerank = weights is not None and index == len(self.models) - 1
            if rerank:
                target = work / f"{set_name}.{self.name}.out"
            else:
                target = self.scored_list(run_dir, set_name, index + 1)
                target.parent.mkdir(exist_ok=True)
            if not target.exists():
                command = [sys.executable, "-m", "phrasescore", "nbest", str(current)]
                command += ["--source", str(source), "--name", name]
                command += [arg for path in paths for arg in ("-m", path)]
                command += ["--inverse"] if inverse else []
                command += ["-o", str(target), "--no-progress", "--threads", str(self.threads)]
                if rerank:
                    command += ["--weights", str(weights), "--one-best"]
                self.run(command, work, f"{target.name}.log")
            current = target
        return current

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
        bleu = ["--sctype", "BLEU", "--scconfig", "case:true"]
        extract = [self.program("extractor"), *bleu, "-r", str(reference)]
        extract += ["-n", str(scored), "--scfile", "scores.dat", "--ffile", "features.dat"]
        self.run(extract, work, "extract.log")
        names = dense_feature_names(work / "features.dat")
        write_start_point(work / "init.opt", weight_vector(names, start, 0.0))
        if self.tuner == "kbmira":
            mira = [self.program("kbmira"), *bleu, "-r", str(seed)]
            mira += ["-S", "scores.dat", "-F", "features.dat", "-d", "init.opt", "-o", "mira.out"]
            self.run(mira, work, "kbmira.log")
            write_weights_file(tuned, read_kbmira_weights(work / "mira.out", names))
            return tuned
        mert = [self.program("mert"), "-d", str(len(names)), *bleu]
        mert += ["-n", str(self.restarts), "-r", str(seed)]
        mert += ["--scfile", "scores.dat", "--ffile", "features.dat", "--ifile", "init.opt"]
        self.run(mert, work, "mert.log")
        write_weights_file(tuned, read_tuned_weights(work / "weights.txt", names))
        return tuned

    def rerank(
        self, nbest: Path, set_name: str, source: Path, run_dir: Path, weights: Path
    ) -> Path:
        """The list ``nbest`` of test set ``set_name`` re-ranked with the tuned ``weights``:
        its 1-best texts."""
        return self.score(nbest, set_name, source, run_dir, weights)
