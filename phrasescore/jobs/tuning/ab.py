"""The ``ab`` job: does a new phrase-table column move BLEU? A MERT A/B of Moses systems.

For a baseline moses.ini and one or more candidate inis (e.g. the one ``rescore --moses-ini``
wrote), this job

1. filters every system's phrase tables once, on the dev and test sources together, with Moses'
   own ``filter-model-given-input.pl``;
2. tunes every system K times with ``mert-moses.pl`` (seed ``--mertmertargs "--rseed S"``;
   each run reuses the system's filtered model), at most ``jobs`` runs at a time;
3. decodes every test set with every tuned configuration (``moses -weight-overwrite``);
4. with ``rerank`` models (Sutskever et al. 2014, §3.6), decodes the dev and test n-best lists
   of every tuned run, adds each model's log p(hypothesis | source) (one ``phrasescore nbest``
   call for all models),
   tunes the weights on the fixed dev lists with Moses' extractor and mert
   (:mod:`phrasescore.jobs.tuning.ab_rerank`) and re-ranks the test lists: one more system per system,
   ``NAME+rerank`` (``NAME+rerank-kbmira`` when tuned with kbmira); with ``rerank_sets``, one
   system per set of those features instead, ``NAME+SET``, each tuned and re-ranking on its own
   on the same lists;
5. reports BLEU per system and test set as mean and standard deviation over the K runs, the
   tuned weight of each feature the candidate adds, and the paired bootstrap p-value of each
   candidate against the baseline (or the system ``against``) on the run closest to each
   system's mean (MultEval's advice: Clark et al. 2011, "Better hypothesis testing for
   statistical machine translation").

Every step writes its result under a temporary name and renames it when complete, so a run that
is interrupted resumes where it stopped (MERT itself with ``mert-moses.pl --continue``).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files.guards import check_work_folder
from phrasescore.files.inputs import check_input_file
from phrasescore.files.outputs import AtomicOutput, check_output_dir
from phrasescore.files.reading import iter_lines
from phrasescore.jobs.bleu import bleu_metric
from phrasescore.jobs.feature_specs import FeatureModel
from phrasescore.jobs.moses_install import RERANK_TUNERS, MosesInstall
from phrasescore.jobs.tuning.ab_rerank import (
    HELD_OUT_FOLDS,
    RerankStep,
    rerank_models,
    reranked_system_suffix,
)
from phrasescore.jobs.tuning.moses_tools import Programs
from phrasescore.jobs.tuning.rerank_tune import best_hypotheses, dev_bleu
from phrasescore.moses.ini import read_weights
from phrasescore.moses.tuning import mert_best_bleu, read_reference, weight_line

log = logging.getLogger(__name__)

NAME = re.compile(r"[\w.-]+")
"""What a candidate's or a re-ranking set's name may hold: it names a folder and a report row."""


@dataclass(frozen=True)
class TestSet:
    """A tokenised source file and its reference, named for the report."""

    name: str
    source: Path
    reference: Path


@dataclass(frozen=True)
class System:
    """A Moses configuration to tune; the first system of a comparison is the baseline."""

    name: str
    ini: Path


@dataclass
class RunResult:
    """One tuned run of one system: its weights and the BLEU of each test set."""

    seed: int
    weights: dict[str, list[float]]
    bleu: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, Path] = field(default_factory=dict)
    dev_bleu: float | None = None
    """The dev BLEU where the weights were tuned: mert-moses.pl's last best point, or the dev
    n-best list re-ranked with the tuned weights (sacrebleu); None when it is not known."""
    heldout_dev_bleu: float | None = None
    """A re-ranked run's dev BLEU held out: each half of the dev sentences re-ranked with
    weights tuned on the other half (:meth:`~phrasescore.jobs.tuning.ab_rerank.RerankStep.
    heldout_dev_weights`); None for a decoder's own run."""


