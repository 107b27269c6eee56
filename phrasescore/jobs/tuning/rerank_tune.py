"""``phrasescore rerank-tune``: the weights of a scored dev n-best list tuned in one command.

Re-ranking by hand (docs/moses.md) takes Moses' ``extractor``, ``mert`` or ``kbmira`` and two
``rerank-weights`` calls; this job runs them in a working directory and writes the ``Name= w``
lines that ``phrasescore nbest --weights W --one-best`` applies to the test lists:

1. the list is checked first (:func:`check_tuning_list`: every line has the fields, the ids
   increase and lie within the reference, the last one is the reference's last line (ids
   missing before it: a warning), every line carries the same dense features with the
   same number of finite values), before any Moses tool runs;
2. ``extractor`` once, then ``runs`` tunings (mert with ``restarts`` random restarts, or
   kbmira) seeded ``seed``, ``seed + 1``, ...: the part ``ab --rerank`` runs too
   (:class:`~phrasescore.jobs.tuning.moses_tools.MosesTuning`), from the weights of ``start`` (a
   moses.ini or ``Name= w`` file; a feature it does not weigh, e.g. a model's, starts at 0);
3. each run's weights re-rank the dev list (:func:`best_hypotheses`, the order ``nbest
   --weights`` gives) and the run with the best dev BLEU (sacrebleu, ``--tokenize none``: the
   tuners' case-sensitive BLEU on tokenised text) is kept; every run's BLEU is reported
   (Clark et al. 2011: one tuning run is one draw of an optimiser's variance).

``tune="new"`` keeps ``start``'s weights (the decoder's, tuned by MERT on the whole dev set's
decodings) and moves only the features it does not weigh (the models'): a handful of weights
instead of every one, for a dev set too small to retune them all on fixed lists without
overfitting it (mert's ``-o``; kbmira moves every weight, so it takes ``tune="all"`` only).

The output is written atomically (nothing under its name after a failure). The tools' files go
to ``workdir`` (kept), or to a temporary directory beside the output that is removed after a
run that succeeds and kept, with the tools' logs, after one that fails.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files.guards import check_work_folder, refuse_outputs_onto_inputs
from phrasescore.files.inputs import check_files_exist
from phrasescore.files.kinds import display_name, is_pipe
from phrasescore.files.locks import output_lock
from phrasescore.files.outputs import AtomicOutput, check_output_path
from phrasescore.files.reading import GZIP_MAGIC, iter_lines
from phrasescore.jobs.bleu import bleu_metric
from phrasescore.jobs.moses_install import RERANK_TUNERS, MosesInstall
from phrasescore.jobs.tuning.moses_tools import MosesTuning, Programs
from phrasescore.moses.nbest import (
    NBestEntry,
    best_index,
    first_non_finite,
    gap_ids,
    iter_nbest_groups,
    missing_ids_message,
    read_nbest,
    read_weights,
    weighted_totals,
)
from phrasescore.moses.tuning import read_reference, write_weights_file

log = logging.getLogger(__name__)


@dataclass
class TuneOptions:
    """Flags of ``phrasescore rerank-tune``."""

    tuner: str = "mert"
    """``mert`` or ``kbmira`` (:data:`~phrasescore.jobs.moses_install.RERANK_TUNERS`)."""
    runs: int = 1
    seed: int = 1234
    """The first run's seed (mert ``-r``, kbmira ``-r``); run k has ``seed + k``."""
    restarts: int = 20
    """mert's random restarts per run (``ab --rerank-restarts``'s default)."""
    tune: str = "all"
    """Which weights move: ``all``, or ``new`` (only the features ``--start`` does not weigh)."""
    workdir: str | None = None


@dataclass
class TuningRun:
    seed: int
    bleu: float
    weights: dict[str, list[float]]
    places: str = ""
    """Where its best hypotheses lie in the dev lists (:meth:`Choices.places_line`)."""


