"""Bad inputs of re-ranking by hand: ``rerank-weights`` and ``nbest
--weights`` refuse non-finite weights and feature values, duplicated kbmira weights and
unreadable files in one line naming file:line, exit 1, nothing under the output name."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from phrasescore.cli import cli

DATA = Path(__file__).parent / "data"
MERT = DATA / "nbest" / "mert"
LIST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
SOURCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"
INI = DATA / "moses" / "multi30k.moses.ini"


def fails_in_one_line(args: list, out: Path, where: str, message: str) -> None:
    """``phrasescore ARGS`` exits 1 with one error line ``where: ...message...``, no traceback,
    and leaves nothing under ``out`` (nor a temporary beside it)."""
    result = CliRunner().invoke(cli, ["-q", *map(str, args)])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.strip()]
    assert len(errors) == 1, result.output
    assert errors[0].startswith(f"phrasescore: error: {where}"), errors[0]
    assert message in errors[0], errors[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


def copy_with(tmp_path: Path, source: Path, name: str, edit) -> Path:
    path = tmp_path / name
    text = source.read_text(encoding="utf-8")
    path.write_text(edit(text), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- rerank-weights
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "1e999"])
def test_rerank_weights_refuses_a_non_finite_mert_weight(tmp_path, bad):
    tuned = copy_with(
        tmp_path, MERT / "weights.txt", "weights.txt", lambda t: t.replace("0.461622", bad)
    )
    out = tmp_path / "out" / "w.ini"
    out.parent.mkdir()
    args = ["rerank-weights", MERT / "features.dat", "--tuned", tuned, "-o", out]
    fails_in_one_line(args, out, f"{tuned}:1:", f"{bad!r} is not a finite number")


@pytest.mark.parametrize("bad", ["nan", "inf", "1e999"])
def test_rerank_weights_refuses_a_non_finite_kbmira_weight(tmp_path, bad):
    tuned = copy_with(
        tmp_path, MERT / "kbmira.out", "mira.out", lambda t: t.replace("F8 -1.0288", f"F8 {bad}")
    )
    out = tmp_path / "out" / "w.ini"
    out.parent.mkdir()
    args = ["rerank-weights", MERT / "features.dat", "--tuned", tuned, "-o", out]
    fails_in_one_line(args, out, f"{tuned}:9:", f"{bad!r} is not a finite number")


def test_rerank_weights_refuses_a_kbmira_weight_given_twice(tmp_path):
    tuned = copy_with(tmp_path, MERT / "kbmira.out", "mira.out", lambda t: t + "F3 0.5\n")
    out = tmp_path / "out" / "w.ini"
    out.parent.mkdir()
    args = ["rerank-weights", MERT / "features.dat", "--tuned", tuned, "-o", out]
    fails_in_one_line(args, out, f"{tuned}:15:", "F3 given twice (first on line 4)")


@pytest.mark.parametrize("bad", ["nan", "1e999"])
def test_rerank_weights_refuses_a_non_finite_start_weight(tmp_path, bad):
    ini = copy_with(tmp_path, INI, "moses.ini", lambda t: t.replace("LM0= 0.5", f"LM0= {bad}"))
    line = ini.read_text().splitlines().index(f"LM0= {bad}") + 1
    out = tmp_path / "out" / "init.opt"
    out.parent.mkdir()
    args = ["rerank-weights", MERT / "features.dat", "--start", ini, "-o", out]
    fails_in_one_line(args, out, f"{ini}:{line}:", f"{bad!r} is not a finite number")


@pytest.mark.parametrize("which", ["features", "tuned", "start"])
@pytest.mark.parametrize("problem", ["missing", "not UTF-8"])
def test_rerank_weights_unreadable_inputs_are_one_line(tmp_path, which, problem):
    files = {"features": MERT / "features.dat", "tuned": MERT / "weights.txt", "start": INI}
    bad = tmp_path / f"bad.{which}"
    if problem == "not UTF-8":
        bad.write_bytes(files[which].read_bytes()[:40] + b"\xff\xfe\n")
    files[which] = bad
    out = tmp_path / "out" / "w"
    out.parent.mkdir()
    option = ["--start", files["start"]] if which == "start" else ["--tuned", files["tuned"]]
    args = ["rerank-weights", files["features"], *option, "-o", out]
    line = files[which].read_bytes()[:40].count(b"\n") + 1 if problem != "missing" else 0
    where = f"{bad}:" if problem == "missing" else f"{bad}:{line}:"
    fails_in_one_line(args, out, where, "no such file" if problem == "missing" else "invalid UTF-8")


def test_rerank_weights_reads_gzipped_inputs_as_plain_ones(tmp_path):
    plain, zipped = tmp_path / "plain.ini", tmp_path / "zipped.ini"
    for name in ("features.dat", "weights.txt"):
        with gzip.open(tmp_path / f"{name}.gz", "wb") as out:
            out.write((MERT / name).read_bytes())
    runner = CliRunner()
    args = ["rerank-weights", MERT / "features.dat", "--tuned", MERT / "weights.txt", "-o", plain]
    assert runner.invoke(cli, list(map(str, args))).exit_code == 0
    args = ["rerank-weights", tmp_path / "features.dat.gz", "--tuned", tmp_path / "weights.txt.gz"]
    result = runner.invoke(cli, [*map(str, args), "-o", str(zipped)])
    assert result.exit_code == 0, result.output
    assert zipped.read_bytes() == plain.read_bytes()


# ---------------------------------------------------------------------------- nbest --weights
def weights_with(tmp_path, lm: str) -> Path:
    return copy_with(tmp_path, INI, "w.ini", lambda t: t.replace("LM0= 0.5", f"LM0= {lm}"))


FLAGS = [[], ["--one-best"], ["--workers", "2", "--chunk-lines", "100"],
         ["--workers", "2", "--one-best"]]  # fmt: skip


@pytest.mark.parametrize("flags", FLAGS, ids=" ".join)
@pytest.mark.parametrize("bad", ["nan", "inf", "1e999"])
def test_nbest_refuses_a_non_finite_weight(tmp_path, flags, bad):
    weights = weights_with(tmp_path, bad)
    line = weights.read_text().splitlines().index(f"LM0= {bad}") + 1
    out = tmp_path / "out" / "best"
    out.parent.mkdir()
    args = [
        "nbest",
        LIST,
        "--source",
        SOURCE,
        "--weights",
        weights,
        *flags,
        "-o",
        out,
        "--no-progress",
    ]
    fails_in_one_line(args, out, f"{weights}:{line}:", f"{bad!r} is not a finite number")


@pytest.mark.parametrize("flags", FLAGS, ids=" ".join)
@pytest.mark.parametrize("bad", ["nan", "inf", "-1e999"])
def test_nbest_refuses_a_non_finite_feature_value_when_it_reranks(tmp_path, flags, bad):
    lines = gzip.decompress(LIST.read_bytes()).decode().splitlines(keepends=True)
    lines[150] = re.sub(r" LM0= \S+", f" LM0= {bad}", lines[150], count=1)
    nbest = tmp_path / "list.nbest"
    nbest.write_text("".join(lines), encoding="utf-8")
    weights = tmp_path / "w.ini"
    shutil.copyfile(INI, weights)
    out = tmp_path / "out" / "best"
    out.parent.mkdir()
    args = [
        "nbest",
        nbest,
        "--source",
        SOURCE,
        "--weights",
        weights,
        *flags,
        "-o",
        out,
        "--no-progress",
    ]
    fails_in_one_line(args, out, f"{nbest}:151:", "feature LM0 has a value that is not finite")


def test_nbest_refuses_a_total_that_overflows(tmp_path):
    weights = weights_with(tmp_path, "1e308")
    out = tmp_path / "out" / "best"
    out.parent.mkdir()
    args = [
        "nbest",
        LIST,
        "--source",
        SOURCE,
        "--weights",
        weights,
        "--one-best",
        "-o",
        out,
        "--no-progress",
    ]
    fails_in_one_line(args, out, f"{LIST}:1:", "the weighted total is not finite")


# ---------------------------------------------------------------------------- work folders
REFERENCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.fr"


def _bytes_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


HELD = {  # case: (the input given in wd, its role, the file it is a copy of)
    "--reference wd/scores.dat": ("wd/scores.dat", "--reference", REFERENCE),
    "list wd/features.dat": ("wd/features.dat", "n-best list", None),
    "--start wd/mert-1234/init.opt": ("wd/mert-1234/init.opt", "--start", INI),
}


@pytest.mark.parametrize(
    "case", [*HELD, "a hard link of --reference in wd", "a symlink to --reference in wd"]
)
def test_rerank_tune_refuses_a_workdir_that_holds_an_input(tmp_path, monkeypatch, case):
    """A workdir that holds an input (by name or by a hard link) is refused in one line and
    every file left as it was: the extractor would replace ``--reference wd/scores.dat`` with
    its statistics and the list given as ``wd/features.dat`` with its features."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wd" / "mert-1234").mkdir(parents=True)
    inputs = {"n-best list": "list.nbest", "--reference": "ref.fr", "--start": "start.ini"}
    Path("list.nbest").write_bytes(gzip.decompress(LIST.read_bytes()))
    shutil.copy(REFERENCE, "ref.fr")
    shutil.copy(INI, "start.ini")
    if case in HELD:
        held, role, copy_of = HELD[case]
        if copy_of is None:
            Path(held).write_bytes(gzip.decompress(LIST.read_bytes()))
        else:
            shutil.copy(copy_of, held)
        inputs[role] = held
    elif case.startswith("a hard link"):  # the reference given by its own name
        role, held = "--reference", "ref.fr"
        os.link("ref.fr", "wd/scores.dat")
    else:  # where the extractor writes its statistics, a link to the reference
        role, held = "--reference", "ref.fr"
        os.symlink("../ref.fr", "wd/scores.dat")
    before = _bytes_of(tmp_path)
    args = ["rerank-tune", inputs["n-best list"], "--reference", inputs["--reference"]]
    args += ["--start", inputs["--start"], "--workdir", "wd", "-o", "w.txt"]
    message = f"--workdir wd holds the {role} ({held}): "
    fails_in_one_line(args, tmp_path / "w.txt", message, "give a folder of its own")
    assert _bytes_of(tmp_path) == before


