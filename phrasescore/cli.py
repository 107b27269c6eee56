"""The ``phrasescore`` command line: parses options and calls one library function per command.

Errors a user can fix (:class:`~phrasescore.errors.InputError`) become one line on stderr and exit
code 1; Click's own usage errors exit with 2.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import signal
import sys

import click

from phrasescore import __version__
from phrasescore.errors import InputError, RunStopped

EXIT_INPUT_ERROR = 1


# ---------------------------------------------------------------------------- shared options
class RegistryChoice(click.Choice):
    """A choice among the names of a registry, read when first needed (so that ``--help`` does
    not import the networks)."""

    def __init__(self, names):
        self._names = names
        self._choices = None
        super().__init__([])

    @property
    def choices(self):
        if self._choices is None:
            self._choices = tuple(self._names())
        return self._choices

    @choices.setter
    def choices(self, value):
        pass


def _architectures():
    from phrasescore.model.config import ARCHITECTURES

    return ARCHITECTURES


def _presets():
    from phrasescore.model.config import ARCH_PRESETS

    return dict.fromkeys(name for table in ARCH_PRESETS.values() for name in table)


def _lm_presets():
    from phrasescore.model.cslm import LM_PRESETS

    return LM_PRESETS


def _optimizers():
    from phrasescore.model.config import OPTIMIZERS

    return OPTIMIZERS


def _bleu_tokenizers():
    from phrasescore.jobs.bleu import tokenizer_names

    return tokenizer_names()


def _set_threads(ctx, param, value):
    if value:
        from phrasescore.hardware import set_threads

        set_threads(value)
    return value


class DeviceType(click.ParamType):
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``; anything else is a usage error naming them."""

    name = "device"

    def convert(self, value, param, ctx):
        from phrasescore.hardware import DEVICE_CHOICES, valid_device_name

        if not valid_device_name(value):
            self.fail(f"{value!r} is not a device: one of {DEVICE_CHOICES}", param, ctx)
        return value


class ShardType(click.ParamType):
    """``K/N`` of ``--shard``: a :class:`~phrasescore.runners.shards.Shard`; anything else (``0/3``,
    ``4/3``, ``x``) is a usage error."""

    name = "K/N"

    def convert(self, value, param, ctx):
        from phrasescore.runners.shards import Shard

        if isinstance(value, Shard):
            return value
        try:
            return Shard.parse(value)
        except InputError as exc:
            self.fail(exc.message, param, ctx)


POSITIVE = click.IntRange(min=1)
"""Counts and sizes: 1 or more."""
NON_NEGATIVE = click.IntRange(min=0)
"""Optional counts where 0 means none."""
SEED = click.IntRange(0, 2**32 - 1)
MAX_PROCESSES = 256
"""The most ``--workers`` or ``--io-workers``: each is a forked process with its pipes, and
far more than a machine has cores fails on its limits (open files) instead of going faster."""
"""Random seeds (numpy takes 0 .. 2^32 - 1)."""


