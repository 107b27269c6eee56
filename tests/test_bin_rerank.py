"""bin/phrasescore-rerank, run as a user would: the chain n-best lists ->
one ``nbest`` with every model -> ``rerank-tune`` on dev -> applied on test, with BLEU before and
after. The runs with Moses skip without MOSES_HOME."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .test_moses_integration import SYSTEM, moses_system  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bin" / "phrasescore-rerank"
EXAMPLES = ROOT / "examples"
MOSES_HOME = os.environ.get("MOSES_HOME")
needs_moses = pytest.mark.skipif(
    not MOSES_HOME or not Path(MOSES_HOME, "bin", "moses").is_file(),
    reason="needs a Moses build: set MOSES_HOME (bin/moses, extractor, mert, lmplz)",
)
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run_script(*args, cwd, moses_home=None):
    env = {k: v for k, v in os.environ.items() if k not in ("MOSES", "MOSES_HOME")}
    env["PATH"] = "/usr/bin:/bin"
    env["PHRASESCORE"] = f"{sys.executable} -m phrasescore"
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    if moses_home:
        env["MOSES_HOME"] = str(moses_home)
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env
    )


def test_help_and_strict_bash(tmp_path):
    done = run_script("--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("usage: phrasescore-rerank")
    assert os.access(SCRIPT, os.X_OK)
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text


@pytest.mark.parametrize(
    "args, code, message",
    [
        ([], 2, "expected MOSES_INI DEV_SRC DEV_REF TEST_SRC TEST_REF, got 0"),
        (["a", "b", "c", "d", "e"], 2, "give at least one -m NAME=MODEL"),
        (["a", "b", "c", "d", "e", "-m", "X=m", "--runs", "0"], 2, "--runs needs a positive"),
        (["a", "b", "c", "d", "e", "-m", "X=m"], 1, "no such file: a"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, args, code, message):
    done = run_script(*args, cwd=tmp_path)
    assert done.returncode == code
    [line] = done.stderr.splitlines()
    assert line.startswith("phrasescore-rerank: error: ") and message in line
    assert list(tmp_path.iterdir()) == []


def test_without_moses_one_line_before_any_work(tmp_path):
    files = [tmp_path / name for name in ("moses.ini", "d.en", "d.fr", "t.en", "t.fr")]
    for path in files:
        path.write_text("x\n")
    done = run_script(*files, "-m", "X=m", cwd=tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert "Moses not found: set MOSES_HOME" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in files)


@pytest.mark.parametrize(
    "where, message",
    [
        ("work/test.reranked.out", "test re-ranked 1-best work/test.reranked.out is the TEST_REF"),
        ("work/.dev.scored.nbest.lock", "is the TEST_REF (work/.dev.scored.nbest.lock)"),
        ("work/tune/t.fr", "WORKDIR/tune work/tune holds the TEST_REF (work/tune/t.fr)"),
    ],
)
def test_an_input_where_the_chain_writes_is_refused_before_any_work(tmp_path, where, message):
    """An input where the chain writes (TEST_REF at WORKDIR/test.reranked.out, or inside a
    folder the chain fills) gets one error line and exit 1 before any work: the re-ranked output
    would replace the reference and the report would score it against itself (BLEU 100.00)."""
    files = [tmp_path / name for name in ("moses.ini", "d.en", "d.fr", "t.en")]
    for path in files:
        path.write_text("x\n")
    test_ref = tmp_path / where
    test_ref.parent.mkdir(parents=True, exist_ok=True)
    test_ref.write_text("the reference\n")
    done = run_script(*files, where, "-m", "X=m", "--workdir", "work", cwd=tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("phrasescore-rerank: error: ") and message in line, line
    assert test_ref.read_text() == "the reference\n"
    assert [p.name for p in (tmp_path / "work").rglob("*")] == [
        p.name for p in test_ref.relative_to(tmp_path / "work").parents if p.name
    ][::-1] + [test_ref.name]


def test_a_link_to_an_input_in_the_tuning_folder_is_refused_before_any_work(tmp_path):
    """rerank-tune's extractor writes WORKDIR/tune/scores.dat: a link there to DEV_REF had the
    reference replaced by its statistics."""
    files = [tmp_path / name for name in ("moses.ini", "d.en", "d.fr", "t.en", "t.fr")]
    for path in files:
        path.write_text("x\n")
    (tmp_path / "work" / "tune").mkdir(parents=True)
    (tmp_path / "work" / "tune" / "scores.dat").symlink_to("../../d.fr")
    done = run_script(*files, "-m", "X=m", "--workdir", "work", cwd=tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line == (
        "phrasescore-rerank: error: WORKDIR/tune work/tune holds the DEV_REF "
        f"({tmp_path}/d.fr): the tools write their files there under their own names and would "
        "overwrite it; give a folder of its own"
    ), line
    assert (tmp_path / "d.fr").read_text() == "x\n"


def head_list(source: Path, out: Path, sentences: int) -> Path:
    """The hypotheses of the first ``sentences`` ids of a shipped list."""
    with gzip.open(source, "rt", encoding="utf-8") as lines:
        kept = [line for line in lines if int(line.split(" |||", 1)[0]) < sentences]
    out.write_text("".join(kept), encoding="utf-8")
    return out


def head_lines(source: Path, out: Path, lines: int) -> Path:
    with gzip.open(source, "rt", encoding="utf-8") as text:
        out.write_text("".join(text.readlines()[:lines]), encoding="utf-8")
    return out


def report_bleus(stdout: str) -> dict[str, tuple[float, float]]:
    return {
        name: (float(before), float(after))
        for name, before, after in re.findall(
            r"  (dev|test) BLEU\s+before (\S+)\s+after (\S+)", stdout
        )
    }


@needs_moses
def test_the_chain_on_the_shipped_lists(tmp_path, tiny_model_path, tiny_inverse_model_path):
    """The shipped Multi30k lists (30 dev and 30 test sentences) given: the report's dev
    BLEU after re-ranking is rerank-tune's, and the outputs are the lists' hypotheses."""
    corpus = EXAMPLES / "corpus"
    files = {
        "dev.en": head_lines(corpus / "val.tok.lc.en.gz", tmp_path / "dev.en", 30),
        "dev.fr": head_lines(corpus / "val.tok.lc.fr.gz", tmp_path / "dev.fr", 30),
        "test.en": head_lines(corpus / "test_2016_flickr.tok.lc.en.gz", tmp_path / "test.en", 30),
        "test.fr": head_lines(corpus / "test_2016_flickr.tok.lc.fr.gz", tmp_path / "test.fr", 30),
    }
    dev = head_list(EXAMPLES / "nbest" / "dev.100best.nbest.gz", tmp_path / "dev.nbest", 30)
    test = head_list(EXAMPLES / "nbest" / "test.100best.nbest.gz", tmp_path / "test.nbest", 30)
    done = run_script(
        EXAMPLES / "nbest" / "tuned.ini", files["dev.en"], files["dev.fr"], files["test.en"],
        files["test.fr"], "--dev-nbest", dev, "--test-nbest", test,
        "-m", f"L2R={tiny_model_path}", "--inverse-model", f"Inv={tiny_inverse_model_path}",
        "--runs", "2", "--workdir", "work", cwd=tmp_path, moses_home=MOSES_HOME,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    bleus = report_bleus(done.stdout)
    assert set(bleus) == {"dev", "test"}
    kept = re.search(r"seed \d+: dev BLEU (\S+)  <- kept", done.stderr).group(1)
    assert bleus["dev"][1] == pytest.approx(float(kept), abs=0.01)
    assert bleus["dev"][1] >= bleus["dev"][0] - 0.01  # tuned on dev from the system's weights
    work = tmp_path / "work"
    weights = (work / "rerank.weights").read_text()
    assert re.search(r"^L2R= ", weights, re.M) and re.search(r"^Inv= ", weights, re.M)
    hypotheses: dict[int, set[str]] = {}
    for line in test.read_text(encoding="utf-8").splitlines():
        fields = line.split(" ||| ")
        hypotheses.setdefault(int(fields[0]), set()).add(fields[1].strip())
    out = (work / "test.reranked.out").read_text(encoding="utf-8").splitlines()
    assert len(out) == 30 and all(line in hypotheses[i] for i, line in enumerate(out))


@needs_moses
def test_the_chain_decodes_with_moses(tmp_path, moses_system, tiny_model_path):  # noqa: F811
    """No lists given: moses writes them from the ini (the small test system)."""
    done = run_script(
        moses_system["baseline"], SYSTEM / "dev50.en", SYSTEM / "dev50.fr", SYSTEM / "test20.en",
        SYSTEM / "test20.fr", "-m", f"L2R={tiny_model_path}", "--nbest-size", "20",
        "--threads", "1", "--workdir", "work", cwd=tmp_path, moses_home=MOSES_HOME,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(report_bleus(done.stdout)) == {"dev", "test"}
    work = tmp_path / "work"
    ids = {int(line.split(" |||")[0]) for line in (work / "test.20best.nbest").open()}
    assert ids == set(range(20))
    assert len((work / "test.reranked.out").read_text().splitlines()) == 20