@dataclass
class ComparisonOptions:
    """How many runs, how much parallelism, how long MERT may iterate."""

    runs: int = 3
    seeds: tuple[int, ...] = (1234, 5678, 9012, 3456, 7890)
    jobs: int = 2
    decoder_threads: int = 1
    max_iterations: int = 25
    mert_flags: str = ""
    bleu_tokenize: str = "none"
    bootstrap_samples: int = 1000
    rerank: tuple[FeatureModel, ...] = ()
    """The n-best re-ranking models, one feature each (:func:`rerank_models`); empty: none."""
    nbest_size: int = 100
    rerank_restarts: int = 20
    rerank_tuner: str = "mert"
    """``mert`` or ``kbmira`` (:data:`RERANK_TUNERS`)."""
    rerank_tune: str = "all"
    """``all`` weights re-tuned on the dev lists, or ``new``: the models' only (mert)."""
    rerank_systems: tuple[str, ...] | None = None
    """The systems whose runs are re-ranked (None: every system)."""
    rerank_sets: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(NAME, feature names) of each set of re-ranking features that makes a system of its
    own (``--rerank-set``); empty: one set, ``rerank``, of every feature."""
    against: str | None = None
    """The system the p-values compare with (``--against``); None: the baseline."""


@dataclass
class SystemResult:
    """All runs of one system, the new weights it was given, and the test p-values."""

    system: System
    runs: list[RunResult]
    new_weights: dict[str, list[float]]
    p_values: dict[str, float | None] = field(default_factory=dict)

    def bleu_mean_sd(self, test: str) -> tuple[float, float]:
        scores = [run.bleu[test] for run in self.runs]
        sd = statistics.stdev(scores) if len(scores) > 1 else 0.0
        return statistics.fmean(scores), sd

    def closest_to_mean(self, test: str) -> RunResult:
        mean = self.bleu_mean_sd(test)[0]
        return min(self.runs, key=lambda run: (abs(run.bleu[test] - mean), run.seed))


def _line_count(path: Path) -> int:
    return sum(1 for _ in iter_lines(str(path)))


class Comparison:
    """The working directory of one A/B comparison and the steps that fill it."""

    def __init__(
        self,
        moses: MosesInstall,
        workdir: Path,
        systems: list[System],
        dev: TestSet,
        tests: list[TestSet],
        options: ComparisonOptions,
    ):
        if options.runs > len(options.seeds):
            raise InputError(f"--runs {options.runs}: give at least that many --seeds")
        self.moses = moses
        self.workdir = workdir.resolve()
        self.systems = systems
        self.dev = dev
        self.dev_references = read_reference(str(dev.reference))  # each re-ranked run's dev BLEU
        self.tests = tests
        self.options = options
        self.programs = Programs()
        by_name = {model.name: model for model in options.rerank}
        sets = options.rerank_sets or (("rerank", tuple(by_name)),)
        self.rerankings = [
            RerankStep(
                tuple(by_name[feature] for feature in features),
                options.rerank_tuner,
                options.rerank_restarts,
                options.decoder_threads,
                moses.program,
                self.programs.run,
                options.nbest_size,
                options.rerank_tune,
                set_name,
            )
            for set_name, features in sets
        ]

    # -- step 1: one filtered model per system -------------------------------------------------
    def filter_input(self) -> Path:
        """The dev and test sources in one file: what every system's tables are filtered for."""
        path = self.workdir / "filter-input.txt"
        if not path.exists():
            with AtomicOutput(str(path)) as out:
                for source in [self.dev.source] + [test.source for test in self.tests]:
                    for line in iter_lines(str(source)):
                        out.write(line + "\n")
        return path

    def filtered_ini(self, system: System) -> Path:
        """``SYSTEM/filtered/moses.ini``: the system's tables cut to the sentences at hand.

        The filter writes absolute paths into that ini, so it runs in place; the marker
        ``filtered.done`` says it completed (a directory without it is filtered again).
        """
        system_dir = self.workdir / system.name
        final = system_dir / "filtered"
        done = system_dir / "filtered.done"
        if not done.exists():
            system_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(final, ignore_errors=True)
            command = [
                self.moses.program("filter-model-given-input.pl"),
                str(final),
                str(system.ini),
                str(self.filter_input()),
            ]
            self.programs.run(command, system_dir, "filter.log")
            done.touch()
        return final / "moses.ini"

    # -- step 2: MERT runs -----------------------------------------------------------------------
    def tune(self, system: System, seed: int) -> Path:
        """One MERT run of ``system`` with ``seed``; returns the tuned moses.ini."""
        run_dir = self.workdir / system.name / f"mert-{seed}"
        tuned = run_dir / "moses.ini"
        if tuned.exists():
            return tuned
        resume = run_dir.exists() and (run_dir / "finished_step.txt").exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        filtered = run_dir / "filtered"
        if not filtered.exists():  # mert-moses.pl reuses WORKDIR/filtered/moses.ini
            filtered.symlink_to(self.filtered_ini(system).parent)
        command = (
            [
                self.moses.program("mert-moses.pl"),
                str(self.dev.source),
                str(self.dev.reference),
                self.moses.program("decoder"),
                str(system.ini),
                f"--mertdir={self.moses.home / 'bin'}",
                f"--working-dir={run_dir}",
                f"--decoder-flags=-threads {self.options.decoder_threads}",
                f"--mertmertargs=--rseed {seed}",
                f"--maximum-iterations={self.options.max_iterations}",
            ]
            + shlex.split(self.options.mert_flags)
            + (["--continue"] if resume else [])
        )
        log.info("%s: MERT run with seed %d%s", system.name, seed, " (resumed)" if resume else "")
        self.programs.run(command, run_dir, "mert.log")
        if not tuned.exists():
            raise InputError(f"mert-moses.pl wrote no {tuned}; see {run_dir / 'mert.log'}")
        return tuned

    # -- step 3: decode the test sets ------------------------------------------------------------
    def _decoder_command(self, system: System, weights: dict[str, list[float]]) -> list[str]:
        overwrite = " ".join(weight_line(name, values) for name, values in weights.items())
        return [
            self.moses.program("decoder"),
            "-f",
            str(self.filtered_ini(system)),
            "-threads",
            str(self.options.decoder_threads),
            "-weight-overwrite",
            overwrite,
        ]

    def decode(
        self, system: System, run_dir: Path, weights: dict[str, list[float]], test: TestSet
    ) -> Path:
        """Translate ``test`` with the filtered model and the tuned ``weights`` of one run."""
        output = run_dir / f"{test.name}.out"
        if output.exists():
            return output
        partial = output.with_name(output.name + ".partial")
        command = self._decoder_command(system, weights)
        self.programs.run(
            command, run_dir, f"{test.name}.decode.log", stdin=test.source, stdout=partial
        )
        written = _line_count(partial)
        if written != _line_count(test.source):
            raise InputError(f"moses wrote {written} lines for {test.source}", path=str(partial))
        partial.rename(output)
        return output

    def run_one(self, system: System, seed: int) -> RunResult:
        tuned = self.tune(system, seed)
        result = RunResult(seed=seed, weights=read_weights(tuned.read_text(encoding="utf-8")))
        best = mert_best_bleu(tuned.parent)
        result.dev_bleu = None if best is None else 100 * best
        for test in self.tests:
            result.outputs[test.name] = self.decode(system, tuned.parent, result.weights, test)
        return result

    # -- step 4 (with rerank models): tuned n-best re-ranking ------------------------------------
    def decode_nbest(
        self, system: System, run_dir: Path, weights: dict[str, list[float]], test: TestSet
    ) -> Path:
        """The distinct ``nbest_size``-best list of ``test`` under one run's tuned weights."""
        output = run_dir / f"{test.name}.{self.options.nbest_size}best.nbest"
        if output.exists():
            return output
        partial = output.with_name(output.name + ".partial")
        command = self._decoder_command(system, weights) + [
            "-n-best-list",
            str(partial),
            str(self.options.nbest_size),
            "distinct",
        ]
        self.programs.run(
            command, run_dir, f"{test.name}.nbest.log", stdin=test.source, stdout=Path(os.devnull)
        )
        partial.rename(output)
        return output

    def rerank_one(self, system: System, run: RunResult) -> list[RunResult]:
        """One tuned run's test sets, re-ranked with each set of the models' features
        (:class:`~phrasescore.jobs.tuning.ab_rerank.RerankStep`), one set after the other: the
        sets share the run's lists and each model's scored list."""
        run_dir = self.workdir / system.name / f"mert-{run.seed}"

        def dev_nbest() -> Path:
            return self.decode_nbest(system, run_dir, run.weights, self.dev)

        dev = (self.dev.source, self.dev.reference)
        tests = {
            test.name: self.decode_nbest(system, run_dir, run.weights, test) for test in self.tests
        }
        results = []
        for reranking in self.rerankings:
            weights_file = reranking.tune(run_dir, dev_nbest, dev, run.seed, run.weights)
            weights = read_weights(weights_file.read_text("utf-8"))
            result = RunResult(seed=run.seed, weights=weights)
            scored_dev = reranking.scored_list(run_dir, "dev")
            if scored_dev.exists():
                references = self.dev_references
                chosen = best_hypotheses(str(scored_dev), len(references), result.weights)
                result.dev_bleu = dev_bleu(chosen.hypotheses, references)
                result.heldout_dev_bleu = self.heldout_dev_bleu(reranking, run_dir, run)
            for test in self.tests:
                result.outputs[test.name] = reranking.rerank(
                    tests[test.name], test.name, test.source, run_dir, weights_file
                )
            results.append(result)
        return results

    def heldout_dev_bleu(
        self, reranking: RerankStep, run_dir: Path, run: RunResult
    ) -> float | None:
        """The dev BLEU of one run's re-ranked dev list, each part of the dev sentences chosen
        by the weights tuned without it (:meth:`RerankStep.heldout_dev_weights`): what the dev
        BLEU tuned in place says, less the tuning's fit to its own sentences. None for a dev
        set of fewer sentences than parts."""
        references = self.dev_references
        if len(references) < HELD_OUT_FOLDS:
            return None
        scored_dev = str(reranking.scored_list(run_dir, "dev"))
        hypotheses = [""] * len(references)
        for part, weights in reranking.heldout_dev_weights(
            run_dir, references, run.seed, run.weights
        ):
            chosen = best_hypotheses(scored_dev, len(references), weights).hypotheses
            for index in part:
                hypotheses[index] = chosen[index]
        return dev_bleu(hypotheses, references)

    # -- the whole comparison --------------------------------------------------------------------
    def run(self) -> list[SystemResult]:
        """Filter, tune, decode (re-rank) and score every system; the baseline comes first."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.filter_input()
        seeds = self.options.seeds[: self.options.runs]
        pool = ThreadPoolExecutor(max_workers=self.options.jobs)
        try:
            results = self._tune_and_rerank(pool, seeds)
        except BaseException:  # Ctrl-C, SIGTERM or a failed run: stop the others now
            self.programs.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown()
        for result in results:
            for run in result.runs:
                for test in self.tests:
                    run.bleu[test.name] = corpus_bleu(
                        run.outputs[test.name], test.reference, self.options.bleu_tokenize
                    )
        self._add_new_weights(results)
        self._add_p_values(results)
        return results

    def _tune_and_rerank(self, pool: ThreadPoolExecutor, seeds) -> list[SystemResult]:
        """Every system's MERT runs, then the re-ranked runs of the systems chosen."""
        list(pool.map(self.filtered_ini, self.systems))
        futures = {
            (system.name, seed): pool.submit(self.run_one, system, seed)
            for system in self.systems
            for seed in seeds
        }
        runs = {key: future.result() for key, future in futures.items()}
        results = [
            SystemResult(system, [runs[(system.name, seed)] for seed in seeds], {})
            for system in self.systems
        ]
        if self.options.rerank:
            reranked = [
                (
                    result.system,
                    [pool.submit(self.rerank_one, result.system, run) for run in result.runs],
                )
                for result in results
                if self.options.rerank_systems is None
                or result.system.name in self.options.rerank_systems
            ]
            for system, run_futures in reranked:
                per_run = [future.result() for future in run_futures]
                for index, reranking in enumerate(self.rerankings):
                    results.append(
                        SystemResult(
                            System(f"{system.name}+{reranking.name}", system.ini),
                            [runs_here[index] for runs_here in per_run],
                            {},
                        )
                    )
        return results

    def _add_new_weights(self, results: list[SystemResult]) -> None:
        """The weights a candidate has beyond the baseline's features: its new columns."""
        base = results[0].runs[0].weights
        for result in results[1:]:
            for run in result.runs:
                for name, new in new_feature_weights(base, run.weights).items():
                    result.new_weights.setdefault(name, []).extend(new)

    def _add_p_values(self, results: list[SystemResult]) -> None:
        """Each system's p against the baseline, or against ``options.against``."""
        against = results[0]
        if self.options.against is not None:
            (against,) = [r for r in results if r.system.name == self.options.against]
        for test in self.tests:
            references = list(iter_lines(str(test.reference)))
            base_run = against.closest_to_mean(test.name)
            for result in results:
                if result is against:
                    continue
                run = result.closest_to_mean(test.name)
                result.p_values[test.name] = paired_bootstrap_p(
                    references,
                    base_run.outputs[test.name],
                    run.outputs[test.name],
                    self.options.bleu_tokenize,
                    self.options.bootstrap_samples,
                )