class FiniteFloat(click.FloatRange):
    """A finite number, within the range given: ``nan``, ``inf`` and ``1e999`` (which Python
    reads as inf) are usage errors at parse time, before any work (click's FloatRange lets nan
    through every bound, since no comparison with nan is true); so are what Python reads as
    another number than the one written: ``1_0`` (10), ``1e-400`` (0), and
    ``-0``, a negative zero that no option tells from 0 (a weight written to moses.ini as -0). Every float option of every
    command takes one of these types; ``tests/test_cli_checks.py`` enumerates them from the
    commands."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.min is None and self.max is None:
            self.name = "float"  # no range: --help shows FLOAT, not FLOAT RANGE with x<=None

    def _describe_range(self) -> str:
        return "" if self.min is None and self.max is None else super()._describe_range()

    def convert(self, value, param, ctx):
        if isinstance(value, str) and "_" in value:  # Python's 1_0 is 10; no user means that
            self.fail(f"{value!r} is not a number: write it without '_'", param, ctx)
        if isinstance(value, str) and not value.isascii():  # Python's float reads ٥ as 5
            self.fail(f"{value!r} is not a number: write it in ASCII digits", param, ctx)
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if number == 0 and isinstance(value, str):
            mantissa = re.split("[eE]", value.strip())[0]
            if re.search("[1-9]", mantissa):  # 1e-400: read as 0, not what was given
                self.fail(f"{value!r} is too small for a number: it would be read as 0", param, ctx)
            if math.copysign(1.0, number) < 0:  # -0 would be written as -0 (moses.ini's weight)
                self.fail(f"{value!r} is a negative zero: give 0", param, ctx)
        return super().convert(number, param, ctx)


FINITE_FLOAT = FiniteFloat()
"""Any finite number (ini weights)."""
POSITIVE_FLOAT = FiniteFloat(min=0.0, min_open=True)
"""Finite and more than 0 (learning rates, budgets)."""
NON_NEGATIVE_FLOAT = FiniteFloat(min=0.0)
"""Finite, 0 or more (penalties, epochs before a halving)."""
FRACTION = FiniteFloat(min=0.0, max=1.0, min_open=True)
"""Finite, in (0, 1] (factors of a learning rate)."""

device_option = click.option(
    "--device",
    type=DeviceType(),
    default="auto",
    show_default=True,
    help="auto, cpu, cuda or cuda:N.",
)
threads_option = click.option(
    "--threads",
    type=POSITIVE,
    expose_value=False,
    callback=_set_threads,
    help="CPU threads for PyTorch (default: PyTorch's).",
)
no_progress_option = click.option("--no-progress", is_flag=True, help="No progress bar.")
workers_option = click.option(
    "--workers",
    type=click.IntRange(1, MAX_PROCESSES),
    default=1,
    show_default=True,
    help="Score in this many processes of one thread each (CPU; same bytes as one process of one thread: --threads 1). "
    "One per core uses a multi-core CPU best (docs/scaling.md: Every core of one machine).",
)


def model_option(help: str = "Model file."):
    """``-m/--model``: one model file, required."""
    return click.option("-m", "--model", "model_path", required=True, help=help)


def _options(*decorators):
    """One decorator applying ``decorators`` in the order written (first: highest in --help)."""

    def apply(func):
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


shard_option = click.option(
    "--shard",
    type=ShardType(),
    help="Score only part K of N (chunks i with i % N = K-1) and write a manifest beside -o; "
    "join the parts with merge-shards.",
)
scoring_option = click.option(
    "--scoring",
    type=click.Choice(["exact", "self-normalized"]),
    default="exact",
    show_default=True,
    help="exact: the softmax over the whole target vocabulary. self-normalized: for a model "
    "trained with --self-normalize only: log p ~ the sum of the target words' logits, no "
    "softmax (faster, approximate; log p > 0 is clamped to 0; docs/commands.md: phrasescore rescore).",
)


def _ini_options():
    """``--moses-ini/--ini-out/--ini-table/--weight`` of rescore and merge-shards."""
    return _options(
        click.option("--moses-ini", help="Also write an updated moses.ini for the new table."),
        click.option("--ini-out", help="Where to write it (default: INI stem + .rescored.ini)."),
        click.option(
            "--ini-table", help="Phrase-table feature name in the ini (default: by path)."
        ),
        click.option(
            "--weight",
            type=FINITE_FLOAT,
            default=0.2,
            show_default=True,
            help="Initial weight of each new feature in the ini.",
        ),
    )


ini_options = _ini_options()


def training_options(file: str, batch_help: str, epochs_type, epochs_help: str):
    """The options ``train`` and ``train-lm`` share, from --batch-tokens to --resume."""
    return _options(
        click.option("--batch-tokens", type=POSITIVE, help=batch_help),
        click.option("--epochs", type=epochs_type, help=epochs_help),
        click.option("--max-steps", type=POSITIVE, help="Stop after this many updates."),
        click.option(
            "--max-minutes", type=POSITIVE_FLOAT, help="Stop after this much training time."
        ),
        click.option("--valid-every", type=POSITIVE, help="Validate every N steps."),
        click.option(
            "--patience", type=POSITIVE, help="Stop after N validations without improvement."
        ),
        click.option("--seed", type=SEED, help="Random seed (same seed, same run)."),
        device_option,
        click.option(
            "--amp/--no-amp",
            default=None,
            help="bf16 autocast (default: on for CUDA): the whole network on a GPU; on the CPU "
            "the output layer alone (fast where the CPU has AMX or AVX-512 BF16).",
        ),
        threads_option,
        click.option(
            "--resume",
            is_flag=True,
            help=f"Continue from {file}.checkpoint exactly (none yet: start from the beginning).",
        ),
        no_progress_option,
    )


text_options = _options(
    click.option(
        "--tokenize", is_flag=True, help="Raw text: run the Moses tokenizer (sacremoses)."
    ),
    click.option("--lowercase", is_flag=True, help="Lowercase the text."),
)


def _train_overrides(settings: dict) -> dict:
    """The TrainConfig overrides of the training options (``lr`` is ``learning_rate``)."""
    return {("learning_rate" if key == "lr" else key): value for key, value in settings.items()}


def _torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _not_rank_0() -> bool:
    """A torchrun rank other than 0 (rank 0 alone reports)."""
    return _torchrun() and os.environ.get("RANK", "0") != "0"


def _echo(result, err: bool = False) -> None:
    """Print what a job returned: its ``lines()``, on standard output or (``err``) standard
    error. A full disk under standard output is one line and exit 1 (click.echo flushes each
    line, so a write that fails fails here)."""
    from phrasescore.files.disk import disk_errors

    with disk_errors("-"):
        for line in result.lines():
            click.echo(line, err=err)


def _echo_on_rank_0(result, err: bool = False) -> None:
    """:func:`_echo` for the commands torchrun can run: rank 0 alone reports."""
    if not _not_rank_0():
        _echo(result, err=err)


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C by every command (:func:`_sigterm_interrupts`)."""


def _sigterm_interrupts(func):
    """SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) while ``func`` runs: Slurm and
    other batch systems send SIGTERM before they kill a job at its time limit (and ``kill``
    sends it), and every command cleans up on an interrupt as on Ctrl-C: training saves its
    checkpoint, rescore keeps its partial output for ``--resume`` and stops its workers,
    temporary files are removed."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        def interrupt(signum, frame):
            raise Terminated

        previous = signal.signal(signal.SIGTERM, interrupt)
        try:
            return func(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapper


def _fail_cleanly(func):
    """Turn InputError, RunStopped, Ctrl-C and SIGTERM into a one-line message and a non-zero
    exit code (130 for Ctrl-C, 143 for SIGTERM, as a shell reports a signal)."""
    func = _sigterm_interrupts(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (InputError, RunStopped) as exc:
            click.echo(f"phrasescore: error: {exc}", err=True)
            _drop_unwritten_stdout()
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

    return wrapper


def _drop_unwritten_stdout() -> None:
    """After a failed write to standard output (a full disk), point it at /dev/null, so that
    the interpreter's flush at exit does not fail again with a traceback-like message."""
    try:
        sys.stdout.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="phrasescore")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors on stderr.")
def cli(verbose: int, quiet: bool) -> None:
    """Neural phrase scores for Moses: train an RNN Encoder-Decoder (Cho et al. 2014) and add
    its p(target | source) as one more phrase-table column."""
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    prefix = "phrasescore"
    if _torchrun():  # under torchrun: say which rank speaks
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


