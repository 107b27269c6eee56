"""The ``phrasescore`` group: logging, how every command ends on a user's error or a signal, and
how a command prints what its job returned.

Errors a user can fix (:class:`~phrasescore.errors.InputError`) and runs the machine stopped
(:class:`~phrasescore.errors.RunStopped`) become one line on stderr and exit code 1; Click's own
usage errors exit with 2; Ctrl-C exits with 130 and SIGTERM with 143, as a shell reports a signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys

import click

from phrasescore import __version__
from phrasescore.errors import InputError, RunStopped

EXIT_INPUT_ERROR = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C by every command (:func:`sigterm_interrupts`)."""


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) inside: Slurm and other batch
    systems send SIGTERM before they kill a job at its time limit (and ``kill`` sends it), and
    every command cleans up on an interrupt as on Ctrl-C: training saves its checkpoint,
    rescore keeps its partial output for ``--resume`` and stops its workers, temporary files
    are removed."""

    def interrupt(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class PhrasescoreGroup(click.Group):
    """The command group whose commands all end the same way: InputError and RunStopped as one
    line and exit code 1, Ctrl-C and SIGTERM as one line and 130 or 143, a closed pipe
    silently with 141. Click's usage errors pass through to click (exit code 2)."""

    def invoke(self, ctx):
        try:
            with sigterm_interrupts():
                return super().invoke(ctx)
        except (InputError, RunStopped) as exc:
            click.echo(f"phrasescore: error: {exc}", err=True)
            drop_unwritten_stdout()
            sys.exit(EXIT_INPUT_ERROR)
        except Terminated:
            click.echo("phrasescore: terminated (SIGTERM)", err=True)
            sys.exit(143)
        except KeyboardInterrupt:
            click.echo("phrasescore: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            sys.stderr.close()
            sys.exit(141)


def drop_unwritten_stdout() -> None:
    """After a failed write to standard output (a full disk), point it at /dev/null, so that
    the interpreter's flush at exit does not fail again with a traceback-like message."""
    try:
        sys.stdout.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _not_rank_0() -> bool:
    """A torchrun rank other than 0 (rank 0 alone reports)."""
    return torchrun() and os.environ.get("RANK", "0") != "0"


def echo(result, err: bool = False) -> None:
    """Print what a job returned: its ``lines()``, on standard output or (``err``) standard
    error. A full disk under standard output is one line and exit 1 (click.echo flushes each
    line, so a write that fails fails here)."""
    from phrasescore.files.disk import disk_errors

    with disk_errors("-"):
        for line in result.lines():
            click.echo(line, err=err)


def echo_on_rank_0(result, err: bool = False) -> None:
    """:func:`echo` for the commands torchrun can run: rank 0 alone reports."""
    if not _not_rank_0():
        echo(result, err=err)


@click.group(cls=PhrasescoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="phrasescore")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors on stderr.")
def cli(verbose: int, quiet: bool) -> None:
    """Neural phrase scores for Moses: train an RNN Encoder-Decoder (Cho et al. 2014) and add
    its p(target | source) as one more phrase-table column."""
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    prefix = "phrasescore"
    if torchrun():  # under torchrun: say which rank speaks
        prefix += f"[rank {os.environ.get('RANK', '?')}]"
    logging.basicConfig(level=level, format=f"{prefix}: %(message)s", stream=sys.stderr)
    _no_progress_monitor_thread()


def _no_progress_monitor_thread() -> None:
    """Keep tqdm from starting its monitor thread.

    tqdm's monitor is a daemon thread that its atexit hook only signals, never joins, so it wakes
    up while the interpreter is finalising. On CPython 3.9-3.12 a daemon thread racing
    finalisation can abort the process ("Fatal Python error: PyThreadState_Get: the function must
    be called with the GIL held", CPython gh-110052), which is how an interrupted ``train`` once
    died with code -6 after saving its checkpoint. The monitor only forces a redraw of bars that
    stall; ours are updated at least once per batch or chunk.
    """
    from tqdm import tqdm

    tqdm.monitor_interval = 0


def main() -> None:
    """Console-script entry point. A disk's write error that no command caught (click writing
    ``--help`` or ``--version`` to a full disk: ``phrasescore --help > /dev/full``) is one line
    and exit 1, as a command's."""
    from phrasescore.files.disk import write_error

    try:
        cli(prog_name="phrasescore")
    except OSError as exc:
        stopped = write_error(exc, exc.filename or "-")
        if stopped is None:
            raise
        click.echo(f"phrasescore: error: {stopped}", err=True)
        drop_unwritten_stdout()
        sys.exit(EXIT_INPUT_ERROR)