def new_feature_weights(
    base: dict[str, list[float]], candidate: dict[str, list[float]]
) -> dict[str, list[float]]:
    """``name[i]`` -> weight for every weight of ``candidate`` beyond the baseline's.

    A column added to a phrase table is a weight past the end of that table's list; a new
    feature function is a name the baseline lacks.
    """
    new = {}
    for name, values in candidate.items():
        start = len(base.get(name, []))
        for index in range(start, len(values)):
            new[f"{name}[{index}]"] = [values[index]]
    return new


def corpus_bleu(hypotheses: Path, reference: Path, tokenize: str) -> float:
    """Corpus BLEU of a decoder output (sacrebleu; ``tokenize='none'`` for tokenised text)."""
    hyps = list(iter_lines(str(hypotheses)))
    refs = list(iter_lines(str(reference)))
    return bleu_metric(tokenize).corpus_score(hyps, [refs]).score


def paired_bootstrap_p(
    references: list[str], baseline: Path, candidate: Path, tokenize: str, samples: int
) -> float | None:
    """sacrebleu's paired bootstrap resampling (Koehn 2004): p of the candidate vs baseline."""
    from sacrebleu.significance import PairedTest

    systems = [
        ("baseline", list(iter_lines(str(baseline)))),
        ("candidate", list(iter_lines(str(candidate)))),
    ]
    test = PairedTest(
        systems, {"BLEU": bleu_metric(tokenize)}, [references], test_type="bs", n_samples=samples
    )
    _, scores = test()
    return scores["BLEU"][1].p_value


