"""ems-meta: Moses' experiment.meta with phrasescore's steps spliced in, for ``experiment.perl
-meta``.

``experiment.perl -meta FILE`` reads FILE instead of its own experiment.meta (one file, not
merged), so the new meta is Moses' own, read from the user's Moses build, with these changes:

[TRAINING]
  ``phrasescore-column-model`` (after the phrase table): the column's model on the table's
  phrase pairs; ``phrasescore-sentence-models``: the four re-ranking models on the corpus (both
  ``bin/phrasescore-train-recipe``, validated on the tuning set);
  ``phrasescore-config`` (after create-config): ``rescore`` of the table with the column and the
  moses.ini declaring it; ``binarize-config`` reads it instead of create-config's ini.
[TUNING], [EVALUATION]
  ``phrasescore-filter``: the tables filtered for the set from that ini (Moses' own filter
  builds a stand-in ini with the table's usual number of scores, which would drop the column's
  declaration); Moses' ``filter`` is ignored when phrasescore is on.
[TUNING]
  ``phrasescore-weights`` (after tuning): the tuned system's dev n-best lists, the sentence
  models' features, the re-ranking weights tuned on them (``nbest``, ``rerank-tune``).
[EVALUATION]
  ``phrasescore-rerank`` (after decode): the n-best list decode wrote beside its 1-best (the
  config sets ``nbest = "$phrasescore-nbest distinct"`` in [EVALUATION]: the set is decoded
  once) scored and re-ranked with those weights; ``remove-markup``, and so BLEU and the report,
  read its 1-best.

Every new step is ignored, or passed (its output is its input's), unless the config sets
``phrasescore`` (in [GENERAL]): a config without it runs Moses' own steps, with Moses' own
commands. An evaluation set with ``phrasescore-no-rerank = yes`` reports the tuned system's
1-best (the column without re-ranking) beside the re-ranked sets.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from phrasescore.errors import InputError
from phrasescore.files import AtomicOutput, check_files_exist, refuse_outputs_onto_inputs
from phrasescore.files.reading import iter_lines
from phrasescore.jobs.recipe.inputs import ROOT, TRAIN_RECIPE
from phrasescore.jobs.recipe.recipe import FEATURES, INVERSE_FEATURE
from phrasescore.moses.ems_meta import (
    Meta,
    MetaStep,
    add_to_list,
    new_step,
    parse_meta,
    replace_input,
)

SWITCH = "phrasescore"
"""The config setting that turns the steps on ([GENERAL] phrasescore = yes)."""

NO_RERANK = "phrasescore-no-rerank"
"""An evaluation set's setting: its output is the tuned system's 1-best, not re-ranked."""

MOSES_META = "scripts/ems/experiment.meta"

# What experiment.perl's template substitution would change in a path baked into a template.
_UNSAFE = ("$", "#", "\\", " IN", " OUT", "TMP", "VERSION", "\n")


@dataclass
class EmsMetaOptions:
    """What ``phrasescore ems-meta`` was given."""

    output: str
    moses_home: str | None = None
    meta: str | None = None


@dataclass
class Commands:
    """The command lines the templates run, with this installation's paths."""

    phrasescore: str
    train_recipe: str


def _baked(path: str, what: str) -> str:
    for text in _UNSAFE:
        if text in path:
            raise InputError(
                f"{what} {path} holds {text.strip() or repr(text)!r}, which experiment.perl "
                "would substitute in a step's command: install phrasescore under another path"
            )
    return shlex.quote(path)


def installed_commands() -> Commands:
    """``python -m phrasescore`` of this interpreter with this source tree first on its path, and
    the trainer script of this checkout (the steps run what generated the meta)."""
    if not TRAIN_RECIPE.is_file():
        raise InputError(
            f"{TRAIN_RECIPE}: no such file: the EMS steps run bin/phrasescore-train-recipe "
            "from a source checkout of phrasescore (pip install -e .)"
        )
    root = _baked(str(ROOT), "phrasescore's source tree")
    python = _baked(sys.executable, "the Python interpreter")
    env = f"PYTHONPATH={root}"
    command = f"{python} -m phrasescore"
    return Commands(
        phrasescore=f"{env} {command}",
        train_recipe=f"{env} PHRASESCORE={shlex.quote(command)} bash "
        + _baked(str(TRAIN_RECIPE), "the trainer script"),
    )


def _validation(out: str) -> tuple[str, str]:
    """Commands that make ``OUT.valid/dev.F|E`` links to the tuning set (IN2, IN3 of the step)
    and the stem train-recipe's --valid reads."""
    links = (
        f"mkdir -p {out}.valid ; ln -sf IN2 {out}.valid/dev.$input-extension ; "
        f"ln -sf IN3 {out}.valid/dev.$output-extension ; "
    )
    return links, f"{out}.valid/dev"


