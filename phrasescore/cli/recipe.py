"""``recipe``: the command of :mod:`phrasescore.jobs.recipe`, the README's recipe as one
resumable command."""

from __future__ import annotations

import click

from phrasescore.cli.group import cli, echo
from phrasescore.cli.options import POSITIVE, POSITIVE_FLOAT, TUNED_WEIGHTS, take


@cli.command("recipe", short_help="The whole recipe over a Moses system, resumable.")
@click.option("--moses-ini", required=True, help="The Moses system's moses.ini.")
@click.option("--table", help="Its phrase table (default: the one the ini declares).")
@click.option("--corpus", required=True, metavar="STEM", help="Training corpus: STEM.F, STEM.E.")
@click.option("--dev", required=True, metavar="STEM", help="Dev set (MERT, re-ranking weights).")
@click.option("--test", required=True, metavar="STEM", help="Test set (the BLEU reported).")
@click.option("--valid", metavar="STEM", help="The models' validation set (default: --dev).")
@click.option("--f", "f", required=True, help="Source language suffix (train-model.perl's --f).")
@click.option("--e", "e", required=True, help="Target language suffix (train-model.perl's --e).")
@click.option("-o", "--out", "work", required=True, help="Work folder: every output and log.")
@click.option("--moses-home", help="Moses build (default: $MOSES_HOME; none: Moses steps skip).")
@click.option("--jobs", type=POSITIVE, help="Steps at once (default: 5 per GPU, else 1 per core).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="Default: cuda if a GPU.")
@click.option("--minutes", type=POSITIVE_FLOAT, help="Time cap per model (train-recipe's).")
@click.option("--patience", type=POSITIVE, help="Validations without a new best (default 2).")
@click.option("--nbest-size", type=POSITIVE, default=100, show_default=True, help="N-best size.")
@click.option("--mert-iterations", type=POSITIVE, help="MERT's iterations (default: its own).")
@click.option("--runs", type=POSITIVE, default=3, show_default=True, help="rerank-tune --runs.")
@click.option(
    "--tune",
    type=TUNED_WEIGHTS,
    default="all",
    show_default=True,
    help="rerank-tune --tune: every weight, or only the models' (a small dev set).",
)
@click.option("--seed", type=int, default=1, show_default=True, help="MERT's and rerank-tune's.")
@click.option("--dry-run", is_flag=True, help="Print the plan (each step, why it runs) only.")
@click.argument("train_flags", nargs=-1, metavar="[-- TRAIN_FLAGS]")
def recipe_command(**params):
    """From a Moses system to the re-ranked test BLEU: the five models, the column and its
    MERT, the tuned system's n-best lists and their scores, the re-ranking weights, the test
    BLEU before and after. A step runs only when its outputs are missing or older than its
    inputs or its settings changed: a killed or changed run resumes where it must. Steps after
    the column need Moses; without it they are reported as skipped. TRAIN_FLAGS after -- go to
    every `phrasescore train` (e.g. -- --max-steps 50 --seed 1)."""
    from phrasescore.jobs.recipe.recipe import RecipeOptions, run_recipe

    options = RecipeOptions(**take(params, RecipeOptions))
    echo(run_recipe(options=options, **params))