# ---------------------------------------------------------------------------- train / info
@cli.command(short_help="Train an encoder-decoder on parallel text (or a table).")
@click.argument("source", required=False)
@click.argument("target", required=False)
@click.option(
    "-o", "--output", "model_path", required=True, help="Model file to write (.safetensors)."
)
@click.option("--phrase-table", help="Train on the distinct phrase pairs of a Moses table instead.")
@click.option(
    "--inverse",
    is_flag=True,
    help="With --phrase-table: train p(source phrase | target phrase) on the pairs reversed, "
    "for rescore --inverse-model (give --src-lang/--tgt-lang of that direction).",
)
@click.option(
    "--valid", nargs=2, metavar="SRC TGT", help="Validation files (else a held-out slice)."
)
@click.option(
    "--preset",
    type=RegistryChoice(_presets),
    default="default",
    show_default=True,
    help="Model and training sizes of the architecture: default (CPU-sized), paper (the "
    "paper's sizes, for a GPU) or tiny (a seconds-long smoke test: 64 hidden units, 600-token "
    "batches; scores are not useful). docs/commands.md: Presets.",
)
@click.option(
    "--arch",
    type=RegistryChoice(_architectures),
    default="cho",
    show_default=True,
    help="cho: RNN Encoder-Decoder (Cho et al. 2014); lstm: deep LSTM, source reversed "
    "(Sutskever et al. 2014); attention: RNNsearch (Bahdanau et al. 2015). Stored in the model.",
)
@click.option("--layers", type=POSITIVE, help="lstm: LSTM layers (default: the preset's).")
@click.option(
    "--no-reverse", is_flag=True, help="lstm: read the source in its own order, not reversed."
)
@click.option(
    "--reverse-target",
    is_flag=True,
    help="Right-to-left model: predict the target words last to first (a second re-ranking "
    "feature beside the left-to-right model). Stored in the model: every command gives and "
    "gets words in their natural order.",
)
@click.option(
    "--self-normalize",
    "self_normalize",
    type=NON_NEGATIVE_FLOAT,
    metavar="ALPHA",
    help="Add ALPHA (log Z)² per target token to the loss (Devlin et al. 2014), so that "
    "rescore/nbest --scoring self-normalized can skip the softmax; 0 (default): off. Devlin et "
    "al. used 0.1. Stored in the model.",
)
@click.option(
    "--init",
    type=click.Choice(["fan-in", "paper"]),
    help="Initialisation: fan-in (PyTorch's scales; the default preset) or paper (N(0, 0.01²), "
    "lstm U(±0.08); the paper preset).",
)
@click.option(
    "--recurrence",
    type=click.Choice(["written", "fused"]),
    help="cho and attention: the GRUs written out, exactly Cho et al. eq. 5-8 (written, every "
    "preset's), or torch.nn.GRU for the encoder and cho's decoder (fused: one cuDNN call per "
    "sentence on a GPU; its reset gate acts after the recurrent product; not with --preset "
    "paper). Stored in the model.",
)
@click.option("--src-lang", default="en", show_default=True, help="Source language (tokeniser).")
@click.option("--tgt-lang", default="fr", show_default=True, help="Target language (tokeniser).")
@text_options
@click.option("--vocab-size", type=POSITIVE, help="Words per side (default 15000).")
@click.option(
    "--subwords",
    type=click.IntRange(min=5),
    help="Use a sentencepiece vocabulary of N pieces per side.",
)
@click.option(
    "--max-length", type=POSITIVE, help="Skip pairs longer than this (tokens; default 50)."
)
@click.option("--optimizer", type=RegistryChoice(_optimizers), help="Override the preset.")
@click.option(
    "--lr",
    type=POSITIVE_FLOAT,
    help="Learning rate (Adam: 1e-3, 2e-3 for the attention default; Adadelta: 1.0; SGD: 0.7).",
)
@click.option(
    "--lr-plateau-factor",
    type=FRACTION,
    metavar="F",
    help="Multiply the learning rate by F after each validation without a new best "
    "(default preset: 0.5; paper presets: never; 1: never).",
)
@click.option(
    "--lr-halve-after",
    "lr_halve_after_epochs",
    type=NON_NEGATIVE_FLOAT,
    metavar="EPOCHS",
    help="Halve the learning rate once EPOCHS epochs are done (may be fractional), then every "
    "--lr-halve-every epochs (Sutskever et al.: 5; default presets: never).",
)
@click.option(
    "--lr-halve-every",
    "lr_halve_every_epochs",
    type=POSITIVE_FLOAT,
    metavar="EPOCHS",
    help="With --lr-halve-after: epochs between halvings (default 0.5).",
)
@click.option(
    "--compile",
    "compile",
    is_flag=True,
    default=None,
    help="Run the written-out recurrences' steps (the GRU of eq. 5-8, the attention decoder's "
    "step) through torch.compile: the same equations in fewer kernels (off by default). Not a "
    "speed-up: measured, the compilation is not won back within a 10-minute training on the "
    "CPU or on a GPU (docs/benchmarks.md); it is there to study compiled steps "
    "(PHRASESCORE_COMPILE_MODE=reduce-overhead: CUDA graphs, with --bucket).",
)
@click.option(
    "--chunked-output",
    is_flag=True,
    default=None,
    help="Fuse the loss's vocabulary projection and log-sum-exp over row chunks: no [tokens x "
    "vocabulary] logits kept for the backward, at the price of one more product (off by "
    "default).",
)
@click.option(
    "--bucket",
    type=click.IntRange(min=0),
    metavar="N",
    help="Pad each batch's widths and row count to multiples of N, so that shapes repeat (for "
    "--compile and CUDA graphs; default 0: off). Padding never enters the loss.",
)
@training_options(
    "MODEL",
    "Target tokens per batch.",
    POSITIVE_FLOAT,
    "Maximum epochs (may be fractional, e.g. 7.5).",
)
@_fail_cleanly
def train(
    source,
    target,
    model_path,
    phrase_table,
    inverse,
    valid,
    preset,
    arch,
    layers,
    no_reverse,
    reverse_target,
    self_normalize,
    init,
    recurrence,
    src_lang,
    tgt_lang,
    tokenize,
    lowercase,
    device,
    amp,
    resume,
    no_progress,
    **settings,
):
    """Train an encoder-decoder (--arch) on SOURCE TARGET (parallel files, plain or gzip)."""
    from phrasescore.jobs.training.train import run_training
    from phrasescore.model.config import initialisation_overrides

    result = run_training(
        model_path=model_path,
        source=source,
        target=target,
        phrase_table=phrase_table,
        inverse=inverse,
        valid=valid,
        preset=preset,
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        tokenize=tokenize,
        lowercase=lowercase,
        device=device,
        amp=amp,
        threads=None,  # set by --threads
        resume=resume,
        overrides=_train_overrides(settings),
        arch=arch,
        progress=not no_progress,
        model_overrides=dict(
            layers=layers,
            reverse_source=False if no_reverse else None,
            reverse_target=True if reverse_target else None,
            self_normalize=self_normalize,
            recurrence=recurrence,
            **initialisation_overrides(init, arch),
        ),
    )
    _echo_on_rank_0(result)


