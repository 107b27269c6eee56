"""recipe: the README's recipe over a Moses system as one resumable command.

From a Moses system (its moses.ini and phrase table, the training corpus, dev and test sets) to
the re-ranked test BLEU, in the steps a user would otherwise run by hand:

1. ``train-NAME``: the five models of ``bin/phrasescore-train-recipe`` (the column's model on
   the table's distinct phrase pairs, Cho et al. 2014 §3.1; attention left to right, right to
   left and E->F, a deep LSTM), one step each, that script's settings and budgets;
2. ``rescore``: the column p(target | source) added to the table, the moses.ini for it;
3. ``sets``: the dev and test sets as plain files (what mert-moses.pl and the decoder read);
4. ``mert``: the rescored system tuned with mert-moses.pl on dev;
5. ``decode-dev``, ``decode-test``: the tuned system's n-best lists and 1-best;
6. ``nbest-dev-MODEL``, ``nbest-test-MODEL``: each sentence model's feature added to each list
   by a ``nbest`` call of its own; ``nbest-dev``, ``nbest-test``: the four features joined;
7. ``rerank-tune``: the re-ranking weights tuned on the dev list;
8. ``rerank-test``: the test list re-ranked with them (its 1-best);
9. ``bleu``: the test BLEU of the tuned system's 1-best and of the re-ranked 1-best.

Steps 3-9 need Moses (--moses-home or MOSES_HOME): without it they are reported as skipped. Each
step runs only when out of date (:mod:`phrasescore.jobs.recipe.steps`): a killed or changed run
redoes what it must and nothing else.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from phrasescore.files import AtomicOutput, iter_lines, output_lock
from phrasescore.jobs.recipe.inputs import ROOT, TRAIN_RECIPE, Inputs, Machine, check_inputs
from phrasescore.jobs.recipe.inputs import machine as find_machine
from phrasescore.jobs.recipe.steps import Planned, Step, StepGraph
from phrasescore.moses.nbest import join_added_features

log = logging.getLogger(__name__)

MODELS = ("l2r", "r2l", "inverse", "lstm", "column")
"""train-recipe's five models, in its order (the slowest, most useful first)."""

FEATURES = (("L2R", "l2r"), ("R2L", "r2l"), ("LSTM", "lstm"))
INVERSE_FEATURE = ("Inv", "inverse")
NO_MOSES = "needs Moses: set MOSES_HOME (or --moses-home) to a Moses build"


@dataclass
class RecipeOptions:
    """What ``phrasescore recipe`` was given."""

    moses_ini: str
    corpus: str
    dev: str
    test: str
    f: str
    e: str
    work: str
    table: str | None = None
    valid: str | None = None
    moses_home: str | None = None
    jobs: int | None = None
    device: str | None = None
    minutes: float | None = None
    patience: int | None = None
    train_flags: tuple[str, ...] = ()
    nbest_size: int = 100
    mert_iterations: int | None = None
    runs: int = 3
    tune: str = "all"
    """rerank-tune's ``--tune``: ``all`` weights, or ``new`` (the models' only)."""
    seed: int = 1


@dataclass
class RecipeResult:
    """The plan (``dry_run``) or what the run did with each step, and the results."""

    work: Path
    plan: list[Planned]
    dry_run: bool
    results: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        lines = ["plan:" if self.dry_run else f"recipe in {self.work}:"]
        width = max(len(p.step.name) for p in self.plan)
        for planned in self.plan:
            if self.dry_run or planned.state != "run":
                what = f"{planned.state}" + (f" ({planned.reason})" if planned.reason else "")
            else:
                what = f"ran in {planned.seconds or 0:.0f} s ({planned.reason})"
            lines.append(f"  {planned.step.name:<{width}}  {what}")
            if self.dry_run and planned.state == "run":
                command = planned.step.command_line(planned.command)
                lines.append(f"  {'':<{width}}  $ {command}")
        return lines + self.results


