"""Phrase-table reading and writing (phrasescore.moses.phrase_table) and the table commands."""

from __future__ import annotations

import gzip
import logging
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from phrasescore.cli import cli
from phrasescore.errors import InputError
from phrasescore.moses.phrase_table import (
    PhraseTableWriter,
    check_phrase_table,
    copy_phrase_table,
    format_entry,
    format_probability,
    iter_source_groups,
    probability_from_logprob,
    read_phrase_table,
    write_phrase_table,
)

MOSES = Path(__file__).parent / "data" / "moses"
TABLES = [
    "tiny.phrase-table",
    "sparse.phrase-table.gz",
    "de-en.4scores.slice300.phrase-table.gz",
    "de-en.5scores.slice300.phrase-table.gz",
    "multimodel.slice300.phrase-table.gz",
    "multi30k.head300.phrase-table.gz",
]


def content(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def write(path: Path, data: bytes, compress: bool = False) -> str:
    path.write_bytes(gzip.compress(data, mtime=0) if compress else data)
    return str(path)


def first_lines(name: str, count: int = 1, new=()) -> list[str]:
    entries = list(read_phrase_table(str(MOSES / name)))[:count]
    return [format_entry(entry, new) for entry in entries]


# ----------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_round_trip_is_byte_identical(tmp_path, name, suffix):
    out = tmp_path / f"copy{suffix}"
    stats = copy_phrase_table(str(MOSES / name), str(out))
    assert content(out) == content(MOSES / name)
    assert stats.lines == content(MOSES / name).count(b"\n")
    assert (out.read_bytes()[:2] == b"\x1f\x8b") == (suffix == ".gz")


def test_round_trip_through_the_cli(tmp_path):
    out = tmp_path / "copy.gz"
    source = MOSES / "multi30k.head300.phrase-table.gz"
    result = CliRunner().invoke(cli, ["copy-table", str(source), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert content(out) == content(source)


def test_gzip_output_is_deterministic(tmp_path):
    source = str(MOSES / "de-en.4scores.slice300.phrase-table.gz")
    copy_phrase_table(source, str(tmp_path / "a.gz"))
    copy_phrase_table(source, str(tmp_path / "b.gz"))
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()


# ----------------------------------------------------------------------------- new columns
def test_one_and_two_new_columns_modern_4_scores():
    name = "multi30k.head300.phrase-table.gz"
    assert first_lines(name, new=["0.5"]) == [
        "! &quot; ||| ! &quot; ||| 0.714286 0.634311 1 0.742825 0.5 ||| 0-0 1-1 ||| 7 5 5 ||| |||\n"
    ]
    assert first_lines(name, new=["0.5", "1e-05"]) == [
        "! &quot; ||| ! &quot; ||| 0.714286 0.634311 1 0.742825 0.5 1e-05 ||| 0-0 1-1 ||| 7 5 5"
        " ||| |||\n"
    ]
    assert first_lines("de-en.4scores.slice300.phrase-table.gz", new=["0.25"]) == [
        ". ||| wasn &apos;t there . ||| 0.0909091 0.957188 1.28213e-06 7.89929e-10 0.25 ||| 0-3"
        " ||| 22 1.5599e+06 2 ||| |||\n"
    ]


def test_one_and_two_new_columns_old_5_scores():
    name = "de-en.5scores.slice300.phrase-table.gz"
    assert first_lines(name, new=["0.5"]) == [
        "auf Demokratie ||| for democracy ||| 1 0.0833333 1 0.0588235 2.718 0.5 ||| 0-0 1-1 ||| 1 1\n"
    ]
    assert first_lines(name, new=["0.5", "0.125"]) == [
        "auf Demokratie ||| for democracy ||| 1 0.0833333 1 0.0588235 2.718 0.5 0.125 ||| 0-0 1-1"
        " ||| 1 1\n"
    ]
    assert first_lines("multimodel.slice300.phrase-table.gz", new=["1"]) == [
        "haben geschlossen ||| 're not operating ||| 1 0.108349 0.5 0.0014808 1 ||| 1-0 1-1 0-2 1-2"
        " ||| 1 2 1\n"
    ]


def test_new_columns_keep_sparse_field_and_trailing_fields():
    assert first_lines("sparse.phrase-table.gz", 2, new=["0.5"]) == [
        "a ||| me ||| 0.1 0.2 0.1 0.2 2.7 0.5 ||| ||| ||| sp 2\n",
        "b ||| you ||| 0.4 0.5 0.1 0.6 2.7 0.5 ||| ||| ||| so 8\n",
    ]
    assert first_lines("tiny.phrase-table", 3, new=["0.5", "0.75"]) == [
        "ad ||| af ||| 0.3 0.3 0.3 0.3 0.115771 0.35574 0.472359 0.469238 0.5 0.75 ||| 0-0"
        " ||| 25362.6029089 1074.23173673 ||| sparse_feature 1\n",
        "bd ||| bf ||| 0.3 0.3 0.3 0.3 0.115771 0.35574 0.472359 0.469238 0.5 0.75 ||| 0-0"
        " ||| 253.626029089 10.7423173673 ||| \n",
        "der gipfel ||| sommet ||| 0.3 0.3 0.3 0.3 0.00327135 0.00686984 0.0366795 0.617135 0.5"
        " 0.75 ||| 1-0 ||| 5808.0 518.0\n",
    ]


def test_properties_field_and_three_field_lines(tmp_path):
    path = write(
        tmp_path / "t",
        b"a ||| b ||| 0.5 0.25 ||| 0-0 ||| 1 1 1 ||| ||| {{Tree [X a]}}\nc ||| d ||| 0.5 0.25\n",
    )
    entries = list(read_phrase_table(path))
    assert entries[0].tail == " 0-0 ||| 1 1 1 ||| ||| {{Tree [X a]}}"
    assert entries[1].tail is None
    assert [format_entry(e, ["0.1"]) for e in entries] == [
        "a ||| b ||| 0.5 0.25 0.1 ||| 0-0 ||| 1 1 1 ||| ||| {{Tree [X a]}}\n",
        "c ||| d ||| 0.5 0.25 0.1\n",
    ]


def test_fields_are_split_and_stripped_as_moses_does(tmp_path):
    path = write(tmp_path / "t", "a  b |||\tc é\t||| 0.5\t 0.25  |||  0-0 1-1 |||\n".encode())
    (entry,) = read_phrase_table(path)
    assert (entry.source, entry.target, entry.scores) == ("a  b", "c é", ["0.5", "0.25"])
    assert entry.tail == "  0-0 1-1 |||"
    assert format_entry(entry) == "a  b ||| c é ||| 0.5 0.25 |||  0-0 1-1 |||\n"


def test_non_breaking_space_is_part_of_a_phrase(tmp_path):
    # Moses strips spaces and tabs only; Python's str.strip() would also eat U+00A0.
    path = write(tmp_path / "t", "\u00a0a ||| b\u00a0 ||| 0.5\n".encode())
    (entry,) = read_phrase_table(path)
    assert (entry.source, entry.target) == ("\u00a0a", "b\u00a0")


# ----------------------------------------------------------------------------- line endings
def test_crlf_is_kept_and_never_part_of_a_score(tmp_path):
    data = b"a ||| b ||| 0.5 0.25 ||| 0-0\r\nc ||| d ||| 0.5 0.25\r\n"
    path = write(tmp_path / "t", data)
    entries = list(read_phrase_table(path))
    assert [e.newline for e in entries] == ["\r\n", "\r\n"]
    assert entries[0].tail == " 0-0"
    assert entries[1].scores == ["0.5", "0.25"]
    assert [format_entry(e, ["0.125"]) for e in entries] == [
        "a ||| b ||| 0.5 0.25 0.125 ||| 0-0\r\n",
        "c ||| d ||| 0.5 0.25 0.125\r\n",
    ]
    out = tmp_path / "out"
    copy_phrase_table(path, str(out))
    assert out.read_bytes() == data


def test_missing_final_newline_is_added(tmp_path):
    path = write(tmp_path / "t", b"a ||| b ||| 0.5\nc ||| d ||| 0.25")
    entries = list(read_phrase_table(path))
    assert entries[-1].newline == ""
    assert format_entry(entries[-1], ["1"]) == "c ||| d ||| 0.25 1\n"
    out = tmp_path / "out.gz"
    copy_phrase_table(path, str(out))
    assert content(out) == b"a ||| b ||| 0.5\nc ||| d ||| 0.25\n"


# ----------------------------------------------------------------------------- bad input
BAD_TABLES = [
    pytest.param(
        b"a ||| b ||| 0.5\nc ||| d\n",
        2,
        "expected at least 3 fields separated by '|||' (source ||| target ||| scores), found 2",
        id="fewer-than-3-fields",
    ),
    pytest.param(
        b"a ||| b ||| 0.1 0.2 0.3 0.4\nc ||| d ||| 0.1 0.2 0.3\n",
        2,
        "expected 4 scores (as on line 1), found 3",
        id="score-count-differs",
    ),
    pytest.param(b"a ||| b |||\n", 1, "no scores: the third field is empty", id="no-scores"),
    pytest.param(
        b"a ||| b ||| 0.5 0.5\nc ||| d ||| 0.5 abc\n",
        2,
        "score 2 is not a number: 'abc'",
        id="non-numeric",
    ),
    pytest.param(
        b"a ||| b ||| 1_0\n",
        1,
        "score 1 is not a number: '1_0' (write it without '_')",
        id="underscore",
    ),
    pytest.param(
        "a ||| b ||| 0.5 \u0660.\u0665\n".encode(),
        1,
        "score 2 is not a number: '\u0660.\u0665' (Moses reads ASCII digits only)",
        id="arabic-indic-digits",
    ),
    pytest.param(
        "a ||| b ||| 0.5 0.5\nc ||| d ||| \uff15 0.5\n".encode(),
        2,
        "score 1 is not a number: '\uff15' (Moses reads ASCII digits only)",
        id="fullwidth-digit",
    ),
    pytest.param(
        b"a ||| b ||| 0.5 1e-400\n",
        1,
        "score 2 is 1e-400: too small for a number, it would be read as 0 (the smallest is "
        "4.9e-324)",
        id="underflow-to-zero",
    ),
    pytest.param(b"a ||| b ||| 0x1p-1\n", 1, "score 1 is not a number: '0x1p-1'", id="hex"),
    pytest.param(b"a ||| b ||| 0.5 nan\n", 1, "score 2 is not a finite number: 'nan'", id="nan"),
    pytest.param(b"a ||| b ||| inf 0.5\n", 1, "score 1 is not a finite number: 'inf'", id="inf"),
    pytest.param(
        b"a ||| b ||| 0.5 0.5\nc ||| d ||| 0.5 1e999\n",
        2,
        "score 2 is 1e999: beyond the largest number a float holds (1.8e308), it would be "
        "infinity; phrase-table scores must be finite",
        id="overflow-to-inf",
    ),
    pytest.param(
        b"a ||| b ||| 0.5 -1E400\n",
        1,
        "score 2 is -1E400: beyond the largest number a float holds (1.8e308), it would be "
        "infinity; phrase-table scores must be finite",
        id="overflow-to-minus-inf",
    ),
    pytest.param(
        b"a ||| b ||| 0.5 0.5\nc ||| d ||| 0.5 0\n",
        2,
        "score 2 is 0: Moses takes ln of every score, so 0 becomes -100 (ln 0, floored); "
        "phrase-table scores must be > 0",
        id="zero",
    ),
    pytest.param(
        b"a ||| b ||| 0.5 -0.25\n",
        1,
        "score 2 is -0.25: Moses takes ln of every score and ln of a negative number is NaN; "
        "phrase-table scores must be > 0",
        id="negative",
    ),
    pytest.param(b"a ||| b ||| 0.5\n ||| d ||| 0.5\n", 2, "empty source phrase", id="no-source"),
    pytest.param(b"a ||| \t ||| 0.5\n", 1, "empty target phrase", id="no-target"),
    pytest.param(
        b"a ||| b ||| 0.5\n\xff ||| d ||| 0.5\n", 2, "invalid UTF-8 at byte 0", id="bad-utf8"
    ),
]


@pytest.mark.parametrize("data, line, message", BAD_TABLES)
def test_bad_table_is_refused_with_file_and_line(tmp_path, data, line, message):
    path = write(tmp_path / "bad.phrase-table", data)
    with pytest.raises(InputError) as info:
        list(read_phrase_table(path))
    assert str(info.value) == f"{path}:{line}: {message}"


@pytest.mark.parametrize("data, line, message", BAD_TABLES)
def test_bad_table_through_the_cli(tmp_path, data, line, message):
    path = write(tmp_path / "bad.phrase-table.gz", data, compress=True)
    out = tmp_path / "out" / "new.gz"
    out.parent.mkdir()
    result = CliRunner().invoke(cli, ["copy-table", path, "-o", str(out)])
    assert result.exit_code == 1
    assert result.stderr == f"phrasescore: error: {path}:{line}: {message}\n"
    assert "Traceback" not in result.output
    assert list(out.parent.iterdir()) == []


def gzip_of_many_lines() -> bytes:
    lines = "".join(f"w{i} ||| m{i} ||| 0.5 0.{i % 9 + 1}\n" for i in range(3000))
    return gzip.compress(lines.encode(), mtime=0)


@pytest.mark.parametrize("damage", ["truncated", "bad-crc", "bad-block", "garbage"])
def test_broken_gzip_is_refused(tmp_path, damage):
    data = bytearray(gzip_of_many_lines())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "bad-crc":
        data[-8] ^= 0xFF
    elif damage == "bad-block":
        data[10] = 0xFF  # first deflate block header: reserved block type
    else:
        data[len(data) // 2 : len(data) // 2 + 8] = b"\x00\xff" * 4
    path = tmp_path / "broken.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as info:
        list(read_phrase_table(str(path)))
    assert info.value.path == str(path) and info.value.line >= 1
    if damage != "garbage":  # garbage may first decompress into a malformed line
        assert "corrupt or truncated gzip stream" in info.value.message

    out = tmp_path / "out.gz"
    result = CliRunner().invoke(cli, ["copy-table", str(path), "-o", str(out)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"phrasescore: error: {path}:")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.gz"]


def test_truncated_gzip_message_names_the_problem(tmp_path):
    data = gzip_of_many_lines()
    path = tmp_path / "t.gz"
    path.write_bytes(data[:-20])
    with pytest.raises(InputError, match="corrupt or truncated gzip stream"):
        list(read_phrase_table(str(path)))


def test_a_failed_copy_keeps_an_existing_output(tmp_path):
    out = tmp_path / "out"
    out.write_text("old\n")
    bad = write(tmp_path / "bad", b"a ||| b ||| 0.5\nc ||| d ||| 0\n")
    with pytest.raises(InputError):
        copy_phrase_table(bad, str(out))
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "out"]


def test_missing_file():
    with pytest.raises(InputError, match="no such file"):
        check_phrase_table("/nonexistent/phrase-table.gz")


def test_validate_false_skips_value_checks_only(tmp_path):
    path = write(tmp_path / "t", b"a ||| b ||| 0 -1\n")
    assert [e.scores for e in read_phrase_table(path, validate=False)] == [["0", "-1"]]
    short = write(tmp_path / "s", b"a ||| b\n")
    with pytest.raises(InputError, match="found 2"):
        list(read_phrase_table(short, validate=False))


def test_values_above_one_are_accepted(tmp_path):
    path = write(tmp_path / "t", b"a ||| b ||| 2.718 1e3 +0.5 5E-7\n")
    assert [e.scores for e in read_phrase_table(path)] == [["2.718", "1e3", "+0.5", "5E-7"]]


# ----------------------------------------------------------------------------- stdin / stdout
def test_stdin_to_stdout_through_the_cli():
    data = b"a ||| b ||| 0.5 ||| 0-0 ||| 1 1 1 ||| |||\n"
    result = CliRunner().invoke(cli, ["copy-table", "-", "-o", "-"], input=data)
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == data


def test_gzip_on_stdin_is_detected():
    data = b"a ||| b ||| 0.5\n"
    result = CliRunner().invoke(cli, ["copy-table", "-", "-o", "-"], input=gzip.compress(data))
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == data


def test_check_table_logs_counts(caplog):
    caplog.set_level(logging.INFO)
    table = MOSES / "multi30k.head300.phrase-table.gz"
    result = CliRunner().invoke(cli, ["check-table", str(table)])
    assert result.exit_code == 0, result.output
    assert "300 lines, 205 source phrases" in caplog.text
    assert "4 scores per line" in caplog.text


def test_check_table_refuses_a_bad_table(tmp_path):
    path = write(tmp_path / "t", b"a ||| b ||| 0.5\nc ||| d ||| 0.5 0.5\n")
    result = CliRunner().invoke(cli, ["check-table", path])
    assert result.exit_code == 1
    assert result.stderr == (
        f"phrasescore: error: {path}:2: expected 1 scores (as on line 1), found 2\n"
    )


# ----------------------------------------------------------------------------- groups, writer
def test_source_groups_are_consecutive_runs():
    entries = list(read_phrase_table(str(MOSES / "multi30k.head300.phrase-table.gz")))
    groups = list(iter_source_groups(entries))
    assert [e for g in groups for e in g] == entries
    assert all(len({e.source for e in g}) == 1 for g in groups)
    assert all(a[0].source != b[0].source for a, b in zip(groups, groups[1:], strict=False))
    assert len(groups) == check_phrase_table(str(MOSES / "multi30k.head300.phrase-table.gz"))[1]
    assert list(iter_source_groups([])) == []


def test_writer_adds_columns_and_is_atomic(tmp_path):
    entries = list(read_phrase_table(str(MOSES / "tiny.phrase-table")))
    out = tmp_path / "new.gz"
    count = write_phrase_table(str(out), ((e, [format_probability(0.5)]) for e in entries))
    assert count == len(entries)
    lines = content(out).decode().splitlines()
    assert all(line.split(" ||| ")[2].endswith(" 0.5") for line in lines)

    def failing():
        yield entries[0], ["0.5"]
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError):
        write_phrase_table(str(tmp_path / "never.gz"), failing())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.gz"]


def test_writer_counts_lines(tmp_path):
    with PhraseTableWriter(str(tmp_path / "t")) as out:
        for entry in read_phrase_table(str(MOSES / "sparse.phrase-table.gz")):
            out.write(entry)
    assert out.lines == 4


# ----------------------------------------------------------------------------- numbers
def test_format_probability_round_trips_exactly():
    rng = random.Random(1)
    for _ in range(2000):
        p = math.exp(-rng.uniform(0, 100))
        text = format_probability(p)
        assert float(text) == p
        assert len(text) <= 24
    assert format_probability(1.0) == "1"
    assert format_probability(0.5) == "0.5"
    assert format_probability(1e-05) == "1e-05"
    assert format_probability(math.exp(-100)) == "3.720075976020836e-44"


@pytest.mark.parametrize("bad", [0.0, -0.0, -0.5, 1.0000001, float("nan"), float("inf")])
def test_format_probability_refuses_values_outside_0_1(bad):
    with pytest.raises(ValueError):
        format_probability(bad)


def test_probability_from_logprob():
    assert probability_from_logprob(0.0) == 1.0
    assert probability_from_logprob(math.log(0.25)) == pytest.approx(0.25)
    assert probability_from_logprob(-1e9) == math.exp(-100)
    assert probability_from_logprob(float("-inf")) == math.exp(-100)
    assert probability_from_logprob(-50, floor=-10) == math.exp(-10)
    assert probability_from_logprob(-1e9) > 0
    assert probability_from_logprob(1e-7) == 1.0
    for bad in (float("nan"), 0.1, 2e-6):
        with pytest.raises(ValueError):
            probability_from_logprob(bad)


def test_whitespace_normalised_exactly_as_the_readme_says(tmp_path):
    # docs/commands.md (rescore, Output): spaces/tabs around the phrases and between scores become single
    # spaces, a missing final newline is added; spaces inside a phrase and the tail are kept.
    path = tmp_path / "pt"
    path.write_bytes(b"a  b \t|||\t c ||| 0.5\t 0.5  |||  0-0\t ||| x\na ||| b ||| 1 1")
    lines = [format_entry(e, ["0.25"]) for e in read_phrase_table(str(path))]
    assert lines == [
        "a  b ||| c ||| 0.5 0.5 0.25 |||  0-0\t ||| x\n",
        "a ||| b ||| 1 1 0.25\n",
    ]


def test_copy_table_is_refused_while_another_run_writes_its_output(tmp_path):
    """copy-table ignored another run's lock on -o, so whichever run ended last won."""
    from phrasescore.files.locks import output_lock

    table = write(tmp_path / "pt", b"a ||| b ||| 0.5\n")
    out = tmp_path / "copy.gz"
    with output_lock(str(out)):  # a live run of this process holds it
        done = subprocess.run(
            [sys.executable, "-m", "phrasescore", "copy-table", table, "-o", str(out)],
            capture_output=True,
            text=True,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"phrasescore: error: {out}: another run is writing this output (process {os.getpid()} "
        "holds its lock .copy.gz.lock): wait for it to end, or stop it\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["pt"]