@pytest.mark.parametrize("command", ["rerank-tune", "ab"])
def test_a_workdir_that_is_a_file_is_one_line(tmp_path, command):
    """A --workdir that is a file is one error line, not a FileExistsError traceback, and the
    file is kept."""
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    if command == "rerank-tune":
        args = ["rerank-tune", LIST, "--reference", REFERENCE, "--workdir", afile]
    else:
        args = ["ab", "--baseline", INI, "--rerank", MERT / "features.dat"]
        args += ["--dev", SOURCE, REFERENCE, "--workdir", afile]
    out = tmp_path / "w.txt"
    fails_in_one_line(
        [*args, *(["-o", out] if command == "rerank-tune" else [])],
        out,
        f"{afile}: is not a directory: give a directory for the --workdir",
        "",
    )
    assert afile.read_text() == "keep\n"


# ---------------------------------------------------------------------------- lists that do not fit
def _list_lines() -> list[str]:
    return gzip.decompress(LIST.read_bytes()).decode().splitlines(keepends=True)


def test_rerank_tune_refuses_a_list_without_features(tmp_path):
    """A list with an empty feature field is refused naming its first line, rather than tuned
    into an empty weights file."""
    nbest = tmp_path / "list.nbest"
    nbest.write_text("".join(re.sub(r" \|\|\| [^|]*\|\|\| (\S+)$", r" |||  ||| \1", line)
                             for line in _list_lines()))  # fmt: skip
    assert nbest.read_text().splitlines()[0].count(" |||  ||| ") == 1
    out = tmp_path / "w.txt"
    args = ["rerank-tune", nbest, "--reference", REFERENCE, "-o", out]
    fails_in_one_line(args, out, f"{nbest}:1: ", "no dense features (an empty feature field)")