@cli.command("train-lm", short_help="Train the CSLM target language model.")
@click.argument("corpus")
@click.option("-o", "--output", "model_path", required=True, help="LM file to write.")
@click.option("--valid", help="Validation text (else a held-out slice of CORPUS).")
@click.option(
    "--preset",
    type=RegistryChoice(_lm_presets),
    default="default",
    show_default=True,
    help="Sizes (paper: order 7, 512-dim embeddings, 3072-1536-1024 relu layers).",
)
@click.option(
    "--order", type=click.IntRange(min=2), help="n of the n-gram model (default: the preset's)."
)
@click.option("--lang", default="fr", show_default=True, help="Language (tokeniser).")
@text_options
@click.option("--vocab-size", type=POSITIVE, help="Words in the vocabulary (default 15000).")
@click.option("--max-length", type=POSITIVE, help="Skip longer training sentences (default 100).")
@click.option("--lr", type=POSITIVE_FLOAT, help="Learning rate (Adam).")
@training_options("LM", "Tokens per batch.", POSITIVE, "Maximum epochs.")
@_fail_cleanly
def train_lm(
    corpus,
    model_path,
    valid,
    preset,
    order,
    lang,
    tokenize,
    lowercase,
    device,
    amp,
    resume,
    no_progress,
    **settings,
):
    """Train the CSLM target language model (Schwenk 2007) on CORPUS (target-language text)."""
    from phrasescore.jobs.training.train_lm import run_lm_training

    result = run_lm_training(
        model_path=model_path,
        corpus=corpus,
        valid=valid,
        preset=preset,
        order=order,
        lang=lang,
        tokenize=tokenize,
        lowercase=lowercase,
        device=device,
        amp=amp,
        resume=resume,
        overrides=_train_overrides(settings),
        progress=not no_progress,
    )
    _echo_on_rank_0(result)


@cli.command(short_help="Describe a model or CSLM file.")
@click.argument("model_path", metavar="MODEL")
@_fail_cleanly
def info(model_path):
    """Print what a model file (or a CSLM file) is: architecture, sizes, vocabularies, training."""
    from phrasescore.jobs.analysis.info import describe_file

    _echo(describe_file(model_path))