@dataclass
class TuneResult:
    """What ``rerank-tune`` did: the dev BLEU before, each run's, the run kept."""

    output: str
    tuner: str
    sentences: int
    hypotheses: int
    bleu_before: float
    runs: list[TuningRun] = field(default_factory=list)
    kept: int = 0
    unweighed: list[str] = field(default_factory=list)
    """The list's features ``--start`` gives no weight (the models' features, started at 0)."""
    moved: list[str] | None = None
    """The features whose weights were tuned (``tune="new"``); None: every feature."""

    def lines(self) -> list[str]:
        lines = [
            f"phrasescore: {self.hypotheses} hypotheses of {self.sentences} sentences, dev BLEU "
            f"{self.bleu_before:.2f} before (the list's own best), tuned by {self.tuner}"
            + (f" (only {', '.join(self.moved)}; --start's weights kept):" if self.moved else ":")
        ]
        for index, run in enumerate(self.runs):
            kept = ""
            if index == self.kept:
                kept = "  <- kept" + (
                    f" (the best dev BLEU of {len(self.runs)} runs)" if len(self.runs) > 1 else ""
                )
            lines.append(f"  seed {run.seed}: dev BLEU {run.bleu:.2f}{kept}")
        lines.append(f"phrasescore: weights -> {self.output}")
        if self.runs and self.runs[self.kept].places:
            lines.append(f"phrasescore: with them, {self.runs[self.kept].places}")
        kept = self.runs[self.kept].weights if self.runs else {}
        new = [name for name in self.unweighed if name in kept]
        if new and all(value == 0 for name in new for value in kept[name]):
            why = (
                "re-ranking keeps the list's own best"
                if self.moved
                else "the dev BLEU gain is --start's own features retuned on this list, not theirs"
            )
            lines.append(
                f"phrasescore: the weights of {', '.join(new)} (not in --start) are all 0: {why}"
            )
        return lines


def check_tuning_list(nbest: str, sentences: int, reference: str) -> int:
    """Refuse a list the extractor would misread, at its line: a missing field (:func:`read_nbest`),
    ids that go back (Moses writes them in order; the tools pair id i with reference line i+1),
    an id beyond the ``sentences`` lines of ``reference``, a list that ends before them (the
    reference is longer), a first line without dense features (nothing to
    tune), and a line whose dense features (names without ``_``) or their numbers of
    values differ from the first line's, or whose values are not finite. Ids missing in the
    middle are a warning (:func:`~phrasescore.moses.nbest.missing_ids_message`). Returns the
    number of hypotheses."""
    first: list[tuple[str, int]] | None = None
    last_id = -1
    count = 0
    missing: list[int] = []
    for entry in read_nbest(nbest):
        count += 1
        missing.extend(gap_ids(last_id, entry.id))
        if entry.id < last_id:
            raise InputError(
                f"sentence id {entry.id} after id {last_id}: the ids of a Moses n-best list "
                "increase (the tools pair id i with reference line i + 1)",
                entry.path,
                entry.lineno,
            )
        last_id = entry.id
        if entry.id >= sentences:
            raise InputError(
                f"sentence id {entry.id} is beyond the reference {display_name(reference)} "
                f"({sentences} lines): the list and the reference do not match",
                entry.path,
                entry.lineno,
            )
        dense = _dense_features(entry)
        if first is None:
            if not dense:
                raise InputError(
                    "the hypothesis has no dense features (an empty feature field): there are "
                    "no weights to tune (give the list Moses wrote, scored by nbest)",
                    entry.path,
                    entry.lineno,
                )
            first = dense
        elif dense != first:
            raise InputError(
                f"the dense features are {_describe(dense)}, the list's first line has "
                f"{_describe(first)}: every hypothesis needs the same features (score the whole "
                "list with the same nbest call)",
                entry.path,
                entry.lineno,
            )
    if count == 0:
        raise InputError("the n-best list is empty", display_name(nbest))
    if last_id + 1 < sentences:  # as an id beyond the reference: the files do not match
        raise InputError(
            f"the n-best list ends with sentence id {last_id} ({last_id + 1} sentences) but the "
            f"reference {display_name(reference)} has {sentences} lines: the list and the "
            "reference do not match",
            display_name(nbest),
        )
    if missing:
        log.warning(
            "%s dev BLEU counts an empty hypothesis for each",
            missing_ids_message(nbest, missing, sentences),
        )
    return count


