"""``rescore``, ``merge-shards``, ``ini-tables``, ``check-table``, ``copy-table``: the commands of
:mod:`phrasescore.jobs.rescore`."""

from __future__ import annotations

import click

from phrasescore.cli.group import cli, echo, echo_on_rank_0
from phrasescore.cli.options import (
    POSITIVE,
    as_list,
    device_option,
    gzip_level_option,
    ini_options,
    io_workers_option,
    no_progress_option,
    resume_option,
    scoring_option,
    shard_option,
    take,
    threads_option,
    workers_option,
)


@cli.command("rescore", short_help="Add p(target | source) columns to a phrase table.")
@click.argument("table")
@click.option(
    "-m",
    "--model",
    "model_paths",
    multiple=True,
    callback=as_list,
    help="Model file; repeat for one column per model, in order.",
)
@click.option(
    "--inverse-model",
    "inverse_model_paths",
    multiple=True,
    callback=as_list,
    help="Model trained target->source: adds p(source | target) after the --model columns.",
)
@click.option(
    "--lm",
    "lm_paths",
    multiple=True,
    callback=as_list,
    help="CSLM (train-lm): adds p(target phrase) after the model columns; repeatable.",
)
@click.option("-o", "--output", help="Output table (default: TABLE.rescored[.gz]; - for stdout).")
@click.option("--normalize", is_flag=True, help="Per-token geometric mean exp(log p / n).")
@click.option("--logprob", is_flag=True, help="Write log p (NOT for Moses, which takes ln).")
@click.option("--unk-column", is_flag=True, help="Add exp(-unknown words) as one more column.")
@click.option(
    "--no-eos",
    is_flag=True,
    help="Leave the end-of-sequence term out of log p: the target words alone (for a "
    "sentence-trained model scoring phrase fragments; docs/benchmarks.md, history).",
)
@scoring_option
@ini_options
@device_option
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
    help="Precision of the network. auto: bfloat16 where the hardware has native bf16 "
    "matrix units (CUDA, AVX-512 BF16, AMX), else float32 (docs/benchmarks.md: Rescoring engine).",
)
@click.option(
    "--batch-tokens",
    type=POSITIVE,
    default=8192,
    show_default=True,
    help="Target tokens per scoring batch.",
)
@click.option(
    "--chunk-lines",
    type=POSITIVE,
    default=10000,
    show_default=True,
    help="Lines per chunk (the unit of --resume).",
)
@click.option(
    "--max-phrase-length",
    type=POSITIVE,
    default=100,
    show_default=True,
    help="Pairs with a longer phrase (tokens) get the floor value exp(-100) unscored.",
)
@gzip_level_option
@shard_option
@threads_option
@workers_option
@io_workers_option
@resume_option
@no_progress_option
def rescore_command(**params):
    """Add the models' p(target | source) to every line of a Moses phrase TABLE (- for stdin).

    Under torchrun each rank scores one shard and rank 0 merges them into the output.
    """
    from phrasescore.jobs.rescore.rescore import RescoreOptions, run_rescore

    if params["normalize"] and params["logprob"]:
        raise click.UsageError("--normalize and --logprob exclude each other")
    options = RescoreOptions(**take(params, RescoreOptions))
    echo_on_rank_0(run_rescore(options=options, **params), err=True)


@cli.command("merge-shards", short_help="Join the parts of rescore/nbest --shard into one file.")
@click.argument("parts", nargs=-1, required=True, callback=as_list)
@click.option("-o", "--output", required=True, help="Merged table or n-best list (.gz: gzip).")
@ini_options
def merge_shards_command(**params):
    """Check the PARTS of `rescore --shard K/N` or `nbest --shard K/N` (complete, one job,
    every shard once) and join them into one file, byte-identical to an unsharded run."""
    from phrasescore.jobs.rescore.merge_shards import run_merge

    echo(run_merge(**params), err=True)


@cli.command("ini-tables", short_help="List the phrase tables of a moses.ini.")
@click.argument("moses_ini")
@click.option("--factors", is_flag=True, help="Add INPUT_FACTORS and OUTPUT_FACTORS columns.")
def ini_tables_command(**params):
    """Print the phrase tables of MOSES_INI: NAME<TAB>CLASS<TAB>PATH<TAB>NUM_FEATURES per line.

    Paths are expanded and resolved relative to the ini's directory; '-' when a table has none.
    """
    from phrasescore.jobs.rescore.tables import ini_tables

    echo(ini_tables(**params))


@cli.command("check-table", short_help="Validate a Moses phrase table.")
@click.argument("table")
def check_table_command(**params):
    """Read and validate a Moses phrase TABLE (plain or gzip, - for stdin) in one pass."""
    from phrasescore.jobs.rescore.tables import check_table

    check_table(**params)


@cli.command("copy-table", short_help="Copy a phrase table through the reader and writer.")
@click.argument("table")
@click.option("-o", "--output", required=True, help="Table to write (.gz: gzip; -: stdout).")
def copy_table_command(**params):
    """Copy a phrase TABLE through phrasescore's reader and writer (validating it)."""
    from phrasescore.jobs.rescore.tables import copy_table

    copy_table(**params)
