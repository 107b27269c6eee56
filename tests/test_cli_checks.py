"""Every command's arguments are checked before any work: numeric ranges, output locations and
devices give one line and an exit code, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from phrasescore.errors import InputError
from phrasescore.files.outputs import check_output_path
from phrasescore.hardware import resolve_device

from .conftest import DATA, run_cli

TABLE = DATA / "moses" / "tiny.phrase-table"
NBEST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
NBEST_SOURCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"


def one_line_error(proc, code: int) -> str:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


BAD_NUMBERS = [
    ("rescore", "T", "-m", "M", "--chunk-lines", "0"),
    ("rescore", "T", "-m", "M", "--chunk-lines", "-5"),
    ("rescore", "T", "-m", "M", "--batch-tokens", "0"),
    ("rescore", "T", "-m", "M", "--threads", "0"),
    ("train", "S", "T", "-o", "M", "--valid-every", "0"),
    ("train", "S", "T", "-o", "M", "--batch-tokens", "0"),
    ("train", "S", "T", "-o", "M", "--vocab-size", "-1"),
    ("train", "S", "T", "-o", "M", "--epochs", "0"),
    ("train", "S", "T", "-o", "M", "--lr", "-1"),
    ("train", "S", "T", "-o", "M", "--seed", "-3"),
    ("train-lm", "C", "-o", "M", "--order", "1"),
    ("train-lm", "C", "-o", "M", "--max-steps", "0"),
    ("nbest", "N", "--source", "S", "-m", "M", "--batch-tokens", "0"),
    ("translate", "I", "-m", "M", "--beam", "0"),
    ("translate", "I", "-m", "M", "--length-penalty", "-1"),
    ("sample", "a", "-m", "M", "-n", "-1"),
    ("sample", "a", "-m", "M", "--top", "0"),
    ("represent", "P", "-m", "M", "-o", "X", "--limit", "0"),
    ("compare", "T", "-m", "M", "--top", "0"),
    ("align", "S", "T", "-m", "M", "--batch-size", "0"),
]


@pytest.mark.parametrize("args", BAD_NUMBERS, ids=lambda a: " ".join(a[:1] + a[-2:]))
def test_numeric_options_are_range_checked(args, tmp_path):
    proc = run_cli(*args, cwd=tmp_path)
    stderr = one_line_error(proc, 2)
    assert f"Invalid value for '{args[-2]}'" in stderr or "Invalid value for" in stderr
    assert os.listdir(tmp_path) == []


def test_unknown_device_names_the_choices(tmp_path):
    proc = run_cli("rescore", TABLE, "-m", "M", "--device", "foo", cwd=tmp_path)
    assert "auto, cpu, cuda or cuda:N" in one_line_error(proc, 2)
    with pytest.raises(InputError, match="auto, cpu, cuda or cuda:N"):
        resolve_device("foo")


def _commands(tmp_path, model: str, out: str) -> dict[str, list]:
    """Each command that writes a file, writing it to ``out``."""
    src, tgt = str(NBEST_SOURCE), str(DATA / "nbest" / "multi30k.test2016.head5.tok.lc.fr")
    return {
        "rescore": ["rescore", TABLE, "-m", model, "-o", out],
        "copy-table": ["copy-table", TABLE, "-o", out],
        "nbest": ["nbest", NBEST, "--source", NBEST_SOURCE, "-m", model, "-o", out],
        "translate": ["translate", NBEST_SOURCE, "-m", model, "-o", out],
        "align": ["align", src, tgt, "-m", model, "-o", out],
        "train": ["train", src, tgt, "--preset", "tiny", "-o", out, "--max-steps", "1"],
        "train-lm": ["train-lm", tgt, "--preset", "tiny", "-o", out, "--max-steps", "1"],
    }


COMMANDS = ["rescore", "copy-table", "nbest", "translate", "align", "train", "train-lm"]


@pytest.mark.parametrize("command", COMMANDS)
def test_output_in_a_missing_directory_is_one_line(command, tmp_path, tiny_model_path):
    out = str(tmp_path / "no-such-dir" / "out.gz")
    proc = run_cli(*_commands(tmp_path, tiny_model_path, out)[command], cwd=tmp_path)
    stderr = one_line_error(proc, 1)
    assert stderr.strip() == f"phrasescore: error: {out}: {_what(command)} directory does not exist"


@pytest.mark.parametrize("command", COMMANDS)
def test_output_naming_a_directory_is_refused_before_any_work(command, tmp_path, tiny_model_path):
    out = tmp_path / "a-directory"
    out.mkdir()
    proc = run_cli(*_commands(tmp_path, tiny_model_path, str(out))[command], cwd=tmp_path)
    stderr = one_line_error(proc, 1)
    assert "is a directory: give a file name" in stderr
    assert sorted(os.listdir(tmp_path)) == ["a-directory"]  # no .partial or .tmp files
    assert os.listdir(out) == []


def _what(command: str) -> str:
    return {"rescore": "output table", "train": "model", "train-lm": "LM"}.get(command, "output")


def test_read_only_output_directory_is_one_line(tmp_path, tiny_model_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user (root?) can write in a 0555 directory")
        out = folder / "out.gz"
        for args in (
            ["rescore", TABLE, "-m", tiny_model_path, "-o", out],
            ["copy-table", TABLE, "-o", out],
        ):
            stderr = one_line_error(run_cli(*args), 1)
            assert "directory is not writable (permission denied)" in stderr
        assert os.listdir(folder) == []
    finally:
        folder.chmod(0o755)


def test_check_output_path(tmp_path):
    check_output_path("-")
    check_output_path(None)
    check_output_path(str(tmp_path / "new.gz"))
    check_output_path(str(tmp_path / "a" / "b" / "new.png"), create_dirs=True)
    with pytest.raises(InputError, match="does not exist"):
        check_output_path(str(tmp_path / "a" / "new.gz"))
    with pytest.raises(InputError, match="is a directory"):
        check_output_path(str(tmp_path))
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="does not exist"):
        check_output_path(str(tmp_path / "file" / "new.png"), create_dirs=True)


def test_top_level_help_shows_every_command_description_whole():
    proc = run_cli("--help")
    assert proc.returncode == 0
    listing = proc.stdout.split("Commands:", 1)[1].strip().splitlines()
    from phrasescore.cli import cli

    assert len(listing) == len([c for c in cli.commands.values() if not c.hidden])
    for line in listing:
        name, description = line.split(None, 1)
        assert description == cli.commands[name].short_help, line
        assert not description.endswith("...") and description[-1] in ".?", line


def test_train_help_documents_the_tiny_preset():
    proc = run_cli("train", "--help")
    help_text = " ".join(proc.stdout.split())
    assert "tiny (a seconds-long smoke test" in help_text


def _float_options():
    """(command, option) for every float option of every command, read from the click commands
    themselves: an option added later is covered without a change here."""
    import click

    from phrasescore.cli import cli

    found = []
    for name, command in sorted(cli.commands.items()):
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(
                param.type, click.types.FloatParamType
            ):
                found.append((name, max(param.opts, key=len)))
    return found


FLOAT_OPTIONS = _float_options()


def test_the_float_options_are_found():
    assert ("train", "--lr") in FLOAT_OPTIONS and ("rescore", "--weight") in FLOAT_OPTIONS
    assert len(FLOAT_OPTIONS) >= 12


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
@pytest.mark.parametrize("command, option", FLOAT_OPTIONS, ids=lambda x: x)
def test_every_float_option_refuses_non_finite_values_at_parse_time(command, option, value):
    """nan, inf and overflowing values are usage errors (exit 2) for every float option: click's
    FloatRange lets nan through every bound, and a non-finite --lr or --epochs would reach the
    training."""
    from click.testing import CliRunner

    from phrasescore.cli import cli

    result = CliRunner().invoke(cli, [command, f"{option}={value}"])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert f"{value!r} is not a finite number" in result.output


@pytest.mark.parametrize(
    "value, reason",
    [
        ("-0", "is a negative zero: give 0"),
        ("-0.0e3", "is a negative zero: give 0"),
        ("1_0", "is not a number: write it without '_'"),
        ("1e-400", "is too small for a number: it would be read as 0"),
        ("\u0665", "is not a number: write it in ASCII digits"),
    ],
)
@pytest.mark.parametrize("command, option", FLOAT_OPTIONS, ids=lambda x: x)
def test_every_float_option_refuses_what_python_reads_as_another_number(
    command, option, value, reason
):
    """-0, ``1_0`` and ``1e-400`` are usage errors naming the reason: Python reads them as -0
    (a weight -0 in moses.ini), 10 and 0."""
    from click.testing import CliRunner

    from phrasescore.cli import cli

    result = CliRunner().invoke(cli, [command, f"{option}={value}"])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': {value!r} {reason}" in result.output


@pytest.mark.parametrize("command", ["rescore", "merge-shards"])
def test_an_unbounded_float_option_shows_no_range_in_its_help(command):
    """``--weight``'s help showed ``FLOAT RANGE ... x<=None``."""
    from click.testing import CliRunner

    from phrasescore.cli import cli

    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # as wrapped for the terminal
    assert "--weight FLOAT Initial weight" in text and "[default: 0.2]" in text
    assert "None" not in text