def training_steps(run: Commands) -> tuple[list[MetaStep], MetaStep]:
    """The models (TRAINING, after the phrase table), and the rescored system's ini (after
    create-config)."""
    languages = "--f $input-extension --e $output-extension"
    settings = "$?phrasescore-train-settings"
    links, valid = _validation("OUT")
    column = (
        f"{links}{run.train_recipe} --models column --table IN.gz --corpus IN1 --valid {valid} "
        f"{languages} -o OUT --force {settings}"
    )
    sentence_links = links.replace("IN2", "IN1").replace("IN3", "IN2")
    sentence = (
        f"{sentence_links}{run.train_recipe} --models l2r,r2l,inverse,lstm --corpus IN "
        f"--valid {valid} {languages} -o OUT --force {settings}"
    )
    rescore = (
        f"{run.phrasescore} rescore IN1.gz -m IN2/column.safetensors -o OUT.table.gz "
        "--moses-ini IN --ini-out OUT --ini-table TranslationModel0 --no-progress "
        "$?phrasescore-rescore-settings"
    )
    return [
        new_step(
            "phrasescore-column-model",
            [
                (
                    "in",
                    "sigtest-filter-phrase-translation-table corpus TUNING:input TUNING:reference",
                ),
                ("out", "phrasescore-column-model"),
                ("default-name", "model/phrasescore-column"),
                ("ignore-unless", SWITCH),
                ("rerun-on-change", "phrasescore-train-settings"),
                ("template", column),
                ("final-model", "yes"),
            ],
        ),
        new_step(
            "phrasescore-sentence-models",
            [
                ("in", "corpus TUNING:input TUNING:reference"),
                ("out", "phrasescore-sentence-models"),
                ("default-name", "model/phrasescore-models"),
                ("ignore-unless", SWITCH),
                ("rerun-on-change", "phrasescore-train-settings"),
                ("template", sentence),
                ("final-model", "yes"),
            ],
        ),
    ], new_step(
        "phrasescore-config",
        [
            (
                "in",
                "config sigtest-filter-phrase-translation-table phrasescore-column-model",
            ),
            ("out", "phrasescore-config"),
            ("default-name", "model/moses.phrasescore.ini"),
            ("pass-unless", SWITCH),
            ("rerun-on-change", "phrasescore-rescore-settings"),
            ("template", rescore),
            ("final-model", "yes"),
        ],
    )


def filter_step(module: str) -> MetaStep:
    """The tables of the rescored system's ini filtered for the set's input (Moses' own filter
    script, given the real ini: its stand-in ini would declare the table's usual scores)."""
    where = "tuning" if module == "TUNING" else "evaluation"
    return new_step(
        "phrasescore-filter",
        [
            ("in", "input TRAINING:phrasescore-config"),
            ("out", "filtered-dir"),
            ("default-name", f"{where}/filtered.phrasescore"),
            ("ignore-unless", SWITCH),
            ("ignore-if", "TRAINING:binarize-all TRAINING:mmsapt use-hiero"),
            ("rerun-on-change", "filter-settings"),
            (
                "template",
                "$moses-script-dir/training/filter-model-given-input.pl OUT IN1 IN "
                "$?filter-settings",
            ),
            ("error", "already exists. Please delete"),
        ],
    )


def _scoring(run: Commands, models: str, nbest: str, source: str, out: str) -> str:
    """``cd MODELS && phrasescore nbest`` with the four sentence models' features (the model
    paths relative to their folder: experiment.perl substitutes IN only after a space)."""
    specs = [f"-m {name}={model}.safetensors" for name, model in FEATURES]
    specs.append(f"--inverse-model {INVERSE_FEATURE[0]}={INVERSE_FEATURE[1]}.safetensors")
    return (
        f"cd {models} && {run.phrasescore} nbest {nbest} --source {source} {' '.join(specs)} "
        f"--no-progress -o {out}"
    )


def weights_step(run: Commands) -> MetaStep:
    """TUNING: the re-ranking weights, tuned on the tuned system's dev n-best lists."""
    decode = (
        "mkdir -p OUT.work && $decoder -f IN -input-file IN1 -n-best-list OUT.work/dev.nbest "
        "$phrasescore-nbest distinct $?decoder-settings > OUT.work/dev.1best 2> OUT.work/dev.log"
    )
    score = _scoring(run, "IN3", "OUT.work/dev.nbest", "IN1", "OUT.work/dev.scored.nbest")
    tune = (
        f"{run.phrasescore} rerank-tune OUT.work/dev.scored.nbest --reference IN2 --start IN "
        "--moses-home $moses-src-dir --workdir OUT.work/tune -o OUT "
        "$?phrasescore-rerank-settings"
    )
    return new_step(
        "phrasescore-weights",
        [
            ("in", "weight-config input reference TRAINING:phrasescore-sentence-models"),
            ("out", "phrasescore-weights"),
            ("default-name", "tuning/phrasescore.weights"),
            ("ignore-unless", SWITCH),
            ("rerun-on-change", "phrasescore-nbest phrasescore-rerank-settings decoder-settings"),
            ("template", f"{decode} && {score} && {tune}"),
            ("final-model", "yes"),
        ],
    )


