"""``rerank-weights``, ``rerank-tune``, ``ab``: the commands of :mod:`phrasescore.jobs.tuning`."""

from __future__ import annotations

import click

from phrasescore.cli.group import cli, echo
from phrasescore.cli.options import (
    POSITIVE,
    SEED,
    TUNED_WEIGHTS,
    RegistryChoice,
    as_list,
    bleu_tokenizers,
    none_if_empty,
    take,
)
from phrasescore.errors import InputError


@cli.command("rerank-weights", short_help="Named weights <-> mert/kbmira files, by hand.")
@click.argument("features_dat", metavar="FEATURES_DAT")
@click.option("--start", metavar="INI", help="Write mert's init.opt from this moses.ini's weights.")
@click.option(
    "--tuned", metavar="WEIGHTS", help="Write Name= w lines from mert's weights.txt or kbmira's -o."
)
@click.option("-o", "--output", required=True, help="The file to write.")
def rerank_weights_command(**params):
    """Between the extractor's FEATURES_DAT (its header names the dense values) and named
    weights: --start INI writes mert's init.opt (a feature INI lacks starts at 0); --tuned
    WEIGHTS writes the Name= w lines that nbest --weights reads. docs/moses.md: re-ranking by hand.
    """
    from phrasescore.jobs.tuning.ab_rerank import rerank_weights

    echo(rerank_weights(**params), err=True)


@cli.command("rerank-tune", short_help="Tune re-ranking weights on a scored dev n-best list.")
@click.argument("nbest", metavar="DEV_NBEST")
@click.option(
    "--reference", required=True, help="The dev set's reference (tokenised like the list)."
)
@click.option(
    "--start",
    metavar="INI",
    help="moses.ini (or Name= w file) to start from: the decoder's tuned weights; a feature it "
    "lacks (a model's) starts at 0. Without it every weight starts at 0.",
)
@click.option("--moses-home", help="mosesdecoder build (default: $MOSES_HOME, else $MOSES).")
@click.option(
    "--tuner",
    type=click.Choice(["mert", "kbmira"]),
    default="mert",
    show_default=True,
    help="Moses' mert (line search, random restarts) or kbmira (batch MIRA).",
)
@click.option(
    "--runs",
    type=POSITIVE,
    default=1,
    show_default=True,
    help="Tune this many times (seeds SEED, SEED+1, ...) and keep the best dev BLEU.",
)
@click.option("--seed", type=SEED, default=1234, show_default=True, help="The first run's seed.")
@click.option(
    "--restarts", type=POSITIVE, default=20, show_default=True, help="mert's random restarts."
)
@click.option(
    "--tune",
    type=TUNED_WEIGHTS,
    default="all",
    show_default=True,
    help="Which weights move: all, or new: only the features --start does not weigh (the "
    "models'), its own kept; fewer weights for a small dev set (needs --start, mert).",
)
@click.option("--workdir", help="Keep the tools' files here (default: a temporary directory).")
@click.option("-o", "--output", required=True, help="The Name= w weights file to write.")
def rerank_tune_command(**params):
    """Tune the weights of every feature of DEV_NBEST (a Moses n-best list with the models'
    features, from one nbest call) on the fixed list with Moses' extractor and mert or kbmira,
    and write the Name= w lines that nbest --weights W --one-best applies to the test lists.
    docs/moses.md: re-ranking by hand.
    """
    from phrasescore.jobs.tuning.rerank_tune import TuneOptions, rerank_tune

    options = TuneOptions(**take(params, TuneOptions))
    echo(rerank_tune(options=options, **params), err=True)