def test_zero_and_small_numbers_are_still_numbers():
    from phrasescore.cli.options import FINITE_FLOAT, NON_NEGATIVE_FLOAT

    assert FINITE_FLOAT.convert("0", None, None) == 0.0
    assert FINITE_FLOAT.convert("0e-400", None, None) == 0.0
    assert FINITE_FLOAT.convert("-1e-300", None, None) == -1e-300
    assert NON_NEGATIVE_FLOAT.convert("0.000", None, None) == 0.0


@pytest.mark.parametrize(
    "args, option",
    [
        (["translate", "I", "-m", "M", "--bleu-tokenize", "bogus"], "--bleu-tokenize"),
        (["evaluate", "H", "R", "--tokenize", "bogus"], "--tokenize"),
        (["ab", "--bleu-tokenize", "bogus"], "--bleu-tokenize"),
    ],
    ids=["translate", "evaluate", "ab"],
)
def test_an_unknown_bleu_tokenizer_is_a_usage_error_before_any_work(args, option):
    """An unknown BLEU tokenizer is refused at parse time (exit 2), not after decoding."""
    from click.testing import CliRunner

    from phrasescore.cli import cli

    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': 'bogus' is not one of 'none', " in result.output
    assert "'13a'" in result.output


def test_sample_with_nothing_to_do_is_a_usage_error(tmp_path):
    """``sample -n 0`` without --beam is a usage error: exit 2, as the docs say of usage
    errors."""
    proc = run_cli("sample", "a dog", "-m", "M", "-n", "0", cwd=tmp_path)
    assert one_line_error(proc, 2).strip().splitlines()[-1] == (
        "Error: nothing to do: -n 0 without --beam"
    )


