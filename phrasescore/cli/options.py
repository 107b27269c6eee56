"""The option types and options that several commands share, and :func:`take`, which hands a
command's parsed options to its job by name.

An option is written once: in its decorator, under the name of the job's parameter or options
field it sets (click's third name, e.g. ``"-m", "--model", "model_paths"``), so that a command
passes what click parsed straight on (``RescoreOptions(**take(params, RescoreOptions))``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import click

from phrasescore.errors import InputError


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


def architectures():
    from phrasescore.model.config import ARCHITECTURES

    return ARCHITECTURES


def presets():
    from phrasescore.model.config import ARCH_PRESETS

    return dict.fromkeys(name for table in ARCH_PRESETS.values() for name in table)


def lm_presets():
    from phrasescore.model.config import LM_PRESETS

    return LM_PRESETS


def optimizers():
    from phrasescore.model.config import OPTIMIZERS

    return OPTIMIZERS


def bleu_tokenizers():
    from phrasescore.jobs.bleu import tokenizer_names

    return tokenizer_names()


def _set_threads(ctx, param, value):
    if value:
        from phrasescore.hardware import set_threads

        set_threads(value)
    return value


def as_list(ctx, param, value):
    """A repeated option's (or variadic argument's) values as the list a job takes (click gives
    a tuple)."""
    return list(value)


def none_if_empty(ctx, param, value):
    """A repeated option's values as a tuple, None when it was not given (a job's "every")."""
    return tuple(value) or None


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
"""Random seeds (numpy takes 0 .. 2^32 - 1)."""
MAX_PROCESSES = 256
"""The most ``--workers`` or ``--io-workers``: each is a forked process with its pipes, and
far more than a machine has cores fails on its limits (open files) instead of going faster."""
TUNED_WEIGHTS = click.Choice(["all", "new"])
"""Which re-ranking weights a tuning moves: all, or new (only the models', the decoder's MERT
weights kept): rerank-tune --tune, recipe --tune, ab --rerank-tune."""


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
            from phrasescore.moses.numbers import underflows

            if underflows(value.strip()):  # 1e-400: read as 0, not what was given
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
DROPOUT = FiniteFloat(min=0.0, max=1.0, max_open=True)
"""Finite, in [0, 1) (dropout rates)."""


def take(params: dict, *targets) -> dict:
    """Remove from ``params`` (a command's parsed options and arguments, by name) those that
    one of ``targets`` takes, a dataclass's fields or a function's named parameters, and return
    them in the targets' order (so that what a job does with them does not depend on the order
    the options were typed in).

    What is left in ``params`` goes to the job function itself (``job(**params)``), where a
    name it does not take is a TypeError: no option is dropped unread."""
    order: list[str] = []
    for target in targets:
        if dataclasses.is_dataclass(target):
            order += [field.name for field in dataclasses.fields(target)]
        else:
            order += [
                name
                for name, parameter in inspect.signature(target).parameters.items()
                if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
            ]
    return {name: params.pop(name) for name in dict.fromkeys(order) if name in params}


def options(*decorators):
    """One decorator applying ``decorators`` in the order written (first: highest in --help)."""

    def apply(func):
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


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
no_progress_option = click.option(
    "--no-progress",
    "progress",
    is_flag=True,
    flag_value=False,
    default=True,
    help="No progress bar.",
)
resume_option = click.option(
    "--resume", is_flag=True, help="Continue an interrupted run from its last chunk."
)
workers_option = click.option(
    "--workers",
    type=click.IntRange(1, MAX_PROCESSES),
    default=1,
    show_default=True,
    help="Score in this many processes of one thread each (CPU; same bytes as one process of one thread: --threads 1). "
    "One per core uses a multi-core CPU best (docs/scaling.md: Every core of one machine).",
)

gzip_level_option = click.option(
    "--gzip-level",
    type=click.IntRange(0, 9),
    default=1,
    show_default=True,
    help="Compression of a .gz output: 0-3 ISA-L's levels (fast), 4-9 zlib's (6: gzip's "
    "default, ~17x slower than 1, 28% smaller); docs/benchmarks.md: Table I/O.",
)

io_workers_option = click.option(
    "--io-workers",
    type=click.IntRange(0, MAX_PROCESSES),
    default=0,
    show_default=True,
    help="Processes that parse, look up ids and write while this one scores (for a GPU: one "
    "per core left; same bytes). Not with --workers.",
)


def model_option(help: str = "Model file."):
    """``-m/--model``: one model file, required."""
    return click.option("-m", "--model", "model_path", required=True, help=help)


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
ini_options = options(
    click.option("--moses-ini", help="Also write an updated moses.ini for the new table."),
    click.option("--ini-out", help="Where to write it (default: INI stem + .rescored.ini)."),
    click.option("--ini-table", help="Phrase-table feature name in the ini (default: by path)."),
    click.option(
        "--weight",
        type=FINITE_FLOAT,
        default=0.2,
        show_default=True,
        help="Initial weight of each new feature in the ini.",
    ),
)
"""``--moses-ini/--ini-out/--ini-table/--weight`` of rescore and merge-shards."""
text_options = options(
    click.option(
        "--tokenize", is_flag=True, help="Raw text: run the Moses tokenizer (sacremoses)."
    ),
    click.option("--lowercase", is_flag=True, help="Lowercase the text."),
)


def training_options(file: str, batch_help: str, epochs_type, epochs_help: str):
    """The options ``train`` and ``train-lm`` share, from --batch-tokens to --resume."""
    return options(
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
