"""``check-outputs`` (hidden): the bin/ scripts' check of their own files, the command of
:mod:`phrasescore.jobs.script_outputs`."""

from __future__ import annotations

import sys

import click

from phrasescore.cli.group import EXIT_INPUT_ERROR, cli
from phrasescore.errors import InputError


@cli.command("check-outputs", hidden=True)
@click.option("-i", "--input", "inputs", nargs=2, multiple=True, metavar="ROLE PATH")
@click.option("-o", "--output", "outputs", nargs=2, multiple=True, metavar="ROLE PATH")
@click.option(
    "--model", "models", nargs=2, multiple=True, metavar="ROLE PATH", help="A model to train."
)
@click.option("--workdir", "workdirs", nargs=2, multiple=True, metavar="ROLE DIR")
@click.option("--prog", default="phrasescore", help="The name the error line starts with.")
def check_outputs_command(prog, **params):
    """For the bin/ scripts, before any work: a file a script writes (``-o``; ``--model``: a
    model that ``train`` writes, with the files beside it) that is one of its inputs, or a work
    folder (``--workdir``) that holds one, is refused in one line, exit 1
    (:func:`~phrasescore.jobs.script_outputs.check_script_outputs`)."""
    from phrasescore.jobs.script_outputs import check_script_outputs

    try:
        check_script_outputs(**params)
    except InputError as exc:  # the script's name, not phrasescore's, starts the line
        click.echo(f"{prog}: error: {exc}", err=True)
        sys.exit(EXIT_INPUT_ERROR)