@pytest.mark.parametrize(
    "compress, name, tool",
    [("bz2", "bzip2", "bunzip2"), ("lzma", "xz", "unxz")],
    ids=["bzip2", "xz"],
)
def test_bzip2_and_xz_data_named_gz_are_named_for_what_they_are(tmp_path, compress, name, tool):
    """bzip2 or xz data under a .gz name (or on stdin) is named for what it is, with the tool
    that decompresses it, instead of being read as text and reported as invalid UTF-8."""
    import importlib

    data = importlib.import_module(compress).compress(b"a ||| b ||| 0.5\n")
    table = tmp_path / "phrase-table.gz"
    table.write_bytes(data)
    expected = (f"is {name} data, not gzip or plain text: decompress it first ({tool}), or "
                "recompress it with gzip")  # fmt: skip
    proc = run_cli("check-table", table)
    assert one_line_error(proc, 1).strip() == f"phrasescore: error: {table}: {expected}"
    proc = subprocess.run(
        [sys.executable, "-m", "phrasescore", "check-table", "-"], input=data, capture_output=True
    )
    assert proc.returncode == 1
    assert proc.stderr.decode().strip() == f"phrasescore: error: <stdin>: {expected}"


def test_take_hands_a_job_the_options_it_names_in_its_own_order_and_leaves_the_rest():
    from phrasescore.cli.options import take
    from phrasescore.jobs.rescore.rescore import RescoreOptions, run_rescore

    params = {"resume": True, "scoring": "exact", "table": "t.gz", "normalize": True}
    taken = take(params, RescoreOptions)
    assert list(taken.items()) == [("normalize", True), ("scoring", "exact")]
    assert params == {"resume": True, "table": "t.gz"}
    assert list(take(params, run_rescore)) == ["table", "resume"]
    assert params == {}


@pytest.mark.parametrize(
    "order", [["--layers", "2", "--no-reverse"], ["--no-reverse", "--layers", "2"]]
)
def test_lstm_options_of_another_architecture_name_layers_first_whatever_the_order(tmp_path, order):
    source, target = (DATA / "text" / f"multi30k-sample.tok.lc.{lang}.gz" for lang in ("en", "fr"))
    proc = run_cli("train", source, target, "-o", tmp_path / "m.st", "--preset", "tiny", *order)
    assert one_line_error(proc, 1).strip().splitlines()[-1] == (
        "phrasescore: error: --layers is an option of --arch lstm and transformer, not of --arch cho"
    )
    assert not (tmp_path / "m.st").exists()


@pytest.mark.parametrize(
    "command, option",
    [("rescore", "--io-workers"), ("rescore", "--workers"), ("nbest", "--workers")],
)
def test_a_number_of_processes_beyond_any_machine_is_a_usage_error(tmp_path, command, option):
    """``--io-workers 99999999999999999999`` went on to fork until os.pipe failed (``Too many
    open files``, a traceback and a .partial left)."""
    from click.testing import CliRunner

    from phrasescore.cli import cli

    table = tmp_path / "pt"
    table.write_text("a ||| b ||| 0.5\n")
    low = 0 if option == "--io-workers" else 1
    args = [command, str(table), "-m", str(tmp_path / "m"), "-o", str(tmp_path / "out")]
    if command == "nbest":
        args += ["--source", str(table)]
    result = CliRunner().invoke(cli, [*args, option, "99999999999999999999"])
    assert result.exit_code == 2, result.output
    assert (
        f"Invalid value for '{option}': 99999999999999999999 is not in the range {low}<=x<=256"
        in result.output
    )
    assert sorted(os.listdir(tmp_path)) == ["pt"]


def test_a_cuda_device_that_is_not_there_is_named_as_given():
    """``--device cuda:7`` said "--device cuda was asked for"; and on a machine with fewer
    devices the index is checked against their count."""
    import torch

    from phrasescore.errors import InputError
    from phrasescore.hardware import resolve_device

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(InputError) as info:
        resolve_device(f"cuda:{count + 7}")
    if count == 0:
        expected = f"--device cuda:{count + 7} was asked for, but PyTorch sees no CUDA device"
    else:
        expected = (
            f"--device cuda:{count + 7} was asked for, but PyTorch sees {count} CUDA device(s) "
            f"(cuda:0 to cuda:{count - 1})"
        )
    assert str(info.value) == expected
