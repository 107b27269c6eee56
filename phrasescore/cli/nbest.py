"""``nbest``: the command of :mod:`phrasescore.jobs.nbest`."""

from __future__ import annotations

import click

from phrasescore.cli.group import cli, echo_on_rank_0
from phrasescore.cli.options import (
    POSITIVE,
    device_option,
    gzip_level_option,
    io_workers_option,
    no_progress_option,
    resume_option,
    scoring_option,
    shard_option,
    take,
    threads_option,
    workers_option,
)


@cli.command("nbest", short_help="Add log p(hypothesis | source) to an n-best list.")
@click.argument("nbest", metavar="NBEST")
@click.option("--source", required=True, help="Decoder input, one sentence per id (tokenised).")
@click.option(
    "-m",
    "--model",
    "model_path",
    multiple=True,
    metavar="[NAME=]MODEL[,MODEL]",
    help="NAME=MODEL: one feature NAME per -m, in order, all in one pass (NAME=A,B: the "
    "ensemble of A and B). Plain MODEL (optional with --lm): one feature named --name; several "
    "plain -m: one feature, their ensemble.",
)
@click.option(
    "--inverse-model",
    "inverse_models",
    multiple=True,
    metavar="NAME=MODEL[,MODEL]",
    help="A target->source model: feature NAME = log p(source | hypothesis), after the -m "
    "features; repeatable.",
)
@click.option("--name", help="Feature name of plain -m MODEL (no '_'; default RNNEncDec0).")
@click.option(
    "--inverse",
    is_flag=True,
    help="Plain -m is a target->source model: add log p(source | hypothesis) instead.",
)
@click.option("--lm", help="CSLM (train-lm): also add CSLM0= log p(hypothesis).")
@click.option("--lm-name", default="CSLM0", show_default=True, help="Name of the --lm feature.")
@click.option("-o", "--output", default="-", show_default=True, help="Output (.gz: gzip).")
@click.option("--normalize", is_flag=True, help="Per-token average log p / n instead of log p.")
@click.option("--weights", help="moses.ini or 'Name= w ...' file: re-rank each id's hypotheses.")
@click.option("--one-best", is_flag=True, help="With --weights: print the best hypothesis per id.")
@click.option("--batch-tokens", type=POSITIVE, default=8192, show_default=True, help="Per batch.")
@click.option(
    "--chunk-lines",
    type=POSITIVE,
    default=4000,
    show_default=True,
    help="Hypotheses per chunk, cut after the sentence that reaches it (the unit of --shard).",
)
@click.option(
    "--shared-prefixes/--no-shared-prefixes",
    default=None,
    help="Score each distinct (source, prefix, word) once: hypotheses that begin alike (end "
    "alike, for a right-to-left model) share the decoder's steps. Default: on the CPU, where it "
    "halves the work on 100-best lists; not yet measured on a GPU.",
)
@shard_option
@scoring_option
@device_option
@threads_option
@workers_option
@io_workers_option
@gzip_level_option
@resume_option
@no_progress_option
def nbest_command(**params):
    """Add log p(hypothesis | source) to every line of a Moses n-best list NBEST (- for stdin).

    Several models in one pass: -m L2R=l2r.safetensors -m R2L=r2l.safetensors --inverse-model
    Inv=fr-en.safetensors adds L2R=, R2L= and Inv= (the same bytes as one call per model, each
    on the list the previous one wrote). With --lm and no -m, adds the CSLM's log p(hypothesis)
    alone. With --weights and no model, re-ranks a list that holds every feature already. Under
    torchrun each rank scores one shard and rank 0 merges them into the output.
    """
    from phrasescore.jobs.nbest.nbest import NBestOptions, run_nbest

    options = NBestOptions(**take(params, NBestOptions))
    echo_on_rank_0(run_nbest(options=options, **params), err=True)