def compare_systems(
    baseline: str,
    candidates: list[str],
    dev: tuple[str, str],
    tests: list[tuple[str, str, str]],
    workdir: str,
    moses_home: str | None = None,
    options: ComparisonOptions | None = None,
    rerank: list[str] | None = None,
    rerank_inverse: list[str] | None = None,
    rerank_sets: list[str] | None = None,
) -> list[SystemResult]:
    """The ``ab`` job: tune, decode and compare ``candidates`` against ``baseline``.

    ``candidates`` are ``NAME=INI`` or plain paths (named after the file), ``tests`` are
    ``(name, source, reference)``, ``rerank`` are ``NAME=MODEL`` or plain model paths (feature
    ``RNNEncDec0``, ``RNNEncDec1``, ...), ``rerank_inverse`` the same for target->source models
    (feature log p(source | hypothesis), ``RNNEncDecInv0``, ...), ``rerank_sets`` are
    ``SET=FEATURE,FEATURE...`` of those features' names (:func:`parse_rerank_sets`). Returns
    one :class:`SystemResult` per system, baseline first, then with ``rerank`` each system's
    re-ranked runs (``NAME+rerank``, or ``NAME+SET`` for each set).
    """
    options = options or ComparisonOptions()
    check_output_dir(workdir, "--workdir")  # before Moses is looked for; what it holds: below
    if rerank or rerank_inverse:
        options.rerank = rerank_models(rerank or [], rerank_inverse or [])
    if rerank_sets:
        options.rerank_sets = parse_rerank_sets(rerank_sets, options.rerank)
    if not candidates and not options.rerank:
        raise InputError(
            "nothing to compare: give --candidate INI, --rerank MODEL or --rerank-inverse MODEL"
        )
    if options.rerank_systems is not None and not options.rerank:
        raise InputError("--rerank-system needs --rerank MODEL")
    if options.rerank_tune == "new" and options.rerank_tuner != "mert":
        raise InputError("--rerank-tune new moves the models' weights with mert's -o: give mert")
    moses = MosesInstall.find(moses_home)
    if options.rerank_tuner not in RERANK_TUNERS:
        raise InputError(f"--rerank-tuner {options.rerank_tuner}: give mert or kbmira")
    if options.rerank:
        moses.check_has(options.rerank_tuner)
    systems = [System("baseline", check_input_file(Path(baseline), "baseline moses.ini"))]
    for spec in candidates:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec).name.removesuffix(".ini"), spec
        if name in {s.name for s in systems} or not NAME.fullmatch(name):
            raise InputError(f"candidate name {name!r}: give each a distinct NAME=INI")
        systems.append(System(name, check_input_file(Path(path), f"candidate {name} moses.ini")))
    dev_set = TestSet(
        "dev",
        check_input_file(Path(dev[0]), "dev source"),
        check_input_file(Path(dev[1]), "dev reference"),
    )
    test_sets = [
        TestSet(
            name,
            check_input_file(Path(src), f"test {name} source"),
            check_input_file(Path(ref), f"test {name} reference"),
        )
        for name, src, ref in tests
    ]
    for test in [dev_set] + test_sets:
        if _line_count(test.source) != len(read_reference(str(test.reference))):
            raise InputError(
                f"{test.name}: source and reference differ in line count", path=str(test.reference)
            )
    unknown = set(options.rerank_systems or ()) - {system.name for system in systems}
    if unknown:
        raise InputError(
            f"--rerank-system {', '.join(sorted(unknown))}: no such system (systems: "
            + ", ".join(system.name for system in systems)
            + ")"
        )
    reported = report_names(systems, options)
    if options.against is not None and options.against not in reported:
        raise InputError(
            f"--against {options.against}: no such system (systems: {', '.join(reported)})"
        )
    check_work_folder(
        workdir,
        {
            "moses.ini": [str(system.ini) for system in systems],
            "source": [str(test.source) for test in [dev_set, *test_sets]],
            "reference": [str(test.reference) for test in [dev_set, *test_sets]],
            "re-ranking model": [path for model in options.rerank for path in model.paths],
        },
    )
    comparison = Comparison(moses, Path(workdir), systems, dev_set, test_sets, options)
    return comparison.run()