class Layout:
    """Where everything goes in the work folder."""

    def __init__(self, work: str, e: str):
        self.work = Path(os.path.abspath(work))
        self.e = e
        self.nn = self.work / "nn"
        self.logs = self.work / "logs"
        self.table = self.work / "model" / "phrase-table.rescored.gz"
        self.ini = self.work / "model" / "moses.rescored.ini"
        self.mert = self.work / "mert"
        self.tuned = self.mert / "moses.ini"
        self.weights = self.work / "rerank.weights"
        self.reranked = self.work / f"test.reranked.{e}"
        self.results = self.work / "results.txt"

    def model(self, name: str) -> str:
        return str(self.nn / f"{name}.safetensors")

    def data(self, name: str, lang: str) -> str:
        return str(self.work / "data" / f"{name}.{lang}")

    def lists(self, name: str) -> str:
        return str(self.work / "lists" / name)


def phrasescore_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "phrasescore", *args]


def placement(box: Machine) -> list[str]:
    """Where a phrasescore step runs (the device is in its settings: it may change the scores)."""
    return ["--no-progress", "--device", box.device, "--threads", str(box.threads)]


def train_steps(options: RecipeOptions, inputs: Inputs, at: Layout, box: Machine) -> list[Step]:
    """One step per model, each a run of bin/phrasescore-train-recipe for that model alone."""
    budget = []
    if options.minutes is not None:
        budget += ["--minutes", f"{options.minutes:g}"]
    if options.patience is not None:
        budget += ["--patience", str(options.patience)]
    steps = []
    for name in MODELS:
        inputs_of = [inputs.corpus.source, inputs.corpus.target]
        inputs_of += [inputs.valid.source, inputs.valid.target]
        table = ["--table", inputs.table] if name == "column" else []
        model = [
            *["--corpus", inputs.corpus.stem, "--valid", inputs.valid.stem, *table],
            *["--f", options.f, "--e", options.e, "--models", name, "-o", str(at.nn)],
        ]
        stable = [*model, "--force", *budget]
        # the step's share of the cores (train-recipe alone would give each training all of
        # them: several trainings share a GPU); a --threads in the user's flags comes later, wins
        placed = ["--jobs", "1", "--device", box.device, "--", "--threads", str(box.threads)]
        placed += options.train_flags
        steps.append(
            Step(
                name=f"train-{name}",
                kind="train",
                inputs=inputs_of + ([inputs.table] if name == "column" else []),
                outputs=[at.model(name), str(at.nn / f"{name}.result")],
                settings={"train-recipe": stable, "train": list(options.train_flags)},
                command=["bash", str(TRAIN_RECIPE), *stable, *placed],
                gpu=box.device == "cuda",
                progress=[at.model(name) + ".checkpoint"],
                # a stopped training goes on from its checkpoint (train --resume), not from step 0
                resume_command=["bash", str(TRAIN_RECIPE), *model, "--resume", *budget, *placed],
            )
        )
    return steps


def rescore_step(inputs: Inputs, at: Layout, box: Machine) -> Step:
    stable = [inputs.table, "-m", at.model("column"), "-o", str(at.table)]
    stable += ["--moses-ini", inputs.ini, "--ini-out", str(at.ini)]
    return Step(
        name="rescore",
        kind="rescore",
        inputs=[inputs.table, inputs.ini, at.model("column")],
        outputs=[str(at.table), str(at.ini)],
        settings={"rescore": stable, "device": box.device},
        command=phrasescore_command("rescore", *stable, *placement(box)),
        gpu=box.device == "cuda",
    )


def sets_step(options: RecipeOptions, inputs: Inputs, at: Layout, skip: str | None) -> Step:
    """The dev and test sets as plain files (mert-moses.pl reads no gzip)."""
    copies = {}
    for name, pair in (("dev", inputs.dev), ("test", inputs.test)):
        copies[at.data(name, options.f)] = pair.source
        copies[at.data(name, options.e)] = pair.target

    def write() -> None:
        for output, source in copies.items():
            with AtomicOutput(output) as out:
                for line in iter_lines(source, keep_ends=True):
                    out.write(line)

    return Step(
        name="sets",
        kind="sets",
        inputs=list(copies.values()),
        outputs=list(copies),
        settings={"copies": copies},
        action=write,
        skip=skip,
    )