def _dense_features(entry: NBestEntry) -> list[tuple[str, int]]:
    features = entry.parsed_features()
    bad = first_non_finite(features)
    if bad is not None:
        raise InputError(
            f"feature {bad[0]} has a value that is not finite: it cannot be tuned",
            entry.path,
            entry.lineno,
        )
    return [(name, len(values)) for name, values in features if "_" not in name]


def _describe(features: list[tuple[str, int]]) -> str:
    values = sum(n for _, n in features)
    return f"{values} values ({' '.join(f'{name}={n}' for name, n in features)})"


@dataclass
class Choices:
    """The best hypothesis of each sentence id of a list, and where it stood in its list."""

    hypotheses: list[str]
    """Per id, its best hypothesis (an empty line for an id without any)."""
    places: list[int]
    """Per id with hypotheses, the best one's place in the list as the decoder wrote it (0:
    the decoder's own best)."""
    size: int = 0
    """The longest list's length: the n-best size the decoder was asked for, where any list
    reached it."""

    def places_line(self) -> str:
        """How far down the lists the best hypotheses lie: first, in the first half below it,
        in the second half, and in the last tenth of a list of :attr:`size`. Many from the end
        of the lists say that longer lists may hold better hypotheses still."""
        first = sum(place == 0 for place in self.places)
        line = f"the best hypothesis of {len(self.places):,} sentences is the list's first for {first:,}"
        if self.size < 10:
            return line
        half, tenth = -(-self.size // 2), self.size - self.size // 10
        upper = sum(0 < place < half for place in self.places)
        lower = sum(place >= half for place in self.places)
        last = sum(place >= tenth for place in self.places)
        return (
            f"{line}, at places 2-{half} for {upper:,}, {half + 1}-{self.size} for {lower:,} "
            f"({tenth + 1}-{self.size}: {last:,})"
        )


def best_hypotheses(
    nbest: str, sentences: int, weights: dict | None = None, weights_path: str = ""
) -> Choices:
    """The best hypothesis of each sentence id and its place in the list: under ``weights``
    (:func:`~phrasescore.moses.nbest.weighted_totals`, ties to the first listed, as ``nbest
    --weights --one-best`` picks it), or without them by the list's own totals."""
    choices = Choices([""] * sentences, [])
    for group in iter_nbest_groups(read_nbest(nbest)):
        if weights is None:
            totals = [float(entry.total) for entry in group]
        else:
            totals = weighted_totals(group, weights, weights_path)
        place = best_index(totals)
        choices.hypotheses[group[0].id] = group[place].hypothesis
        choices.places.append(place)
        choices.size = max(choices.size, len(group))
    return choices


def dev_bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU of tokenised text (sacrebleu ``--tokenize none``, case-sensitive)."""
    return bleu_metric("none").corpus_score(hypotheses, [references]).score


def _plain(path: str, work: Path, name: str) -> Path:
    """``path`` as the Moses tools can read it: itself, or a plain copy in ``work`` when it is
    gzip (the tools tell gzip by the name alone) or a pipe."""
    with open(path, "rb") as handle:
        gzipped = handle.read(2) == GZIP_MAGIC
    if not gzipped and os.path.isfile(path):
        return Path(path).resolve()
    copy = work / name
    with AtomicOutput(str(copy)) as out:
        for line in iter_lines(path, keep_ends=True):
            out.write(line)
    return copy


def rerank_tune(
    nbest: str,
    reference: str,
    output: str,
    start: str | None = None,
    moses_home: str | None = None,
    options: TuneOptions | None = None,
) -> TuneResult:
    """``phrasescore rerank-tune``: see the module docstring."""
    options = options or TuneOptions()
    if options.tuner not in RERANK_TUNERS:
        raise InputError(f"--tuner {options.tuner}: give mert or kbmira")
    if options.runs < 1 or options.restarts < 1:
        raise InputError("--runs and --restarts must be at least 1")
    if options.tune not in ("all", "new"):
        raise InputError(f"--tune {options.tune}: give all or new")
    if options.tune == "new" and (options.tuner != "mert" or not start):
        raise InputError(
            "--tune new keeps --start's weights and moves the others with mert's -o: give "
            "--start and --tuner mert (kbmira moves every weight)"
        )
    check_files_exist([nbest, reference, start])
    for role, path in (("the n-best list", nbest), ("--reference", reference)):
        if is_pipe(path):  # a pipe is empty by the time the tools read it
            raise InputError(
                f"{role} is a pipe or standard input: rerank-tune reads it more than once, and "
                "Moses' extractor reads it again; give a file (a .gz is fine)",
                display_name(path),
            )
    if start == "-":
        raise InputError("rerank-tune reads its inputs as files (the tools read them too)")
    check_output_path(output)
    inputs = {"n-best list": nbest, "--reference": reference, "--start": start}
    refuse_outputs_onto_inputs(inputs, {"-o": output})
    check_work_folder(options.workdir, inputs)
    references = read_reference(reference)
    start_weights = read_weights(start) if start else {}
    hypotheses = check_tuning_list(nbest, len(references), reference)
    moses = MosesInstall.find(moses_home, needs=["extractor", options.tuner])
    with output_lock(output):
        work, temporary = _workdir(options.workdir, output)
        programs = Programs()
        try:
            result = _tune(nbest, reference, references, start_weights, work, moses, programs,
                           options, output)  # fmt: skip
            result.hypotheses = hypotheses
        except BaseException:  # a failed tool, Ctrl-C, SIGTERM: stop the tools that run
            programs.stop()
            if temporary:
                log.warning("the tools' files and logs are kept in %s", work)
            raise
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
    return result


def _workdir(workdir: str | None, output: str) -> tuple[Path, bool]:
    """The tools' working directory, and whether it is a temporary one."""
    if workdir:
        path = Path(workdir)
        path.mkdir(parents=True, exist_ok=True)
        return path.resolve(), False
    parent = os.path.dirname(os.path.abspath(output))
    name = f".{os.path.basename(output)}.tune."
    return Path(tempfile.mkdtemp(prefix=name, dir=parent)), True


def _tune(
    nbest, reference, references, start_weights, work, moses, programs, options, output
) -> TuneResult:
    tuning = MosesTuning(moses.program, programs.run, options.tuner, options.restarts)
    before = dev_bleu(best_hypotheses(nbest, len(references)).hypotheses, references)
    log.info("dev BLEU before tuning (the list's own best): %.2f", before)
    scored = _plain(nbest, work, "dev.nbest")
    ref = _plain(reference, work, "dev.ref")
    names = tuning.extract(scored, ref, work)
    result = TuneResult(output, options.tuner, len(references), 0, before)
    keep_start = options.tune == "new"
    if keep_start:
        active = MosesTuning.new_values(names, start_weights)
        if not active:
            raise InputError(
                "--tune new: --start weighs every feature of the list: there is nothing to "
                "tune (score the list with the models first, or give --tune all)",
                display_name(nbest),
            )
        result.moved = list(dict.fromkeys(name.rsplit("_", 1)[0] for name in active))
    for k in range(options.runs):
        seed = options.seed + k
        run_dir = work / f"{options.tuner}-{seed}"
        run_dir.mkdir(exist_ok=True)
        weights = tuning.tune(run_dir, names, start_weights, seed, work, keep_start)
        choices = best_hypotheses(nbest, len(references), weights, str(run_dir))
        bleu = dev_bleu(choices.hypotheses, references)
        log.info("run %d of %d (seed %d): dev BLEU %.2f", k + 1, options.runs, seed, bleu)
        result.runs.append(TuningRun(seed, bleu, weights, choices.places_line()))
    result.kept = max(range(options.runs), key=lambda k: (result.runs[k].bleu, -k))
    if start_weights:  # what --start does not weigh started at 0
        result.unweighed = [name for name in result.runs[0].weights if name not in start_weights]
    kept = result.runs[result.kept]
    if options.runs > 1:
        log.info(
            "kept the run of seed %d: the best dev BLEU of %d runs (%.2f; the others %s)",
            kept.seed,
            options.runs,
            kept.bleu,
            ", ".join(f"{run.bleu:.2f}" for run in result.runs if run is not kept),
        )
    write_weights_file(Path(output), kept.weights)
    return result
