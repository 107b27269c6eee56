"""Tuned n-best re-ranking for ``ab --rerank`` (Sutskever et al. 2014, §3.6), and the
``rerank-weights`` command that converts weights by hand.

:class:`RerankStep` scores each tuned run's dev and test n-best lists with every model (one
``phrasescore nbest`` call and one feature per
:class:`~phrasescore.jobs.feature_specs.FeatureModel`, the features then joined into one list),
tunes the weights on the fixed dev lists with Moses' ``extractor`` and ``mert``/``kbmira``
(:class:`~phrasescore.jobs.tuning.moses_tools.MosesTuning`, shared with ``rerank-tune``) and re-ranks
the tests. :func:`rerank_weights` turns the extractor's files and a tuner's output into the
``Name= w ...`` lines ``nbest --weights`` reads, and a moses.ini into mert's ``init.opt``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.inputs import check_files_exist
from phrasescore.files.outputs import AtomicOutput
from phrasescore.jobs.feature_specs import FeatureModel, parse_feature_models
from phrasescore.jobs.tuning.moses_tools import MosesTuning
from phrasescore.moses.nbest import (
    iter_nbest_groups,
    join_added_features,
    read_nbest,
    read_weights,
    with_sentence_id,
)
from phrasescore.moses.tuning import (
    dense_feature_names,
    read_tuner_output,
    weight_vector,
    write_start_point,
    write_weights_file,
)
from phrasescore.runners.shards import file_sha256

log = logging.getLogger(__name__)


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
        check_files_exist([start])
        weights = read_weights(start)
        write_start_point(Path(output), weight_vector(names, weights, 0.0))
        return RerankWeights(output, "mert start point (init.opt)", len(names))
    write_weights_file(Path(output), read_tuner_output(Path(tuned), names))
    return RerankWeights(output, "tuned weights (Name= w lines)", len(names))


def rerank_models(specs: list[str], inverse_specs: list[str] = ()) -> tuple[FeatureModel, ...]:
    """``[NAME=]MODEL[,MODEL...]`` specs of ``--rerank`` and ``--rerank-inverse`` as features
    (:func:`~phrasescore.jobs.feature_specs.parse_feature_models`: several comma-separated
    models are one feature, their ensemble); unnamed ones ``RNNEncDec<i>`` and
    ``RNNEncDecInv<i>``; every file checked and its path resolved."""
    return parse_feature_models(
        specs,
        inverse_specs,
        options=("--rerank", "--rerank-inverse"),
        default_names=("RNNEncDec", "RNNEncDecInv"),
        resolve=True,
    )


def tuning_variant(tuner: str, tuned_weights: str) -> str:
    """The tuner, and ``new`` for ``tuned_weights="new"``; empty for mert on every weight (the
    name of workdirs made before either choice, so that they resume)."""
    if tuned_weights == "new":
        return "new"
    return "" if tuner == "mert" else tuner


def reranked_system_suffix(set_name: str, tuner: str, tuned_weights: str) -> str:
    """``SET`` (``rerank`` without sets), ``SET-kbmira`` or ``SET-new``: what a re-ranked
    system's name adds to its system's."""
    variant = tuning_variant(tuner, tuned_weights)
    return set_name + (f"-{variant}" if variant else "")


HELD_OUT_FOLDS = 2
"""The parts ``ab``'s held-out dev BLEU cuts the dev sentences into (two-fold cross-validation:
each half's 1-best chosen by weights tuned on the other half)."""


def dev_folds(sentences: int, folds: int) -> list[range]:
    """The sentence ids 0 .. ``sentences`` - 1 in ``folds`` consecutive parts of nearly equal
    size (the first ones one longer)."""
    if not 2 <= folds <= sentences:
        raise InputError(f"cannot cut {sentences} dev sentences into {folds} parts")
    size, extra = divmod(sentences, folds)
    bounds = [0]
    for index in range(folds):
        bounds.append(bounds[-1] + size + (index < extra))
    return [range(bounds[i], bounds[i + 1]) for i in range(folds)]


