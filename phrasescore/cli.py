"""The ``phrasescore`` command line: parses options and calls one library function per command.

Errors a user can fix (:class:`~phrasescore.errors.InputError`) become one line on stderr and exit
code 1; Click's own usage errors exit with 2.
"""

from __future__ import annotations

import functools
import logging
import sys

import click

from phrasescore import __version__
from phrasescore.errors import InputError

EXIT_INPUT_ERROR = 1


def _fail_cleanly(func):
    """Turn InputError (and Ctrl-C) into a one-line message and a non-zero exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except InputError as exc:
            click.echo(f"phrasescore: error: {exc}", err=True)
            sys.exit(EXIT_INPUT_ERROR)
        except KeyboardInterrupt:
            click.echo("phrasescore: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            sys.stderr.close()
            sys.exit(141)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="phrasescore")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors on stderr.")
def cli(verbose: int, quiet: bool) -> None:
    """Neural phrase scores for Moses: train an RNN Encoder-Decoder (Cho et al. 2014) and add
    its p(target | source) as one more phrase-table column."""
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    logging.basicConfig(level=level, format="phrasescore: %(message)s", stream=sys.stderr)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="phrasescore")
