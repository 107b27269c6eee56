"""The recipe's inputs, every one checked before the first step (a mistake costs seconds, not the
hours of training before the step that would have met it), and the machine it runs on."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files import IO_BUFFER, check_work_folder, open_binary_input
from phrasescore.jobs.moses_install import MosesInstall, named_moses_home
from phrasescore.moses.ini_tables import feature_paths, read_ini_tables
from phrasescore.moses.phrase_table import check_phrase_table

LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}([_-][A-Za-z0-9]+)*")
"""A language suffix as train-model.perl's --f and --e (en, fr, pt_BR)."""

ROOT = Path(__file__).resolve().parents[3]
TRAIN_RECIPE = ROOT / "bin" / "phrasescore-train-recipe"
"""The five models' trainer (the recipe's models, their settings and budgets are its own)."""


@dataclass
class Pair:
    """A parallel set: STEM.F and STEM.E (or .gz), line-parallel, with its number of lines."""

    stem: str
    source: str
    target: str
    lines: int


@dataclass
class Inputs:
    """The recipe's input files, resolved and checked."""

    ini: str
    table: str
    corpus: Pair
    valid: Pair
    dev: Pair
    test: Pair
    moses_home: Path | None
    """None: no Moses here, its steps are skipped."""


def check_language(option: str, code: str) -> None:
    if not LANGUAGE_CODE.fullmatch(code):
        raise InputError(f"{option} {code} is not a language code (e.g. en, fr, pt_BR)")


def text_file(stem: str, lang: str, option: str) -> str:
    """STEM.LANG, else STEM.LANG.gz (as train-model.perl's --corpus STEM --f LANG)."""
    for candidate in (f"{stem}.{lang}", f"{stem}.{lang}.gz"):
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    raise InputError(f"{option} {stem}: neither {stem}.{lang} nor {stem}.{lang}.gz exists")


def count_lines(path: str) -> int:
    with open_binary_input(path) as data:
        lines, last = 0, b"\n"
        while block := data.read(IO_BUFFER):
            lines += block.count(b"\n")
            last = block[-1:]
        return lines + (last != b"\n")


def check_pair(option: str, stem: str, f: str, e: str) -> Pair:
    """STEM's two files: both there, not empty, as many lines each."""
    source, target = text_file(stem, f, option), text_file(stem, e, option)
    n_source, n_target = count_lines(source), count_lines(target)
    if n_source == 0:
        raise InputError("empty file", source)
    if n_source != n_target:
        raise InputError(
            f"{option}: {source} has {n_source} lines but {target} has {n_target}: the files "
            "must be line-parallel"
        )
    return Pair(os.path.abspath(stem), source, target, n_source)


def find_moses(home: str | None) -> Path | None:
    """The Moses build of --moses-home, else $MOSES_HOME, else $MOSES; None when none is named.
    A build that is named must hold every program the Moses steps run."""
    return MosesInstall.find(home).home if named_moses_home(home) else None


def choose_table(ini: str, table: str | None) -> str:
    """--table, else the one phrase table the ini declares."""
    tables = read_ini_tables(ini)
    if table is not None:
        return os.path.abspath(table)
    with_paths = [t for t in tables if t.path]
    if len(with_paths) != 1:
        names = ", ".join(f"{t.table.name} ({t.path})" for t in with_paths) or "none"
        raise InputError(f"give --table: the ini declares {len(with_paths)} phrase tables: {names}")
    return with_paths[0].path  # type: ignore[return-value]


def check_feature_files(ini: str) -> None:
    """Every file a feature of the ini reads (tables, language models, reordering models) is
    there, as Moses will look for it (a compact table's path names NAME.minphr), under an
    absolute path: mert-moses.pl runs the decoder in its own work folder, where a relative path
    would name nothing (train-model.perl writes absolute paths)."""
    for name, path in feature_paths(ini):
        expanded = os.path.expanduser(os.path.expandvars(path))
        if not os.path.isabs(expanded):
            raise InputError(
                f"feature {name}: path={path} is relative, and mert-moses.pl runs the decoder "
                "in its work folder: write it as an absolute path",
                ini,
            )
        if not any(os.path.exists(expanded + s) for s in ("", ".minphr", ".minlexr", ".gz")):
            raise InputError(f"feature {name} reads {expanded}, which does not exist", ini)


def check_inputs(options) -> Inputs:
    """Every input of ``options`` (a :class:`~phrasescore.jobs.recipe.recipe.RecipeOptions`)
    checked, in one :class:`InputError` line for the first problem."""
    check_language("--f", options.f)
    check_language("--e", options.e)
    if options.f == options.e:
        raise InputError(f"--f and --e are the same language ({options.f})")
    if not TRAIN_RECIPE.is_file():
        raise InputError(
            f"the models are trained by {TRAIN_RECIPE}, which is missing: run phrasescore from "
            "its source tree (pip install -e)"
        )
    ini = os.path.abspath(options.moses_ini)
    table = choose_table(ini, options.table)
    f, e = options.f, options.e
    corpus = check_pair("--corpus", options.corpus, f, e)
    dev = check_pair("--dev", options.dev, f, e)
    test = check_pair("--test", options.test, f, e)
    valid = check_pair("--valid", options.valid, f, e) if options.valid else dev
    if not os.path.isfile(table):
        raise InputError("no such phrase table", table)
    check_phrase_table(table)
    moses_home = find_moses(options.moses_home)
    if moses_home is not None:
        check_feature_files(ini)
        from phrasescore.jobs.bleu import require_sacrebleu

        require_sacrebleu()
    roles = {"moses.ini": ini, "phrase table": table}
    for what, pair in (("corpus", corpus), ("valid", valid), ("dev", dev), ("test", test)):
        roles[f"{what} source"] = pair.source
        roles[f"{what} target"] = pair.target
    check_work_folder(options.work, roles, "-o")
    return Inputs(ini, table, corpus, valid, dev, test, moses_home)


@dataclass
class Machine:
    """Where the steps run: the device, how many steps at once, threads per step."""

    device: str
    jobs: int
    threads: int
    gpus: int


STEPS_PER_GPU = 5
"""Steps at once per GPU by default: the recipe's five trainings share one GPU, as
bin/phrasescore-train-recipe runs them (one training of these sizes leaves most of a GPU idle,
its step bound by the host's launches), and so do the n-best lists' eight scoring steps, whose
start-ups (CUDA, the model) overlap instead of queueing."""


def machine(device: str | None, jobs: int | None) -> Machine:
    """--device and --jobs as bin/phrasescore-train-recipe takes them: cuda when a GPU is there,
    :data:`STEPS_PER_GPU` steps per GPU there, else one per core; each step gets its share of
    the cores as threads."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    gpus = 0
    if device != "cpu":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device is None:
        device = "cuda" if gpus else "cpu"
    if device == "cuda" and not gpus:
        raise InputError("--device cuda: PyTorch sees no GPU")
    jobs = jobs or (STEPS_PER_GPU * gpus if device == "cuda" else cpus)
    return Machine(device, jobs, max(1, cpus // jobs), gpus)