def moses_steps(options: RecipeOptions, inputs: Inputs, at: Layout, box: Machine) -> list[Step]:
    """MERT of the rescored system, then its n-best lists and 1-best of dev and test."""
    home = inputs.moses_home or Path("/MOSES_HOME")
    skip = None if inputs.moses_home else NO_MOSES
    cwd = os.path.dirname(inputs.ini)  # the ini's relative paths are read from its folder
    f, e = options.f, options.e
    mert = [
        *[str(home / "scripts/training/mert-moses.pl"), at.data("dev", f), at.data("dev", e)],
        *[str(home / "bin/moses"), str(at.ini), f"--mertdir={home / 'bin'}"],
        *[f"--working-dir={at.mert}", f"--mertmertargs=--rseed {options.seed}"],
    ]
    if options.mert_iterations is not None:
        mert.append(f"--maximum-iterations={options.mert_iterations}")
    steps = [
        Step(
            name="mert",
            kind="mert",
            inputs=[str(at.ini), str(at.table), at.data("dev", f), at.data("dev", e)],
            outputs=[str(at.tuned)],
            settings={"mert-moses.pl": mert},
            command=mert + [f"--decoder-flags=-threads {box.threads}"],
            fresh_dirs=[str(at.mert)],
            cwd=cwd,
            skip=skip,
        )
    ]
    for name in ("dev", "test"):
        nbest = at.lists(f"{name}.{options.nbest_size}best.nbest")
        decode = [str(home / "bin/moses"), "-f", str(at.tuned)]
        listing = ["-n-best-list", nbest + ".partial", str(options.nbest_size), "distinct"]
        steps.append(
            Step(
                name=f"decode-{name}",
                kind="decode",
                inputs=[str(at.tuned), str(at.table), at.data(name, f)],
                outputs=[nbest, at.lists(f"{name}.1best.{e}")],
                settings={"moses": decode + listing},
                command=decode + listing + ["-threads", str(box.threads)],
                stdin=at.data(name, f),
                stdout=at.lists(f"{name}.1best.{e}"),
                staged={nbest + ".partial": nbest},
                cwd=cwd,
                skip=skip,
            )
        )
    return steps


def scoring_steps(options: RecipeOptions, at: Layout, box: Machine) -> list[Step]:
    """Each set's n-best list scored by each sentence model in a ``nbest`` call of its own
    (``nbest-SET-MODEL``: the list with that model's feature), then the four features joined
    into one list (``nbest-SET``, :func:`~phrasescore.moses.nbest.join_added_features`): the
    bytes of one call with every model, while a retrained model scores its lists again alone
    and the models score side by side, up to ``--jobs`` at once."""
    f = options.f
    features = [(label, model, "-m") for label, model in FEATURES]
    features.append((*INVERSE_FEATURE, "--inverse-model"))
    steps = []
    for name in ("dev", "test"):
        nbest = at.lists(f"{name}.{options.nbest_size}best.nbest")
        scored = at.lists(f"{name}.scored.nbest")
        per_model = []
        for label, model, flag in features:
            one = at.lists(f"{name}.{model}.nbest")
            stable = [nbest, "--source", at.data(name, f), flag, f"{label}={at.model(model)}"]
            stable += ["-o", one]
            steps.append(
                Step(
                    name=f"nbest-{name}-{model}",
                    kind="nbest",
                    inputs=[nbest, at.data(name, f), at.model(model)],
                    outputs=[one],
                    settings={"nbest": stable, "device": box.device},
                    command=phrasescore_command("nbest", *stable, *placement(box)),
                    gpu=box.device == "cuda",
                )
            )
            per_model.append(one)

        def join(nbest: str = nbest, per_model: list[str] = per_model, scored: str = scored):
            with AtomicOutput(scored) as out:
                out.writelines(join_added_features(nbest, per_model))

        steps.append(
            Step(
                name=f"nbest-{name}",
                kind="join features",
                inputs=[nbest, *per_model],
                outputs=[scored],
                settings={"features": [label for label, _, _ in features]},
                action=join,
            )
        )
    return steps