NBEST_LIST = "IN.best$phrasescore-nbest"
"""The n-best list EMS's decode step writes beside its output (IN) when [EVALUATION] sets
``nbest = "$phrasescore-nbest distinct"``: ``SYSTEM-OUTPUT.best`` and the setting's digits."""

EVALUATION_NBEST = 'nbest = "$phrasescore-nbest distinct"'
"""The [EVALUATION] line that has decode write the lists phrasescore-rerank reads (quoted: one
value, both words)."""


def rerank_step(run: Commands) -> MetaStep:
    """EVALUATION: the n-best list that decode wrote beside its 1-best, scored, re-ranked with
    the tuned weights; passed (decode's own 1-best) without phrasescore or with NO_RERANK.

    A missing list (a config without EVALUATION_NBEST) is one error line on the step's stderr,
    where experiment.perl looks for ``error``; the step goes on to its end (experiment.perl waits
    for the script's last line, not its exit status)."""
    score = _scoring(run, "IN3", NBEST_LIST, "IN1", "OUT.scored.nbest")
    rerank = (
        f"{run.phrasescore} nbest OUT.scored.nbest --source IN1 --weights IN2 --one-best "
        "--no-progress -o OUT"
    )
    line = EVALUATION_NBEST.replace('"', '\\"')
    missing = (
        f'echo "phrasescore-rerank: error: no n-best list {NBEST_LIST} from decode: add to the '
        f"EMS config's [EVALUATION]: {line}\" >&2"
    )
    return new_step(
        "phrasescore-rerank",
        [
            (
                "in",
                "system-output input TUNING:phrasescore-weights "
                "TRAINING:phrasescore-sentence-models",
            ),
            ("out", "phrasescore-output"),
            ("default-name", "evaluation/phrasescore-reranked"),
            ("pass-unless", SWITCH),
            ("pass-if", NO_RERANK),
            ("rerun-on-change", "phrasescore-nbest"),
            (
                "template",
                f"if test -e {NBEST_LIST} ; then {score} && {rerank} ; else {missing} ; fi",
            ),
        ],
    )


def splice(meta: Meta, run: Commands) -> Meta:
    """Moses' meta with phrasescore's steps in their places (in place; returned)."""
    training = meta.module("TRAINING")
    models, config = training_steps(run)
    training.insert_after("sigtest-filter-reordering", models)
    training.insert_after("create-config", [config])
    replace_input(training.step("binarize-config"), "config", "phrasescore-config")
    for name in ("TUNING", "EVALUATION"):
        module = meta.module(name)
        add_to_list(module.step("filter"), "ignore-if", SWITCH)
        module.insert_after("filter", [filter_step(name)])
    meta.module("TUNING").insert_after("apply-weights", [weights_step(run)])
    evaluation = meta.module("EVALUATION")
    evaluation.insert_after("decode", [rerank_step(run)])
    replace_input(evaluation.step("remove-markup"), "system-output", "phrasescore-output")
    return meta


def moses_meta_path(options: EmsMetaOptions) -> str:
    if options.meta:
        return options.meta
    home = options.moses_home or os.environ.get("MOSES_HOME")
    if not home:
        raise InputError(
            "no Moses: give --moses-home DIR (or set MOSES_HOME), or --meta FILE, to read "
            "Moses' experiment.meta"
        )
    return str(Path(home) / MOSES_META)


@dataclass
class EmsMetaResult:
    """The meta written, from which Moses meta, and what to run next."""

    output: str
    source: str

    def lines(self) -> list[str]:
        return [
            f"wrote {self.output}: {self.source} with phrasescore's steps",
            "add to the EMS config's sections (README: In EMS):",
            "  [GENERAL]",
            f"  {SWITCH} = yes",
            "  phrasescore-nbest = 100",
            "  [EVALUATION]",
            f"  {EVALUATION_NBEST}",
            "then run:",
            f"  experiment.perl -meta {self.output} -config CONFIG -exec",
        ]


def write_ems_meta(options: EmsMetaOptions) -> EmsMetaResult:
    """Read Moses' experiment.meta, splice phrasescore's steps in, write ``options.output``
    whole or not at all."""
    source = moses_meta_path(options)
    check_files_exist([source])
    refuse_outputs_onto_inputs({"Moses meta file": source}, {"-o": options.output})
    text = "".join(iter_lines(source, keep_ends=True))
    meta = splice(parse_meta(text, source), installed_commands())
    with AtomicOutput(options.output) as out:
        out.write(meta.text())
    return EmsMetaResult(options.output, source)