def parse_rerank_sets(
    specs: list[str], features: tuple[FeatureModel, ...]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``SET=FEATURE[,FEATURE...]`` specs (``--rerank-set``) as (SET, feature names), each a
    name of ``features`` (the ``--rerank`` and ``--rerank-inverse`` models), in the order of
    ``features``; distinct sets under distinct names, every feature in one at least."""
    if not features:
        raise InputError("--rerank-set needs --rerank MODEL")
    known = [model.name for model in features]
    sets: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        name, sep, listed = spec.partition("=")
        if not sep or not NAME.fullmatch(name) or name in sets:
            raise InputError(f"--rerank-set {spec!r}: give each a distinct NAME=FEATURE,FEATURE")
        chosen = [feature for feature in listed.split(",") if feature]
        unknown = [feature for feature in chosen if feature not in known]
        if not chosen or unknown:
            raise InputError(
                f"--rerank-set {spec}: {', '.join(unknown) or 'no feature'}: give names of "
                f"--rerank / --rerank-inverse features ({', '.join(known)})"
            )
        members = tuple(feature for feature in known if feature in chosen)
        same = [other for other, features in sets.items() if features == members]
        if same:
            raise InputError(f"--rerank-set {name}: the same features as {same[0]}")
        sets[name] = members
    unused = [feature for feature in known if not any(feature in m for m in sets.values())]
    if unused:
        raise InputError(f"{', '.join(unused)}: in no --rerank-set (give it in one, or drop it)")
    return tuple(sets.items())


def report_names(systems: list[System], options: ComparisonOptions) -> list[str]:
    """The names of the systems the report will hold, in its order."""
    names = [system.name for system in systems]
    if not options.rerank:
        return names
    sets = [name for name, _ in options.rerank_sets] or ["rerank"]
    chosen = options.rerank_systems
    tuning = (options.rerank_tuner, options.rerank_tune)
    return names + [
        f"{system}+{reranked_system_suffix(set_name, *tuning)}"
        for system in names
        if chosen is None or system in chosen
        for set_name in sets
    ]


@dataclass
class ABReport:
    """The systems of an A/B comparison and the names of the test sets they were decoded on."""

    systems: list[SystemResult]
    tests: list[str]
    against: str | None = None

    def lines(self) -> list[str]:
        """The report ``ab`` prints (:func:`format_report`)."""
        return format_report(self.systems, self.tests, self.against)


def run_ab(
    baseline: str,
    candidates: list[str],
    dev: tuple[str, str],
    tests: list[tuple[str, str, str]],
    workdir: str,
    moses_home: str | None = None,
    options: ComparisonOptions | None = None,
    rerank: list[str] | None = None,
    rerank_inverse: list[str] | None = None,
    rerank_sets: list[str] | None = None,
) -> ABReport:
    """``phrasescore ab``: :func:`compare_systems`, with the test sets' names for the report."""
    systems = compare_systems(
        baseline,
        candidates,
        dev,
        tests,
        workdir,
        moses_home=moses_home,
        options=options,
        rerank=rerank,
        rerank_inverse=rerank_inverse,
        rerank_sets=rerank_sets,
    )
    against = options.against if options else None
    return ABReport(systems, [test[0] for test in tests], against)


def format_report(
    results: list[SystemResult], tests: list[str], against: str | None = None
) -> list[str]:
    """The comparison as a plain-text table, one line per system (what ``ab`` prints); the p
    columns say which system they compare with unless it is the baseline."""
    runs = len(results[0].runs)
    header = ["system"] + [f"{test} BLEU (mean ± sd, {runs} runs)" for test in tests]
    header += [f"{test} per run" for test in tests] + ["dev per run"]
    heldout = any(run.heldout_dev_bleu is not None for r in results for run in r.runs)
    header += ["dev held out per run"] if heldout else []
    versus = f" vs {against}" if against else ""
    header += [f"p ({test}{versus})" for test in tests] + ["new weights (per run)"]
    rows = [header]
    for result in results:
        row = [result.system.name]
        for test in tests:
            mean, sd = result.bleu_mean_sd(test)
            row.append(f"{mean:.2f} ± {sd:.2f}")
        for test in tests:
            row.append(" / ".join(f"{run.bleu[test]:.2f}" for run in result.runs))
        row.append(
            " / ".join(
                "-" if run.dev_bleu is None else f"{run.dev_bleu:.2f}" for run in result.runs
            )
        )
        if heldout:
            row.append(
                " / ".join(
                    "-" if run.heldout_dev_bleu is None else f"{run.heldout_dev_bleu:.2f}"
                    for run in result.runs
                )
            )
        for test in tests:
            p = result.p_values.get(test)
            row.append("-" if p is None else f"{p:.4f}")
        row.append(
            ", ".join(
                f"{name}={'/'.join(f'{v:.4g}' for v in values)}"
                for name, values in result.new_weights.items()
            )
            or "-"
        )
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