def test_rerank_tune_refuses_a_reference_longer_than_the_list(tmp_path):
    """10 reference lines for ids 0-4 are refused in one line, as a shorter reference is: the
    weights would be tuned against the wrong sentences."""
    reference = tmp_path / "ref.fr"
    reference.write_text(REFERENCE.read_text() * 2)
    out = tmp_path / "w.txt"
    args = ["rerank-tune", LIST, "--reference", reference, "-o", out]
    fails_in_one_line(
        args,
        out,
        f"{LIST}: the n-best list ends with sentence id 4 (5 sentences) but the reference "
        f"{reference} has 10 lines",
        "the list and the reference do not match",
    )


@pytest.mark.parametrize("flags", [[], ["--one-best"]], ids=" ".join)
def test_nbest_warns_of_ids_without_hypotheses_and_keeps_the_lines_aligned(tmp_path, flags, caplog):
    """A list with ids 0, 2 and 4 of 5 source lines: one warning naming ids 1 and 3, and
    --one-best keeps its output aligned with the source (an empty line for each of them)."""
    nbest = tmp_path / "gap.nbest"
    nbest.write_text("".join(line for line in _list_lines() if line.split(" ||| ")[0] in "024"))
    out = tmp_path / "out"
    args = ["-q", "nbest", nbest, "--source", SOURCE, "--weights", INI, *flags, "-o", out]
    result = CliRunner().invoke(cli, [*map(str, args), "--no-progress"])
    assert result.exit_code == 0, result.output
    warning = [r.getMessage() for r in caplog.records if "no hypothesis" in r.getMessage()]
    assert warning == [
        f"{nbest}: 2 of 5 sentence ids have no hypothesis (id 1, 3): Moses lists "
        "every id; was the list filtered or cut?"
        + (" --one-best writes an empty line for each" if flags else "")
    ]
    if flags:
        best = out.read_text().split("\n")
        assert len(best) == 6 and best[1] == best[3] == "" and best[0] and best[2] and best[4]