# ---------------------------------------------------------------------------- rescore
@cli.command(short_help="Add p(target | source) columns to a phrase table.")
@click.argument("table")
@click.option(
    "-m",
    "--model",
    "models",
    multiple=True,
    help="Model file; repeat for one column per model, in order.",
)
@click.option(
    "--inverse-model",
    "inverse_models",
    multiple=True,
    help="Model trained target->source: adds p(source | target) after the --model columns.",
)
@click.option(
    "--lm",
    "lm_paths",
    multiple=True,
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
@click.option(
    "--gzip-level",
    type=click.IntRange(0, 9),
    default=1,
    show_default=True,
    help="Compression of a .gz output: 0-3 ISA-L's levels (fast), 4-9 zlib's (6: gzip's "
    "default, ~17x slower than 1, 28% smaller); docs/benchmarks.md: Table I/O.",
)
@shard_option
@threads_option
@workers_option
@click.option(
    "--io-workers",
    type=click.IntRange(0, MAX_PROCESSES),
    default=0,
    show_default=True,
    help="Processes that parse, look up ids and write while this one scores (for a GPU: one "
    "per core left; same bytes). Not with --workers.",
)
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its last chunk.")
@no_progress_option
@_fail_cleanly
def rescore(
    table,
    models,
    inverse_models,
    lm_paths,
    output,
    normalize,
    logprob,
    unk_column,
    no_eos,
    scoring,
    moses_ini,
    ini_out,
    ini_table,
    weight,
    device,
    dtype,
    batch_tokens,
    chunk_lines,
    max_phrase_length,
    gzip_level,
    shard,
    workers,
    io_workers,
    resume,
    no_progress,
):
    """Add the models' p(target | source) to every line of a Moses phrase TABLE (- for stdin).

    Under torchrun each rank scores one shard and rank 0 merges them into the output.
    """
    from phrasescore.jobs.rescore.rescore import RescoreOptions, run_rescore

    if normalize and logprob:
        raise click.UsageError("--normalize and --logprob exclude each other")
    options = RescoreOptions(
        normalize=normalize,
        logprob=logprob,
        unk_column=unk_column,
        no_eos=no_eos,
        dtype=dtype,
        batch_tokens=batch_tokens,
        chunk_lines=chunk_lines,
        max_phrase_length=max_phrase_length,
        scoring=scoring,
        gzip_level=gzip_level,
    )
    job = run_rescore(
        table,
        list(models),
        output,
        options,
        device=device,
        resume=resume,
        moses_ini=moses_ini,
        ini_out=ini_out,
        ini_table=ini_table,
        weight=weight,
        progress=not no_progress,
        inverse_model_paths=list(inverse_models),
        lm_paths=list(lm_paths),
        shard=shard,
        workers=workers,
        io_workers=io_workers,
    )
    _echo_on_rank_0(job, err=True)


@cli.command("merge-shards", short_help="Join the parts of rescore/nbest --shard into one file.")
@click.argument("parts", nargs=-1, required=True)
@click.option("-o", "--output", required=True, help="Merged table or n-best list (.gz: gzip).")
@ini_options
@_fail_cleanly
def merge_shards(parts, output, moses_ini, ini_out, ini_table, weight):
    """Check the PARTS of `rescore --shard K/N` or `nbest --shard K/N` (complete, one job,
    every shard once) and join them into one file, byte-identical to an unsharded run."""
    from phrasescore.jobs.rescore.merge_shards import run_merge

    job = run_merge(list(parts), output, moses_ini, ini_out, ini_table, weight)
    _echo(job, err=True)


# ---------------------------------------------------------------------------- n-best / generation
@cli.command("nbest", short_help="Add log p(hypothesis | source) to an n-best list.")
@click.argument("nbest_path", metavar="NBEST")
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
@shard_option
@scoring_option
@device_option
@threads_option
@workers_option
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its last chunk.")
@no_progress_option
@_fail_cleanly
def nbest(
    nbest_path,
    source,
    model_path,
    inverse_models,
    name,
    inverse,
    lm,
    lm_name,
    output,
    normalize,
    weights,
    one_best,
    batch_tokens,
    chunk_lines,
    shard,
    scoring,
    device,
    workers,
    resume,
    no_progress,
):
    """Add log p(hypothesis | source) to every line of a Moses n-best list NBEST (- for stdin).

    Several models in one pass: -m L2R=l2r.safetensors -m R2L=r2l.safetensors --inverse-model
    Inv=fr-en.safetensors adds L2R=, R2L= and Inv= (the same bytes as one call per model, each
    on the list the previous one wrote). With --lm and no -m, adds the CSLM's log p(hypothesis)
    alone. With --weights and no model, re-ranks a list that holds every feature already. Under
    torchrun each rank scores one shard and rank 0 merges them into the output.
    """
    from phrasescore.jobs.nbest.nbest import NBestOptions, run_nbest

    options = NBestOptions(
        name=name,
        normalize=normalize,
        weights=weights,
        one_best=one_best,
        chunk_lines=chunk_lines,
        batch_tokens=batch_tokens,
        lm=lm,
        lm_name=lm_name,
        scoring=scoring,
        inverse=inverse,
        inverse_models=tuple(inverse_models),
    )
    result = run_nbest(
        nbest_path,
        source,
        model_path,
        output,
        options,
        device=device,
        progress=not no_progress,
        shard=shard,
        workers=workers,
        resume=resume,
    )
    _echo_on_rank_0(result, err=True)


@cli.command(short_help="Translate text with beam search.")
@click.argument("input_path", metavar="[INPUT]", default="-", required=False)
@model_option()
@click.option("-o", "--output", default="-", show_default=True, help="Output file (.gz: gzip).")
@click.option("--beam", type=POSITIVE, default=5, show_default=True, help="Beam size (1: greedy).")
@click.option(
    "--nbest", type=POSITIVE, help="Write a Moses n-best list of K hypotheses per sentence."
)
@click.option("--max-length", type=POSITIVE, help="Most output tokens (default 2 x source + 10).")
@click.option(
    "--length-penalty",
    type=NON_NEGATIVE_FLOAT,
    default=1.0,
    show_default=True,
    help="GNMT alpha: rank by log p / ((5 + n) / 6)^alpha; 0 ranks by log p.",
)
@click.option("--no-unk", is_flag=True, help="Never output the unknown-word symbol.")
@click.option("--detokenize", is_flag=True, help="Detokenise the output (sacremoses).")
@click.option("--reference", help="Reference translations: print BLEU and chrF (sacrebleu).")
@click.option(
    "--bleu-tokenize",
    type=RegistryChoice(_bleu_tokenizers),
    default="13a",
    show_default=True,
    help="sacrebleu tokenizer of --reference's BLEU (none: the text is tokenised already, as "
    "ab and multi-bleu.perl score it).",
)
@click.option("--name", default="RNNEncDec0", show_default=True, help="n-best feature name.")
@click.option(
    "--batch-size", type=POSITIVE, default=32, show_default=True, help="Sentences per batch."
)
@device_option
@threads_option
@no_progress_option
@_fail_cleanly
def translate(
    input_path,
    model_path,
    output,
    beam,
    nbest,
    max_length,
    length_penalty,
    no_unk,
    detokenize,
    reference,
    bleu_tokenize,
    name,
    batch_size,
    device,
    no_progress,
):
    """Translate INPUT (a file, or - for stdin) line by line with beam search."""
    from phrasescore.jobs.analysis.translate import TranslateOptions, translate_file

    options = TranslateOptions.from_flags(
        beam=beam,
        nbest=nbest,
        max_length=max_length,
        length_penalty=length_penalty,
        forbid_unk=no_unk,
        detokenize=detokenize,
        feature_name=name,
        batch_size=batch_size,
    )
    result = translate_file(
        input_path,
        model_path,
        output,
        options,
        reference=reference,
        device=device,
        progress=not no_progress,
        bleu_tokenize=bleu_tokenize,
    )
    _echo(result, err=True)


@cli.command(short_help="BLEU and chrF of hypotheses (sacrebleu).")
@click.argument("hypotheses")
@click.argument("reference")
@click.option(
    "--tokenize",
    type=RegistryChoice(_bleu_tokenizers),
    default="13a",
    show_default=True,
    help="sacrebleu's BLEU tokenizer.",
)
@click.option("--lowercase", is_flag=True, help="Case-insensitive BLEU and chrF.")
@_fail_cleanly
def evaluate(hypotheses, reference, tokenize, lowercase):
    """BLEU and chrF of HYPOTHESES against REFERENCE (sacrebleu), with sacrebleu's signatures."""
    from phrasescore.jobs.analysis.evaluate import evaluate_files

    _echo(evaluate_files(hypotheses, reference, tokenize, lowercase))


@cli.command(short_help="Sample target phrases for source phrases.")
@click.argument("phrases", nargs=-1, required=True, metavar="PHRASE... | -")
@model_option()
@click.option(
    "-n",
    "--samples",
    type=NON_NEGATIVE,
    default=100,
    show_default=True,
    help="Samples drawn (0: with --beam, the beam's targets alone).",
)
@click.option(
    "--top", type=POSITIVE, default=10, show_default=True, help="Targets kept per phrase."
)
@click.option("--beam", is_flag=True, help="Add the beam-search --top best to the candidates.")
@click.option("--phrase-table", help="Moses table: mark each pair as in the table or new.")
@click.option("--seed", type=SEED, default=1, show_default=True, help="Sampling seed.")
@click.option("--max-length", type=POSITIVE, help="Most target tokens (default 2 x source + 10).")
@click.option("--no-unk", is_flag=True, help="Never output the unknown-word symbol.")
@device_option
@threads_option
@_fail_cleanly
def sample(
    phrases,
    model_path,
    samples,
    top,
    beam,
    phrase_table,
    seed,
    max_length,
    no_unk,
    device,
):
    """Best target phrases for each source PHRASE by sampling (Cho et al. 2014, Table 3).

    Prints one line per target: source, log p, target and, with --phrase-table, 'in-table' or
    'new', tab-separated.
    """
    from phrasescore.jobs.analysis.sample import SampleOptions, run_sample

    if samples == 0 and not beam:
        raise click.UsageError("nothing to do: -n 0 without --beam")
    options = SampleOptions(
        samples=samples,
        top=top,
        beam=beam,
        seed=seed,
        max_length=max_length,
        forbid_unk=no_unk,
    )
    _echo(run_sample(phrases, model_path, options, phrase_table=phrase_table, device=device))


# ---------------------------------------------------------------------------- analyses
@cli.command(short_help="Phrase vectors and word embeddings of a model.")
@click.argument("phrases_path", metavar="[PHRASES]", required=False)
@model_option()
@click.option(
    "-o", "--output", "prefix", required=True, help="Output prefix: PREFIX.npy and PREFIX.tsv."
)
@click.option("--phrase-table", help="Take the most frequent phrases of a Moses table instead.")
@click.option(
    "--side",
    type=click.Choice(["source", "target"]),
    default="source",
    show_default=True,
    help="Side of --phrase-table.",
)
@click.option(
    "--limit", type=POSITIVE, default=1000, show_default=True, help="Phrases from --phrase-table."
)
@click.option(
    "--min-words", type=POSITIVE, default=1, show_default=True, help="Table phrases of >= N words."
)
@click.option(
    "--words", type=NON_NEGATIVE, default=0, help="Also write the N most frequent words' vectors."
)
@click.option("--map", "map_path", help="Draw a 2-D map of the phrase vectors (PNG).")
@click.option("--word-map", "word_map_path", help="Draw a 2-D map of the source words (PNG).")
@click.option(
    "--neighbours", type=NON_NEGATIVE, default=0, help="Print the K nearest phrases (cosine)."
)
@click.option("--query", "queries", multiple=True, help="Neighbours of this phrase only; repeat.")
@click.option(
    "--labels", type=NON_NEGATIVE, default=150, show_default=True, help="Most labels per map."
)
@click.option(
    "--method",
    type=click.Choice(["auto", "tsne", "pca"]),
    default="auto",
    show_default=True,
    help="Map projection (auto: t-SNE if scikit-learn is installed, else PCA).",
)
@click.option("--seed", type=SEED, default=1, show_default=True, help="t-SNE seed.")
@device_option
@threads_option
@_fail_cleanly
def represent(
    phrases_path,
    model_path,
    prefix,
    phrase_table,
    side,
    limit,
    min_words,
    words,
    map_path,
    word_map_path,
    neighbours,
    queries,
    labels,
    method,
    seed,
    device,
):
    """Phrase vectors (the encoder's summary c) and word embeddings of a model (Cho et al.
    2014, Fig. 4-5): PHRASES is a file of phrases, one per line (- for stdin).

    With --neighbours, prints one line per neighbour: query, rank, cosine, phrase (tab-separated).
    """
    from phrasescore.jobs.analysis.represent import RepresentOptions
    from phrasescore.jobs.analysis.represent import represent as run_represent

    options = RepresentOptions(
        phrase_table=phrase_table,
        side=side,
        limit=limit,
        min_words=min_words,
        words=words,
        map_path=map_path,
        word_map_path=word_map_path,
        neighbours=neighbours,
        queries=list(queries),
        labels=labels,
        method=method,
        seed=seed,
    )
    _echo(run_represent(phrases_path, model_path, prefix, options, device=device))


@cli.command(short_help="A model's top targets beside a phrase table's.")
@click.argument("table")
@model_option()
@click.option("--sources", "sources_path", help="Source phrases to compare, one per line.")
@click.option(
    "--sample",
    type=POSITIVE,
    default=10,
    show_default=True,
    help="Else: sample N source phrases...",
)
@click.option(
    "--min-targets", type=POSITIVE, default=5, show_default=True, help="...with >= K targets..."
)
@click.option("--min-words", type=POSITIVE, default=1, show_default=True, help="...and >= W words.")
@click.option(
    "--top", type=POSITIVE, default=5, show_default=True, help="Targets listed per source."
)
@click.option(
    "--column", type=POSITIVE, default=3, show_default=True, help="Table score to compare (φ(e|f))."
)
@click.option("--proposals", type=NON_NEGATIVE, default=0, help="Draw N model samples per source.")
@click.option("--scatter", "scatter_path", help="Scatter plot of model vs table scores (PNG).")
@click.option(
    "--max-pairs",
    type=NON_NEGATIVE,
    default=20000,
    show_default=True,
    help="Pairs sampled for the scatter and correlations (0: all).",
)
@click.option("--seed", type=SEED, default=1, show_default=True, help="Sampling seed.")
@device_option
@threads_option
@_fail_cleanly
def compare(
    table,
    model_path,
    sources_path,
    sample,
    min_targets,
    min_words,
    top,
    column,
    proposals,
    scatter_path,
    max_pairs,
    seed,
    device,
):
    """The model's top targets beside the phrase TABLE's (Cho et al. 2014, Table 2-3, Fig. 3),
    and the rank correlations of its log p with the table's columns; markdown on stdout."""
    from phrasescore.jobs.analysis.compare import CompareOptions
    from phrasescore.jobs.analysis.compare import compare as run_compare

    options = CompareOptions(
        sources_path=sources_path,
        sample=sample,
        min_targets=min_targets,
        min_words=min_words,
        top=top,
        column=column,
        proposals=proposals,
        scatter_path=scatter_path,
        max_pairs=max_pairs,
        seed=seed,
    )
    _echo(run_compare(table, model_path, options, device=device))


@cli.command(short_help="Word alignments from an attention model.")
@click.argument("source")
@click.argument("target")
@model_option("Attention model file.")
@click.option("-o", "--output", default="-", show_default=True, help="Output file (.gz: gzip).")
@click.option("--plot", "plot_dir", help="Also draw each pair's alignment matrix: DIR/NNNNNN.png.")
@click.option("--batch-size", type=POSITIVE, default=32, show_default=True, help="Pairs per batch.")
@device_option
@threads_option
@_fail_cleanly
def align(source, target, model_path, output, plot_dir, batch_size, device):
    """Word alignments of SOURCE TARGET (parallel files) from an attention model's weights.

    One line per pair, Moses 'i-j' (source word i, target word j, 0-based): each target word to
    the source word it attends to most, end-of-sentence excluded (Bahdanau et al. 2015, Fig. 3).
    """
    from phrasescore.jobs.analysis.align import align_files

    result = align_files(
        source, target, model_path, output, plot_dir, device=device, batch_size=batch_size
    )
    _echo(result, err=True)


# ---------------------------------------------------------------------------- Moses files
@cli.command("rerank-weights", short_help="Named weights <-> mert/kbmira files, by hand.")
@click.argument("features_dat", metavar="FEATURES_DAT")
@click.option("--start", metavar="INI", help="Write mert's init.opt from this moses.ini's weights.")
@click.option(
    "--tuned", metavar="WEIGHTS", help="Write Name= w lines from mert's weights.txt or kbmira's -o."
)
@click.option("-o", "--output", required=True, help="The file to write.")
@_fail_cleanly
def rerank_weights(features_dat, start, tuned, output):
    """Between the extractor's FEATURES_DAT (its header names the dense values) and named
    weights: --start INI writes mert's init.opt (a feature INI lacks starts at 0); --tuned
    WEIGHTS writes the Name= w lines that nbest --weights reads. docs/moses.md: re-ranking by hand.
    """
    from phrasescore.jobs.tuning.ab_rerank import rerank_weights as run_rerank_weights

    _echo(run_rerank_weights(features_dat, output, start=start, tuned=tuned), err=True)


@cli.command("rerank-tune", short_help="Tune re-ranking weights on a scored dev n-best list.")
@click.argument("nbest_path", metavar="DEV_NBEST")
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
@click.option("--workdir", help="Keep the tools' files here (default: a temporary directory).")
@click.option("-o", "--output", required=True, help="The Name= w weights file to write.")
@_fail_cleanly
def rerank_tune(nbest_path, reference, start, moses_home, tuner, runs, seed, restarts, workdir,
                output):  # fmt: skip
    """Tune the weights of every feature of DEV_NBEST (a Moses n-best list with the models'
    features, from one nbest call) on the fixed list with Moses' extractor and mert or kbmira,
    and write the Name= w lines that nbest --weights W --one-best applies to the test lists.
    docs/moses.md: re-ranking by hand.
    """
    from phrasescore.jobs.tuning.rerank_tune import TuneOptions
    from phrasescore.jobs.tuning.rerank_tune import rerank_tune as run_rerank_tune

    options = TuneOptions(tuner=tuner, runs=runs, seed=seed, restarts=restarts, workdir=workdir)
    result = run_rerank_tune(nbest_path, reference, output, start, moses_home, options)
    _echo(result, err=True)


@cli.command("ini-tables", short_help="List the phrase tables of a moses.ini.")
@click.argument("moses_ini")
@click.option("--factors", is_flag=True, help="Add INPUT_FACTORS and OUTPUT_FACTORS columns.")
@_fail_cleanly
def ini_tables(moses_ini, factors):
    """Print the phrase tables of MOSES_INI: NAME<TAB>CLASS<TAB>PATH<TAB>NUM_FEATURES per line.

    Paths are expanded and resolved relative to the ini's directory; '-' when a table has none.
    """
    from phrasescore.jobs.rescore.tables import ini_tables as run_ini_tables

    _echo(run_ini_tables(moses_ini, factors=factors))


@cli.command("check-table", short_help="Validate a Moses phrase table.")
@click.argument("table")
@_fail_cleanly
def check_table(table):
    """Read and validate a Moses phrase TABLE (plain or gzip, - for stdin) in one pass."""
    from phrasescore.jobs.rescore.tables import check_table as run_check_table

    run_check_table(table)


@cli.command("copy-table", short_help="Copy a phrase table through the reader and writer.")
@click.argument("table")
@click.option("-o", "--output", required=True, help="Table to write (.gz: gzip; -: stdout).")
@_fail_cleanly
def copy_table(table, output):
    """Copy a phrase TABLE through phrasescore's reader and writer (validating it)."""
    from phrasescore.jobs.rescore.tables import copy_table as run_copy_table

    run_copy_table(table, output)


# ---------------------------------------------------------------------------- MERT A/B
@cli.command(short_help="MERT A/B: does a new phrase-table column move BLEU?")
@click.option("--baseline", required=True, help="The baseline system's moses.ini.")
@click.option(
    "--candidate",
    "candidates",
    multiple=True,
    metavar="[NAME=]INI",
    help="A candidate system's moses.ini (e.g. what rescore --moses-ini wrote); repeatable.",
)
@click.option(
    "--rerank",
    multiple=True,
    metavar="[NAME=]MODEL[,MODEL]",
    help="Also re-rank every tuned run's n-best lists with this sentence model's log p "
    "(feature NAME, default RNNEncDec0, 1, ...), weights tuned on the dev lists with Moses' "
    "extractor and mert: one more system per system, SYSTEM+rerank; repeatable. Several "
    "comma-separated models: one feature, their ensemble.",
)
@click.option(
    "--rerank-inverse",
    multiple=True,
    metavar="[NAME=]MODEL[,MODEL]",
    help="As --rerank, with a target->source model: the feature is log p(source | hypothesis) "
    "(default name RNNEncDecInv0, 1, ...); repeatable, together with --rerank.",
)
@click.option(
    "--rerank-system",
    "rerank_systems",
    multiple=True,
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
    "--dev", nargs=2, required=True, metavar="SRC REF", help="Tuning set (tokenised as the system)."
)
@click.option(
    "--test", "tests", nargs=3, multiple=True, metavar="NAME SRC REF", help="Test set; repeatable."
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
    type=RegistryChoice(_bleu_tokenizers),
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
@_fail_cleanly
def ab(
    baseline,
    candidates,
    rerank,
    rerank_inverse,
    rerank_systems,
    dev,
    tests,
    workdir,
    moses_home,
    seeds,
    **settings,
):
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
    report = run_ab(
        baseline,
        list(candidates),
        tuple(dev),
        [tuple(t) for t in tests],
        workdir,
        moses_home=moses_home,
        options=ComparisonOptions(
            seeds=seed_list, rerank_systems=tuple(rerank_systems) or None, **settings
        ),
        rerank=list(rerank),
        rerank_inverse=list(rerank_inverse),
    )
    _echo(report)


# ---------------------------------------------------------------------------- bin/ scripts
@cli.command("check-outputs", hidden=True)
@click.option("-i", "--input", "inputs", nargs=2, multiple=True, metavar="ROLE PATH")
@click.option("-o", "--output", "outputs", nargs=2, multiple=True, metavar="ROLE PATH")
@click.option(
    "--model", "models", nargs=2, multiple=True, metavar="ROLE PATH", help="A model to train."
)
@click.option("--workdir", "workdirs", nargs=2, multiple=True, metavar="ROLE DIR")
@click.option("--prog", default="phrasescore", help="The name the error line starts with.")
def check_outputs(inputs, outputs, models, workdirs, prog):
    """For the bin/ scripts, before any work: a file a script writes (``-o``; ``--model``: a
    model that ``train`` writes, with the files beside it) that is one of its inputs, or a work
    folder (``--workdir``) that holds one, is refused in one line, exit 1
    (:func:`~phrasescore.jobs.script_outputs.check_script_outputs`)."""
    from phrasescore.jobs.script_outputs import check_script_outputs

    try:
        check_script_outputs(inputs, outputs, models, workdirs)
    except InputError as exc:
        click.echo(f"{prog}: error: {exc}", err=True)
        sys.exit(EXIT_INPUT_ERROR)


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
        _drop_unwritten_stdout()
        sys.exit(EXIT_INPUT_ERROR)


# -- recipe: the README's recipe as one resumable command ----------------------------------------
@cli.command(short_help="The whole recipe over a Moses system, each step run only when needed.")
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
@click.option("--jobs", type=POSITIVE, help="Steps at once (default: one per GPU, else core).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="Default: cuda if a GPU.")
@click.option("--minutes", type=POSITIVE_FLOAT, help="Time cap per model (train-recipe's).")
@click.option("--patience", type=POSITIVE, help="Validations without a new best (default 2).")
@click.option("--nbest-size", type=POSITIVE, default=100, show_default=True, help="N-best size.")
@click.option("--mert-iterations", type=POSITIVE, help="MERT's iterations (default: its own).")
@click.option("--runs", type=POSITIVE, default=3, show_default=True, help="rerank-tune --runs.")
@click.option("--seed", type=int, default=1, show_default=True, help="MERT's and rerank-tune's.")
@click.option("--dry-run", is_flag=True, help="Print the plan (each step, why it runs) only.")
@click.argument("train_flags", nargs=-1, metavar="[-- TRAIN_FLAGS]")
@_fail_cleanly
def recipe(dry_run, train_flags, **options):
    """From a Moses system to the re-ranked test BLEU: the five models, the column and its
    MERT, the tuned system's n-best lists and their scores, the re-ranking weights, the test
    BLEU before and after. A step runs only when its outputs are missing or older than its
    inputs or its settings changed: a killed or changed run resumes where it must. Steps after
    the column need Moses; without it they are reported as skipped. TRAIN_FLAGS after -- go to
    every `phrasescore train` (e.g. -- --max-steps 50 --seed 1)."""
    from phrasescore.jobs.recipe.recipe import RecipeOptions, run_recipe

    _echo(run_recipe(RecipeOptions(train_flags=tuple(train_flags), **options), dry_run=dry_run))