def rerank_steps(options: RecipeOptions, inputs: Inputs, at: Layout) -> list[Step]:
    """The re-ranking weights tuned on the scored dev list, the scored test list re-ranked."""
    skip = None if inputs.moses_home else NO_MOSES
    f, e = options.f, options.e
    home = str(inputs.moses_home)
    tune = [
        at.lists("dev.scored.nbest"),
        "--reference",
        at.data("dev", e),
        "--start",
        str(at.tuned),
    ]
    tune += ["--runs", str(options.runs), "--seed", str(options.seed), "-o", str(at.weights)]
    tune += ["--workdir", str(at.work / "rerank-tune")]
    if options.tune != "all":  # the default unnamed: a work folder of an earlier run stays done
        tune += ["--tune", options.tune]
    rerank = [at.lists("test.scored.nbest"), "--source", at.data("test", f), "--weights"]
    rerank += [str(at.weights), "--one-best", "-o", str(at.reranked)]
    return [
        Step(
            name="rerank-tune",
            kind="rerank-tune",
            inputs=[at.lists("dev.scored.nbest"), at.data("dev", e), str(at.tuned)],
            outputs=[str(at.weights)],
            settings={"rerank-tune": tune},
            command=phrasescore_command("rerank-tune", *tune, "--moses-home", home),
            fresh_dirs=[str(at.work / "rerank-tune")],
            skip=skip,
        ),
        Step(
            name="rerank-test",
            kind="rerank",
            inputs=[at.lists("test.scored.nbest"), at.data("test", f), str(at.weights)],
            outputs=[str(at.reranked)],
            settings={"nbest": rerank},
            command=phrasescore_command("nbest", *rerank, "--no-progress"),
        ),
    ]


def bleu_step(options: RecipeOptions, at: Layout) -> Step:
    """The test BLEU before re-ranking (the tuned system's 1-best) and after."""
    reference = at.data("test", options.e)
    before = at.lists(f"test.1best.{options.e}")

    def write() -> None:
        from phrasescore.jobs.bleu import evaluate

        def lines_of(path: str) -> list[str]:
            return [line.rstrip("\n") for line in iter_lines(path, keep_ends=True)]

        references = lines_of(reference)
        first = evaluate(lines_of(before), references, tokenize="none")
        then = evaluate(lines_of(str(at.reranked)), references, tokenize="none")
        with AtomicOutput(str(at.results)) as out:
            out.write(f"test BLEU ({first.sentences} sentences, tokenised text as it is):\n")
            out.write(f"  the tuned system's 1-best  {first.bleu:.2f}  ({before})\n")
            out.write(
                f"  re-ranked                  {then.bleu:.2f}  ({at.reranked}), "
                f"{then.bleu - first.bleu:+.2f}\n"
            )
            out.write(first.bleu_signature + "\n")

    return Step(
        name="bleu",
        kind="bleu",
        inputs=[reference, before, str(at.reranked)],
        outputs=[str(at.results)],
        settings={"bleu": "sacrebleu, tokenize none"},
        action=write,
    )


def recipe_steps(options: RecipeOptions, inputs: Inputs, at: Layout, box: Machine) -> list[Step]:
    """The recipe's steps, each after the steps it reads from."""
    skip = None if inputs.moses_home else NO_MOSES
    return [
        *train_steps(options, inputs, at, box),
        rescore_step(inputs, at, box),
        sets_step(options, inputs, at, skip),
        *moses_steps(options, inputs, at, box),
        *scoring_steps(options, at, box),
        *rerank_steps(options, inputs, at),
        bleu_step(options, at),
    ]


def run_recipe(options: RecipeOptions, dry_run: bool = False) -> RecipeResult:
    """Check every input, plan the steps, and (unless ``dry_run``) run those out of date."""
    inputs = check_inputs(options)
    box = find_machine(options.device, options.jobs)
    at = Layout(options.work, options.e)
    steps = recipe_steps(options, inputs, at, box)
    env = {"PHRASESCORE": f"{sys.executable} -m phrasescore"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    for step in steps:
        step.env.update(env)
    graph = StepGraph(steps, at.logs, jobs=box.jobs, gpus=box.gpus)
    if dry_run:
        return RecipeResult(at.work, graph.plan(), dry_run=True)
    at.work.mkdir(parents=True, exist_ok=True)
    with output_lock(str(at.work / "recipe")):
        plan = graph.plan()
        at.logs.mkdir(parents=True, exist_ok=True)

        def progress(message: str) -> None:
            log.info("recipe: %s", message)
            with open(at.logs / "recipe.log", "a", encoding="utf-8") as out:
                out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")

        progress(f"{sum(p.state == 'run' for p in plan)} of {len(plan)} steps to run")
        graph.run(plan, progress)
    result = RecipeResult(at.work, plan, dry_run=False)
    if at.results.exists():
        result.results = at.results.read_text(encoding="utf-8").splitlines()
    return result
