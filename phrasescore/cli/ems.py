"""``ems-meta``: the command of :mod:`phrasescore.jobs.recipe.ems`, Moses' EMS meta file with
phrasescore's steps."""

from __future__ import annotations

import click

from phrasescore.cli.group import cli, echo
from phrasescore.cli.options import take


@cli.command("ems-meta", short_help="Moses' EMS meta file with phrasescore's steps.")
@click.option("-o", "--output", required=True, help="The meta file to write.")
@click.option("--moses-home", help="Moses build whose experiment.meta is read ($MOSES_HOME).")
@click.option("--meta", help="Read this experiment.meta instead of the Moses build's.")
def ems_meta_command(**params):
    """Write Moses' scripts/ems/experiment.meta with phrasescore's steps spliced in: the
    column's model and the sentence models after phrase extraction, the rescored table and its
    moses.ini before tuning, the re-ranking weights after tuning, each test set re-ranked
    (README: In EMS), from the n-best lists EMS's decode writes. Run it with `experiment.perl
    -meta OUTPUT -config CONFIG -exec` and a config that sets phrasescore = yes and
    phrasescore-nbest = N in [GENERAL] and nbest = "$phrasescore-nbest distinct" in
    [EVALUATION]; without phrasescore EMS runs Moses' own steps. The steps run this checkout's
    phrasescore with this Python."""
    from phrasescore.jobs.recipe.ems import EmsMetaOptions, write_ems_meta

    echo(write_ems_meta(EmsMetaOptions(**take(params, EmsMetaOptions))))