# ---------------------------------------------------------------------------- what the tools read
@pytest.mark.parametrize("ending", ["\r\n", "\r"])
def test_rerank_tune_refuses_a_reference_with_carriage_returns(tmp_path, ending):
    """extractor counted the \\r of CRLF endings as part of the last word and tuned on other
    statistics than phrasescore's BLEU (which strips it), with nothing said."""
    lines = REFERENCE.read_text(encoding="utf-8").splitlines()
    reference = tmp_path / "ref.fr"
    if ending == "\r\n":
        reference.write_bytes("".join(line + "\r\n" for line in lines).encode())
        where = "ends with a carriage return (CRLF, Windows line endings)"
    else:  # a lone CR inside the second line
        lines[1] = lines[1].replace(" ", " \r", 1)
        reference.write_bytes("".join(line + "\n" for line in lines).encode())
        where = "holds a carriage return (\\r)"
    line = 1 if ending == "\r\n" else 2
    args = ["rerank-tune", LIST, "--reference", reference, "-o", tmp_path / "w.txt"]
    fails_in_one_line(
        args,
        tmp_path / "w.txt",
        f"{reference}:{line}: the reference line {where}",
        "Moses' extractor would read it as part of a word; convert the file",
    )


@pytest.mark.parametrize("piped", ["the n-best list", "--reference"])
def test_rerank_tune_refuses_a_pipe_it_would_read_twice(tmp_path, piped):
    """``<(cat ref)`` was read by phrasescore, then found empty by extractor, and the error
    blamed extractor or the features file."""
    plain_list = tmp_path / "list.nbest"
    plain_list.write_bytes(gzip.decompress(LIST.read_bytes()))
    out = tmp_path / "w.txt"
    nbest = '<(cat "$1")' if piped == "the n-best list" else '"$1"'
    reference = '<(cat "$2")' if piped == "--reference" else '"$2"'
    script = (
        f'{sys.executable} -m phrasescore -q rerank-tune {nbest} --reference {reference} -o "$3"'
    )
    done = subprocess.run(
        ["bash", "-c", script, "_", str(plain_list), str(REFERENCE), str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(
        rf"phrasescore: error: /dev/fd/\d+: {re.escape(piped)} is a pipe or standard input: "
        r"rerank-tune reads it more than once, and Moses' extractor reads it again; give a file "
        r"\(a \.gz is fine\)\n",
        done.stderr,
    ), done.stderr
    assert not out.exists()