def write_part(nbest: Path, ids: list[int], output: Path) -> None:
    """The hypotheses of the sentences ``ids`` (ascending) of ``nbest``, numbered from 0 in
    that order: an n-best list of its own for ``extractor``, against those sentences'
    references."""
    new_id = {old: new for new, old in enumerate(ids)}
    with AtomicOutput(str(output)) as out:
        for group in iter_nbest_groups(read_nbest(str(nbest))):
            if group[0].id in new_id:
                out.writelines(with_sentence_id(e, new_id[group[0].id]).line() for e in group)


@dataclass
class RerankStep:
    """Step 4 of ``ab`` for one tuned run: score its n-best lists with every model, tune the
    weights on the dev lists (extractor, then mert or kbmira), re-rank the test lists.

    Layout in the run's folder: ``scored/`` (the dev and test lists scored by each model alone,
    under a digest of its label, and by the set, its features joined from those, under a digest
    of every label: another set scores only the models it does not share with an earlier one)
    and :attr:`label` (this set of models: the extractor's files, the tuned weights, the
    re-ranked test outputs)."""

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
    tuned_weights: str = "all"
    """``all`` weights tuned, or ``new``: only the models', the run's own kept (mert only)."""
    set_name: str = "rerank"
    """The set's name (``ab --rerank-set NAME=...``): the re-ranked systems' suffix."""

    @property
    def _variant(self) -> str:
        return tuning_variant(self.tuner, self.tuned_weights)

    @property
    def name(self) -> str:
        """``rerank`` (mert, every weight), ``rerank-kbmira`` or ``rerank-new`` (mert, the
        models' weights only), the set's name in place of ``rerank``: the re-ranked systems'
        suffix and outputs."""
        return reranked_system_suffix(self.set_name, self.tuner, self.tuned_weights)

    @property
    def tuned_weights_name(self) -> str:
        """The tuned weights' file in the re-ranking folder."""
        return f"weights.{self._variant}.ini" if self._variant else "weights.txt.ini"

    @functools.cached_property
    def label(self) -> str:
        """The folder of one set of re-ranking models and one n-best size: the models' names and
        file digests, after ``NBEST-best-`` unless the size is 100 (the name of workdirs made
        without ``--nbest-size``, so that they resume)."""
        return "rerank-" + self._size_key + "+".join(self.model_labels)

    @property
    def _size_key(self) -> str:
        return "" if self.nbest_size == 100 else f"{self.nbest_size}best-"

    def scored_list(self, run_dir: Path, set_name: str, labels: list[str] | None = None) -> Path:
        """Where the list of ``set_name`` scored by the features of ``labels`` (by default every
        model's, :attr:`model_labels`) is kept: under a digest of those labels and of the n-best
        size. The list of one feature is the one every set of models with that model shares."""
        labels = self.model_labels if labels is None else labels
        key = self._size_key + "+".join(labels)
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:10]
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
        model's feature added: each feature's own list (``scored/``, :meth:`scored_list` of its
        label) scored by one ``phrasescore nbest`` call where it is not kept yet, then the
        features of those lists joined in the models' order
        (:func:`~phrasescore.moses.nbest.join_added_features`), so that another set of models
        scores only the models it does not share with an earlier one, in any order. With
        ``weights``, then the re-ranked 1-best texts of that scored list (a second ``nbest``
        call with ``--weights`` and no model: the features are in the list), so that another
        choice of weights on the same lists (``--rerank-tune new`` after ``all``) re-ranks
        without scoring again."""
        # the commands run in the work folder: every path they are given is absolute
        nbest, source, run_dir = nbest.resolve(), source.resolve(), run_dir.resolve()
        weights = None if weights is None else weights.resolve()
        work = run_dir / self.label
        scored = self.scored_list(run_dir, set_name)
        target = scored if weights is None else work / f"{set_name}.{self.name}.out"
        if target.exists():
            return target
        work.mkdir(parents=True, exist_ok=True)  # each command's log goes there
        if not scored.exists():
            scored.parent.mkdir(exist_ok=True)
            features = []
            for (name, paths, inverse), label in zip(self.models, self.model_labels, strict=True):
                feature = self.scored_list(run_dir, set_name, [label])
                if not feature.exists():
                    command = [sys.executable, "-m", "phrasescore", "nbest", str(nbest)]
                    command += ["--source", str(source)]
                    command += ["--inverse-model" if inverse else "-m", f"{name}={','.join(paths)}"]
                    command += ["-o", str(feature), "--no-progress", "--threads", str(self.threads)]
                    self.run(command, work, f"{feature.name}.log")
                features.append(str(feature))
            if not scored.exists():  # one model: its feature's list is the set's
                with AtomicOutput(str(scored)) as out:
                    out.writelines(join_added_features(str(nbest), features))
                log.info("%s: the features of %d models' lists joined", scored, len(features))
        if weights is None:
            return scored
        command = [sys.executable, "-m", "phrasescore", "nbest", str(scored)]
        command += ["--source", str(source), "--weights", str(weights), "--one-best"]
        command += ["-o", str(target), "--no-progress"]
        self.run(command, work, f"{target.name}.log")
        return target

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
        write_weights_file(tuned, self._tune_list(scored, reference, work, start, seed))
        return tuned

    def _tune_list(
        self, scored: Path, reference: Path, work: Path, start: dict[str, list[float]], seed: int
    ) -> dict[str, list[float]]:
        """The weights of a scored list and its references: Moses' extractor, then mert or
        kbmira seeded with ``seed`` from ``start`` (``--rerank-tune new``: only the weights
        ``start`` lacks move), in ``work``."""
        tuning = MosesTuning(self.program, self.run, self.tuner, self.restarts)
        names = tuning.extract(scored, reference, work)
        keep_start = self.tuned_weights == "new"
        return tuning.tune(work, names, start, seed, keep_start=keep_start)

    def heldout_dev_weights(
        self,
        run_dir: Path,
        references: list[str],
        seed: int,
        start: dict[str, list[float]],
        folds: int = HELD_OUT_FOLDS,
    ) -> list[tuple[range, dict[str, list[float]]]]:
        """Cross-validation on the dev list: its sentences cut into ``folds`` consecutive parts
        (:func:`dev_folds`), and for each part the weights tuned as :meth:`tune` tunes them
        (same tuner, restarts, seed and start) on the scored dev list of the other parts alone.
        Each part's 1-best under its weights is then chosen by weights that never saw its
        sentences: a dev BLEU free of the tuning's fit to its own sentences, which grows with
        the number of features (``ab``'s "dev held out"). Kept in ``heldout-FOLDS/`` of the
        set's folder (``heldout-FOLDS-kbmira/``, ``heldout-FOLDS-new/`` for the other ways of
        tuning, so that each way's figure is its own in a workdir that has several), each
        part's weights tuned once."""
        scored = self.scored_list(run_dir, "dev")
        work = run_dir / self.label / "-".join(filter(None, (f"heldout-{folds}", self._variant)))
        tuned = []
        for index, held_out in enumerate(dev_folds(len(references), folds)):
            fold = work / f"fold-{index}"
            weights_file = fold / "weights.ini"
            if not weights_file.exists():
                fold.mkdir(parents=True, exist_ok=True)
                kept = [i for i in range(len(references)) if i not in held_out]
                nbest, reference = fold / "tune.nbest", fold / "tune.ref"
                write_part(scored, kept, nbest)
                with AtomicOutput(str(reference)) as out:
                    out.writelines(references[i] + "\n" for i in kept)
                weights = self._tune_list(nbest, reference, fold, start, seed)
                write_weights_file(weights_file, weights)
            tuned.append((held_out, read_weights(str(weights_file))))
        return tuned

    def rerank(
        self, nbest: Path, set_name: str, source: Path, run_dir: Path, weights: Path
    ) -> Path:
        """The list ``nbest`` of test set ``set_name`` re-ranked with the tuned ``weights``:
        its 1-best texts."""
        return self.score(nbest, set_name, source, run_dir, weights)