@cli.command("ab", short_help="MERT A/B: does a new phrase-table column move BLEU?")
@click.option("--baseline", required=True, help="The baseline system's moses.ini.")
@click.option(
    "--candidate",
    "candidates",
    multiple=True,
    callback=as_list,
    metavar="[NAME=]INI",
    help="A candidate system's moses.ini (e.g. what rescore --moses-ini wrote); repeatable.",
)
@click.option(
    "--rerank",
    multiple=True,
    callback=as_list,
    metavar="[NAME=]MODEL[,MODEL]",
    help="Also re-rank every tuned run's n-best lists with this sentence model's log p "
    "(feature NAME, default RNNEncDec0, 1, ...), weights tuned on the dev lists with Moses' "
    "extractor and mert: one more system per system, SYSTEM+rerank; repeatable. Several "
    "comma-separated models: one feature, their ensemble.",
)
@click.option(
    "--rerank-inverse",
    multiple=True,
    callback=as_list,
    metavar="[NAME=]MODEL[,MODEL]",
    help="As --rerank, with a target->source model: the feature is log p(source | hypothesis) "
    "(default name RNNEncDecInv0, 1, ...); repeatable, together with --rerank.",
)
@click.option(
    "--rerank-set",
    "rerank_sets",
    multiple=True,
    callback=as_list,
    metavar="SET=FEATURE[,FEATURE]",
    help="--rerank: re-rank with these features only (names of --rerank / --rerank-inverse), "
    "a system of its own, SYSTEM+SET; repeatable: several sets on the same lists, each tuned "
    "alone (default: one set of every feature, SYSTEM+rerank).",
)
@click.option(
    "--against",
    metavar="NAME",
    help="The system each p-value compares with (a name of the report, e.g. baseline+SET; "
    "default: the baseline).",
)
@click.option(
    "--rerank-system",
    "rerank_systems",
    multiple=True,
    callback=none_if_empty,
    metavar="NAME",
    help="--rerank: re-rank only this system's runs (baseline or a candidate NAME); "
    "repeatable; default: every system.",
)
@click.option(
    "--nbest-size",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="--rerank: distinct hypotheses per sentence.",
)
@click.option(
    "--rerank-restarts",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="--rerank: mert's random restarts (mert-moses.pl's default).",
)
@click.option(
    "--rerank-tuner",
    type=click.Choice(["mert", "kbmira"]),
    default="mert",
    show_default=True,
    help="--rerank: tune the weights on the dev lists with mert or kbmira (batch MIRA); "
    "kbmira's systems are named SYSTEM+rerank-kbmira.",
)
@click.option(
    "--rerank-tune",
    type=TUNED_WEIGHTS,
    default="all",
    show_default=True,
    help="--rerank: tune every weight on the dev lists, or new: only the models' (the run's "
    "MERT weights kept; mert); its systems are named SYSTEM+rerank-new.",
)
@click.option(
    "--dev", nargs=2, required=True, metavar="SRC REF", help="Tuning set (tokenised as the system)."
)
@click.option(
    "--test",
    "tests",
    nargs=3,
    multiple=True,
    callback=as_list,
    metavar="NAME SRC REF",
    help="Test set; repeatable.",
)
@click.option("--workdir", required=True, help="Working directory (a rerun resumes there).")
@click.option("--moses-home", help="mosesdecoder build (default: $MOSES_HOME, else $MOSES).")
@click.option(
    "--runs", type=click.IntRange(1, 5), default=3, show_default=True, help="MERT runs per system."
)
@click.option(
    "--seeds",
    default="1234,5678,9012,3456,7890",
    show_default=True,
    help="MERT seeds (mert --rseed), one per run, comma-separated.",
)
@click.option(
    "--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="MERT runs at a time."
)
@click.option(
    "--decoder-threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Decoder threads per run.",
)
@click.option(
    "--max-iterations",
    type=click.IntRange(min=1),
    default=25,
    show_default=True,
    help="mert-moses.pl --maximum-iterations.",
)
@click.option("--mert-flags", default="", help="More mert-moses.pl flags (e.g. --batch-mira).")
@click.option(
    "--bleu-tokenize",
    type=RegistryChoice(bleu_tokenizers),
    default="none",
    show_default=True,
    help="sacrebleu tokenizer (none: the text is tokenised already, as multi-bleu.perl).",
)
@click.option(
    "--bootstrap-samples",
    type=click.IntRange(min=10),
    default=1000,
    show_default=True,
    help="Paired bootstrap resamples.",
)
def ab_command(seeds, **params):
    """Does a new phrase-table column move BLEU? MERT A/B of a baseline against candidates.

    Tunes every system --runs times with mert-moses.pl (different seeds, tables filtered once per
    system), decodes every --test set with every tuned ini and prints BLEU mean ± sd, the tuned
    weights of each candidate's new features and the paired bootstrap p-value against the
    baseline.
    """
    from phrasescore.jobs.tuning.ab import ComparisonOptions, run_ab

    try:
        seed_list = tuple(int(seed) for seed in seeds.split(","))
    except ValueError:
        raise InputError(f"--seeds {seeds!r}: give integers separated by commas") from None
    job = take(params, run_ab)
    options = ComparisonOptions(seeds=seed_list, **params)
    echo(run_ab(options=options, **job))
