"""``phrasescore translate``, ``evaluate`` and ``sample`` through the command line."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from sacremoses import MosesDetokenizer

from phrasescore.bundle import load_model
from phrasescore.cli import cli
from phrasescore.engine.scoring import PairScorer
from phrasescore.engine.search import Hypothesis
from phrasescore.jobs.analysis.translate import TranslateOptions, Translator
from phrasescore.moses.nbest import iter_nbest_groups, read_nbest

from .conftest import DATA, sample_pairs, write_lines

NBEST = DATA / "nbest"
REFERENCE = NBEST / "multi30k.test2016.head5.tok.lc.fr"
# The tiny test model is barely trained: by log p it prefers the empty sentence. A strong length
# bonus and a short limit make it write something, which is all these tests need.
WORDY = ["--length-penalty", "3", "--max-length", "8", "--no-progress"]


def invoke(*args: str, input: bytes | str | None = None):
    return CliRunner().invoke(cli, ["-q", *args], input=input)


@pytest.fixture
def source(tmp_path) -> tuple[str, list[str]]:
    """Six real sentences with an empty line (line 3) and a line of spaces (line 6)."""
    src, _ = sample_pairs(4)
    lines = src[:2] + [""] + src[2:4] + ["   "]
    return write_lines(tmp_path / "input.en", lines), lines


@pytest.fixture(scope="module")
def scorer(tiny_model_path):
    return PairScorer(load_model(tiny_model_path))


def test_one_line_per_input_line(tmp_path, tiny_model_path, source):
    path, lines = source
    result = invoke("translate", path, "-m", tiny_model_path, *WORDY)
    assert result.exit_code == 0, result.output
    out = result.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    for line, translation in zip(lines, out, strict=False):
        if not line.strip():
            assert translation == ""
    # the same from standard input, and into a gzip file
    piped = invoke("translate", "-", "-m", tiny_model_path, *WORDY, input=Path(path).read_bytes())
    assert piped.stdout == result.stdout
    gz = tmp_path / "out.fr.gz"
    assert invoke("translate", path, "-m", tiny_model_path, *WORDY, "-o", str(gz)).exit_code == 0
    assert gzip.decompress(gz.read_bytes()).decode() == result.stdout


def test_nbest_output_is_a_moses_list(tmp_path, tiny_model_path, source, scorer):
    path, lines = source
    out = tmp_path / "out.nbest"
    args = ["translate", path, "-m", tiny_model_path, "--beam", "4", "--nbest", "3", "-o", str(out)]
    assert invoke(*args, "--length-penalty", "0").exit_code == 0
    groups = list(iter_nbest_groups(read_nbest(str(out))))
    assert [g[0].id for g in groups] == list(range(len(lines)))
    for group, line in zip(groups, lines, strict=True):
        if not line.strip():
            assert [(e.hypothesis, e.features, e.total) for e in group] == [
                ("", " RNNEncDec0= 0 ", " 0")
            ]
            continue
        assert len(group) == 3 and len({e.hypothesis for e in group}) == 3
        features = [e.parsed_features() for e in group]
        assert all(len(f) == 1 and f[0][0] == "RNNEncDec0" for f in features)
        values = [f[0][1][0] for f in features]
        assert values == [float(e.total) for e in group]  # alpha 0: the total is log p
        assert values == sorted(values, reverse=True)
        scored = scorer.score_phrases([line] * 3, [e.hypothesis for e in group])
        assert list(scored.logprob) == pytest.approx(values, rel=1e-5, abs=1e-4)


def test_detokenizer_joins_and_unescapes(tiny_model_path):
    model = load_model(tiny_model_path)
    words = model.tgt_vocab.words
    apos = next(w for w in words if w.endswith("&apos;"))  # e.g. l&apos; or d&apos;
    noun = next(w for w in words if w.isalpha() and len(w) > 3)
    ids = tuple(model.tgt_vocab.encode([apos, noun, "."]))
    hyp = Hypothesis(ids, -1.0, -1.0)
    plain = Translator(model, TranslateOptions(), torch.device("cpu"))
    assert plain.text(hyp) == f"{apos} {noun} ."
    detok = Translator(model, TranslateOptions(detokenize=True), torch.device("cpu"))
    assert detok.text(hyp) == f"{apos[: -len('&apos;')]}'{noun}."


def test_detokenize(tiny_model_path, source):
    path, _ = source
    plain = invoke("translate", path, "-m", tiny_model_path, *WORDY).stdout.splitlines()
    detok = invoke("translate", path, "-m", tiny_model_path, *WORDY, "--detokenize")
    assert detok.exit_code == 0
    moses = MosesDetokenizer(lang="fr")
    assert detok.stdout.splitlines() == [moses.detokenize(t.split(), unescape=True) for t in plain]


def test_reference_prints_bleu_and_signature(tiny_model_path, source, tmp_path):
    path, lines = source
    reference = write_lines(tmp_path / "ref.fr", ["un homme ."] * len(lines))
    result = CliRunner().invoke(
        cli, ["translate", path, "-m", tiny_model_path, *WORDY, "--reference", reference]
    )
    assert result.exit_code == 0, result.output
    assert "BLEU = " in result.stderr and "chrF2 = " in result.stderr
    assert "BLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in result.stderr
    short = write_lines(tmp_path / "short.fr", ["un homme ."])
    result = invoke("translate", path, "-m", tiny_model_path, *WORDY, "--reference", short)
    assert result.exit_code == 1 and "reference has 1 lines but the input 6" in result.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--beam", "100000"], "larger than the target vocabulary"),
        (["--beam", "2", "--nbest", "3"], "larger than the beam"),
        (["--nbest", "2", "--detokenize"], "n-best lists hold tokenised text"),
        (["--nbest", "2", "--name", "RNN_0"], "contains '_'"),
    ],
)
def test_bad_options(tmp_path, tiny_model_path, source, extra, message):
    path, _ = source
    out = tmp_path / "out.fr"
    result = invoke("translate", path, "-m", tiny_model_path, "-o", str(out), *extra)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.output and not out.exists()


# ---------------------------------------------------------------------------- evaluate
def test_evaluate_perfect_and_mismatched(tmp_path):
    result = invoke("evaluate", str(REFERENCE), str(REFERENCE))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("BLEU = 100.00")
    assert lines[1] == "chrF2 = 100.00"
    assert lines[2].startswith("BLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert lines[3].startswith("chrF signature: nrefs:1")
    worse = write_lines(tmp_path / "hyp.fr", ["un homme ."] * 5)
    result = invoke("evaluate", worse, str(REFERENCE))
    assert float(result.stdout.split()[2]) < 100
    short = write_lines(tmp_path / "short.fr", ["un homme ."] * 4)
    result = invoke("evaluate", short, str(REFERENCE))
    assert result.exit_code == 1 and "has 4 lines but" in result.stderr


def test_missing_sacrebleu_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # import sacrebleu -> ImportError
    result = invoke("evaluate", str(REFERENCE), str(REFERENCE))
    assert result.exit_code == 1
    assert "pip install 'phrasescore[eval]'" in result.stderr and "Traceback" not in result.output


# ---------------------------------------------------------------------------- sample
def sample_lines(model: str, *args: str, input: str | None = None) -> list[list[str]]:
    result = invoke("sample", *args, "-m", model, input=input)
    assert result.exit_code == 0, result.output
    return [line.split("\t") for line in result.stdout.splitlines()]


def test_sample_is_deterministic_and_scored(tiny_model_path, scorer):
    args = ["a man", "two dogs", "-n", "60", "--top", "5", "--seed", "4"]
    first = sample_lines(tiny_model_path, *args)
    assert first == sample_lines(tiny_model_path, *args)
    assert first != sample_lines(tiny_model_path, *args[:-1], "5")
    assert {row[0] for row in first} == {"a man", "two dogs"}
    for phrase in ("a man", "two dogs"):
        rows = [row for row in first if row[0] == phrase]
        assert 1 <= len(rows) <= 5 and len({row[2] for row in rows}) == len(rows)
        logps = [float(row[1]) for row in rows]
        assert logps == sorted(logps, reverse=True)
        scored = scorer.score_phrases([phrase] * len(rows), [row[2] for row in rows])
        assert list(scored.logprob) == pytest.approx(logps, abs=1e-3)
    # a phrase's samples do not depend on the other phrases asked for
    alone = sample_lines(tiny_model_path, "two dogs", *args[2:])
    assert alone == [row for row in first if row[0] == "two dogs"]


def test_sample_from_stdin_with_beam_and_phrase_table(tmp_path, tiny_model_path):
    rows = sample_lines(tiny_model_path, "-", "-n", "30", "--top", "4", "--beam", input="a man\n")
    targets = [row[2] for row in rows]
    assert len(targets) == 4
    table = write_lines(
        tmp_path / "phrase-table",
        [
            f"a man ||| {targets[1] or 'x'} ||| 0.5 0.5 0.5 0.5",
            "a man ||| quelque chose d' autre ||| 0.5 0.5 0.5 0.5",
            f"a woman ||| {targets[0] or 'x'} ||| 0.5 0.5 0.5 0.5",
        ],
    )
    marked = sample_lines(
        tiny_model_path, "a man", "-n", "30", "--top", "4", "--beam", "--phrase-table", table
    )
    assert [row[:3] for row in marked] == rows
    flags = {row[2]: row[3] for row in marked}
    expect_in = targets[1] if targets[1] else None
    for target, flag in flags.items():
        assert flag == ("in-table" if target == expect_in else "new")


def test_sample_needs_something_to_do(tiny_model_path):
    result = invoke("sample", "a man", "-m", tiny_model_path, "-n", "0")
    assert result.exit_code == 2 and "-n 0 without --beam" in result.stderr  # a usage error


# --------------------------------------------------------------------------- BLEU of tokenised text
def test_translate_reference_scores_tokenised_text_with_bleu_tokenize_none(
    tiny_model_path, source, tmp_path
):
    """``translate --reference --bleu-tokenize none`` scores tokenised text as ``ab`` and
    ``evaluate --tokenize none`` do, and its signature says so: 13a would tokenise tokenised
    text again."""
    from .conftest import run_cli

    path, lines = source
    reference = write_lines(tmp_path / "ref.fr", ["un homme regarde la mer ."] * len(lines))
    out = tmp_path / "out.fr"
    proc = run_cli("-q", "translate", path, "-m", tiny_model_path, *WORDY, "-o", out,
                   "--reference", reference, "--bleu-tokenize", "none")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    printed = proc.stderr.splitlines()
    assert printed[-2].startswith("BLEU signature: nrefs:1|case:mixed|eff:no|tok:none|")
    same = run_cli("evaluate", out, reference, "--tokenize", "none")
    assert same.returncode == 0, same.stderr
    assert printed[-4:] == same.stdout.splitlines()  # BLEU, chrF and both signatures


def test_tokenised_text_scored_with_13a_gets_one_line_naming_the_flag(tmp_path):
    from .conftest import run_cli

    _, french = sample_pairs()  # 171 tokenised, lowercased Multi30k sentences
    assert sum(line.endswith(" .") for line in french) >= 100
    reference = write_lines(tmp_path / "ref.fr", french)
    hypotheses = write_lines(tmp_path / "hyp.fr", french[1:] + french[:1])
    proc = run_cli("evaluate", hypotheses, reference)
    assert proc.returncode == 0, proc.stderr
    ends = sum(line.endswith(" .") for line in french)
    assert proc.stderr.splitlines() == [
        f"phrasescore: {ends} of {len(french)} hypotheses end in a tokenised period (' .'): "
        "BLEU with tokenize 13a tokenises tokenised text again; --tokenize none scores its "
        "tokens as they are (as ab and multi-bleu.perl do)"
    ]  # and not sacrebleu's three lines
    none = run_cli("evaluate", hypotheses, reference, "--tokenize", "none")
    assert none.returncode == 0 and none.stderr == ""
    assert "tok:none" in none.stdout and "tok:13a" in proc.stdout
