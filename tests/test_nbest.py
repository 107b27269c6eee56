"""``phrasescore nbest``: the neural feature added to real Moses n-best lists, re-ranking, errors."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from phrasescore.bundle import load_model
from phrasescore.cli import cli
from phrasescore.engine.scoring import PairScorer
from phrasescore.moses.nbest import (
    format_feature_value,
    iter_nbest_groups,
    parse_features,
    read_nbest,
    read_weights,
    total_score,
)

from .conftest import DATA, sample_pairs, write_lines

MOSES = DATA / "moses"
NBEST = DATA / "nbest"
MULTI30K_LIST = NBEST / "multi30k.test2016.ids0-4.100best.nbest.gz"
MULTI30K_SRC = NBEST / "multi30k.test2016.head5.tok.lc.en"
FEATURE = re.compile(r" RNNEncDec0= (\S+)")

# list -> number of sentence ids (0..n-1). The German-English lists ship without their source
# sentences, so real English sentences stand in for them (the feature's value is then
# meaningless, its placement and the bytes around it are not).
STAND_IN = {
    "labelled-5best.nbest": 1,
    "labelled-50best.nbest": 5,
    "oldlabels.nbest.gz": 10,
    "mert-example.nbest": 3,
}


def text_bytes(path: Path) -> bytes:
    data = Path(path).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def invoke(*args: str, input: bytes | None = None):
    return CliRunner().invoke(cli, ["-q", *args], input=input)


def stand_in_source(tmp_path: Path, n: int) -> str:
    src, _ = sample_pairs(n)
    return write_lines(tmp_path / "source.en", src)


@pytest.fixture(scope="module")
def scorer(tiny_model_path):
    return PairScorer(load_model(tiny_model_path))


def expected_logprobs(scorer, nbest: Path, source: str, normalize=False) -> list[float]:
    sources = Path(source).read_text(encoding="utf-8").splitlines()
    entries = list(read_nbest(str(nbest)))
    scored = scorer.score_phrases([sources[e.id] for e in entries], [e.hypothesis for e in entries])
    values = scored.logprob / scored.n_tokens if normalize else scored.logprob
    return [float(v) for v in values]


def check_one_feature_added(before: bytes, after: bytes, expected: list[float]) -> None:
    old_lines = before.decode("utf-8").splitlines(keepends=True)
    new_lines = after.decode("utf-8").splitlines(keepends=True)
    assert len(new_lines) == len(old_lines) == len(expected)
    for old, new, value in zip(old_lines, new_lines, expected, strict=True):
        assert len(FEATURE.findall(new)) == 1
        assert FEATURE.sub("", new, count=1) == old  # every other byte unchanged
        assert float(FEATURE.search(new).group(1)) == pytest.approx(value, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("name", sorted(STAND_IN))
def test_feature_added_to_real_lists(tmp_path, tiny_model_path, scorer, name):
    source = stand_in_source(tmp_path, STAND_IN[name])
    out = tmp_path / "out.nbest"
    result = invoke(
        "nbest", str(MOSES / name), "--source", source, "-m", tiny_model_path, "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    expected = expected_logprobs(scorer, MOSES / name, source)
    check_one_feature_added(text_bytes(MOSES / name), out.read_bytes(), expected)


def test_multi30k_list_with_its_source(tmp_path, tiny_model_path, scorer):
    out = tmp_path / "out.nbest"
    args = ["nbest", str(MULTI30K_LIST), "--source", str(MULTI30K_SRC), "-m", tiny_model_path]
    result = invoke(*args, "-o", str(out))
    assert result.exit_code == 0, result.output
    expected = expected_logprobs(scorer, MULTI30K_LIST, str(MULTI30K_SRC))
    check_one_feature_added(text_bytes(MULTI30K_LIST), out.read_bytes(), expected)
    # stdin (gzip) to stdout gives the same bytes; a .gz output holds them compressed
    piped = CliRunner().invoke(
        cli, ["-q", *args[:1], "-", *args[2:]], input=MULTI30K_LIST.read_bytes()
    )
    assert piped.exit_code == 0
    assert piped.stdout_bytes == out.read_bytes()
    gz = tmp_path / "out.nbest.gz"
    assert invoke(*args, "-o", str(gz)).exit_code == 0
    assert gzip.decompress(gz.read_bytes()) == out.read_bytes()


def test_normalize_gives_the_per_token_average(tmp_path, tiny_model_path, scorer):
    out = tmp_path / "out.nbest"
    args = ["nbest", str(MULTI30K_LIST), "--source", str(MULTI30K_SRC), "-m", tiny_model_path]
    assert invoke(*args, "--normalize", "-o", str(out)).exit_code == 0
    expected = expected_logprobs(scorer, MULTI30K_LIST, str(MULTI30K_SRC), normalize=True)
    check_one_feature_added(text_bytes(MULTI30K_LIST), out.read_bytes(), expected)


# ---------------------------------------------------------------------------- re-ranking
def weights_file(tmp_path: Path, rnn_weight: float, others: float | None = None) -> str:
    """The multi30k system's moses.ini weights (or all ``others``) plus RNNEncDec0."""
    weights = read_weights(str(MOSES / "multi30k.moses.ini"))
    lines = ["[weight]"]
    for name, values in weights.items():
        values = [others] * len(values) if others is not None else values
        lines.append(f"{name}= " + " ".join(str(v) for v in values))
    lines.append(f"RNNEncDec0= {rnn_weight}")
    return write_lines(tmp_path / "rescore.ini", lines)


def original_best(path: Path) -> list[str]:
    """Per id, the hypothesis with the best total in the list."""
    return [
        max(group, key=lambda e: float(e.total)).hypothesis
        for group in iter_nbest_groups(read_nbest(str(path)))
    ]


def one_best(tmp_path, model, weights) -> tuple[list[str], str]:
    args = ["nbest", str(MULTI30K_LIST), "--source", str(MULTI30K_SRC), "-m", model]
    result = CliRunner().invoke(cli, [*args, "--weights", weights, "--one-best", "--no-progress"])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines(), result.stderr


def test_decisive_feature_changes_the_one_best_where_it_should(tmp_path, tiny_model_path, scorer):
    entries = list(read_nbest(str(MULTI30K_LIST)))
    logprobs = expected_logprobs(scorer, MULTI30K_LIST, str(MULTI30K_SRC))
    by_model: dict[int, tuple[float, str]] = {}
    for entry, value in zip(entries, logprobs, strict=True):
        if entry.id not in by_model or value > by_model[entry.id][0]:
            by_model[entry.id] = (value, entry.hypothesis)
    model_best = [by_model[i][1] for i in range(5)]
    old = original_best(MULTI30K_LIST)

    # weight 0 for the new feature: the decoder's own 1-best, nothing changes
    unchanged, log = one_best(tmp_path, tiny_model_path, weights_file(tmp_path, 0.0))
    assert unchanged == old
    assert "best hypothesis changed for 0" in log

    # a decisive weight: the model's favourite wins, and only where it differs from the old best
    decided, log = one_best(tmp_path, tiny_model_path, weights_file(tmp_path, 1000.0))
    assert decided == model_best
    changed = sum(a != b for a, b in zip(model_best, old, strict=True))
    assert changed >= 1
    assert f"best hypothesis changed for {changed}" in log

    # the new feature alone
    alone, _ = one_best(tmp_path, tiny_model_path, weights_file(tmp_path, 1.0, others=0.0))
    assert alone == model_best


def test_reranked_list_holds_the_new_totals(tmp_path, tiny_model_path):
    weights_path = weights_file(tmp_path, 0.5)
    out = tmp_path / "reranked.nbest"
    args = ["nbest", str(MULTI30K_LIST), "--source", str(MULTI30K_SRC), "-m", tiny_model_path]
    assert invoke(*args, "--weights", weights_path, "-o", str(out)).exit_code == 0
    plain = tmp_path / "plain.nbest"
    assert invoke(*args, "-o", str(plain)).exit_code == 0
    weights = read_weights(weights_path)
    groups = list(iter_nbest_groups(read_nbest(str(out))))
    assert [g[0].id for g in groups] == list(range(5))
    for group in groups:
        totals = [float(e.total) for e in group]
        assert totals == sorted(totals, reverse=True)
        for entry in group:
            recomputed = total_score(parse_features(entry.features), weights)
            assert entry.total == " " + format_feature_value(recomputed)
    # the same lines as without weights, apart from order and total
    strip = re.compile(r"\|\|\|[^|]*$")
    reranked = sorted(strip.sub("", line) for line in out.read_text().splitlines())
    assert reranked == sorted(strip.sub("", line) for line in plain.read_text().splitlines())


# ---------------------------------------------------------------------------- bad input
def bad_list(tmp_path: Path) -> str:
    lines = text_bytes(MOSES / "labelled-50best.nbest").decode().splitlines()
    lines[7] = "0 ||| only two fields"
    return write_lines(tmp_path / "bad.nbest", lines)


def dup_feature_list(tmp_path: Path, model: str) -> str:
    out = tmp_path / "once.nbest"
    source = stand_in_source(tmp_path, 5)
    args = ["nbest", str(MOSES / "labelled-50best.nbest"), "--source", source, "-m", model]
    assert invoke(*args, "-o", str(out)).exit_code == 0
    return str(out)


@pytest.mark.parametrize(
    "case, message",
    [
        ("unknown id", "labelled-50best.nbest:151: sentence id 3 is out of range"),
        ("malformed line", "bad.nbest:8: expected at least 4 fields"),
        ("empty source line", "labelled-50best.nbest:101: the source sentence of id 2"),
        ("source too long", "ends with sentence id 4 but the source has 8 lines"),
        ("empty list", "empty.nbest: the n-best list is empty but the source has 5 lines"),
        (
            "ids out of order",
            "ends with sentence id 0 (its highest is 1) but the source has 5 lines",
        ),
        ("empty source", "sentence id 0 is out of range: the source "),
        ("no weight for the feature", "gives no weight for the new feature RNNEncDec0"),
        ("one-best without weights", "--one-best needs --weights"),
        ("underscore in name", "contains '_'"),
        ("feature already there", "once.nbest:1: feature 'RNNEncDec0' is already in this line"),
    ],
)
def test_bad_input_is_one_line_and_no_output(tmp_path, tiny_model_path, case, message):
    nbest = str(MOSES / "labelled-50best.nbest")
    src, _ = sample_pairs(8)
    source = write_lines(tmp_path / "source.en", src[:5])
    extra: list[str] = []
    if case == "unknown id":
        source = write_lines(tmp_path / "source.en", src[:3])
    elif case == "malformed line":
        nbest = bad_list(tmp_path)
    elif case == "empty source line":
        source = write_lines(tmp_path / "source.en", src[:2] + [""] + src[3:5])
    elif case == "source too long":
        source = write_lines(tmp_path / "source.en", src[:8])
    elif case == "empty list":  # named empty, not a list "ending with sentence id -1"
        nbest = write_lines(tmp_path / "empty.nbest", [])
    elif case == "ids out of order":  # the last group's id named, not the highest one's
        lines = text_bytes(MOSES / "labelled-50best.nbest").decode().splitlines()
        ones = [line for line in lines if line.startswith("1 ")]
        zeros = [line for line in lines if line.startswith("0 ")]
        nbest = write_lines(tmp_path / "unordered.nbest", ones + zeros)
    elif case == "empty source":  # named as having no line, not "(ids 0--1)"
        source = write_lines(tmp_path / "source.en", [])
        message += f"{source} has no line; the list and the source do not match"
    elif case == "no weight for the feature":
        extra = ["--weights", str(MOSES / "multi30k.moses.ini")]
    elif case == "one-best without weights":
        extra = ["--one-best"]
    elif case == "underscore in name":
        extra = ["--name", "RNN_EncDec"]
    elif case == "feature already there":
        nbest = dup_feature_list(tmp_path, tiny_model_path)
    out = tmp_path / "out.nbest"
    result = CliRunner().invoke(
        cli,
        ["nbest", nbest, "--source", source, "-m", tiny_model_path, "-o", str(out), "--no-progress"]
        + extra,
    )
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("phrasescore: error")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.output
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.nbest")]


# ---------------------------------------------------------------------- temporaries of a killed run
def test_a_later_run_removes_the_temporaries_a_killed_run_left(tmp_path, tiny_model_path, caplog):
    """nbest's ``.out.gz.XXXXXXXX.tmp``, left by a SIGKILL, is removed by the next run on the same
    output (its own naming pattern only, logged), unless a live run holds the lock."""
    import os
    import subprocess
    import sys

    from phrasescore.files.outputs import _temporary_beside

    out = tmp_path / "out.gz"
    fd, stale = _temporary_beside(str(out))  # the very name a killed run leaves
    os.write(fd, b"half a list")
    os.close(fd)
    others = [".out.gz.abc.tmp", ".other.gz.abcd1234.tmp", ".out.gz.abcd1234.tmp.keep", "out.gz.x"]
    for name in others:
        (tmp_path / name).write_text("not ours")
    args = ["nbest", str(MULTI30K_LIST), "--source", str(MULTI30K_SRC), "-m", tiny_model_path]
    args += ["-o", str(out), "--no-progress"]
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from phrasescore.files.locks import output_lock\n"
         "with output_lock(sys.argv[1]):\n    print('locked', flush=True); sys.stdin.read()",
         str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "locked\n"
        refused = CliRunner().invoke(cli, args)
        assert refused.exit_code == 1
        assert refused.stderr.splitlines() == [
            f"phrasescore: error: {out}: another run is writing this output (process "
            f"{holder.pid} holds its lock .out.gz.lock): wait for it to end, or stop it"
        ]
        assert os.path.exists(stale)  # a live run's temporary is never touched
    finally:
        holder.communicate("")
    with caplog.at_level("INFO", logger="phrasescore.files"):
        result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert caplog.messages == [
        "removed 1 temporary file(s) of an earlier run that was killed: " + os.path.basename(stale)
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.gz", *others])


def test_a_model_of_the_other_direction_is_warned_about(
    tiny_model_path, tiny_inverse_model_path, tmp_path
):
    """nbest warns once of a model trained in the other direction, as rescore does, and not when
    the direction fits (a forward model, or the inverse one with --inverse)."""
    from .conftest import run_cli

    nbest = NBEST / "multi30k.test2016.ids0-4.100best.nbest.gz"
    source = NBEST / "multi30k.test2016.head5.tok.lc.en"
    flags = ["--source", source, "--no-progress", "-o", tmp_path / "out.gz"]
    proc = run_cli("nbest", nbest, "-m", tiny_inverse_model_path, *flags)
    assert proc.returncode == 0, proc.stderr
    assert f"{tiny_inverse_model_path} (fr->en) looks trained in the other direction" in (
        proc.stderr
    )
    assert "the n-best list's words read the other way round" in proc.stderr
    assert proc.stderr.count("other direction") == 1 and "--inverse" in proc.stderr
    for args in (["-m", tiny_model_path], ["-m", tiny_inverse_model_path, "--inverse"]):
        proc = run_cli("nbest", nbest, *args, *flags)
        assert proc.returncode == 0, proc.stderr
        assert "other direction" not in proc.stderr


def test_nbest_and_translate_log_their_start_up_apart_from_their_rate(tiny_model_path, tmp_path):
    """Each command says, before its work, how long its start-up took (from the process's first
    import of phrasescore: imports, device, model), a part of the command's wall time, and
    then the rate of the work alone."""
    import subprocess
    import sys
    import time

    flags = ["--no-progress", "-o"]
    runs = {
        "nbest": ["nbest", MULTI30K_LIST, "--source", MULTI30K_SRC, "-m", tiny_model_path],
        "translate": ["translate", MULTI30K_SRC, "-m", tiny_model_path],
    }
    for name, args in runs.items():
        started = time.monotonic()
        # a process of its own (the tests' forked CLI starts from a process imported already)
        command = [sys.executable, "-m", "phrasescore", *map(str, args), *flags]
        proc = subprocess.run(
            [*command, str(tmp_path / f"{name}.out")], capture_output=True, text=True
        )
        wall = time.monotonic() - started
        assert proc.returncode == 0, proc.stderr
        lines = proc.stderr.splitlines()
        found = [i for i, line in enumerate(lines) if "start-up" in line]
        assert len(found) == 1, proc.stderr
        m = re.fullmatch(r"phrasescore: start-up ([\d.]+) s \(imports, device set-up, .+\)",
                         lines[found[0]])  # fmt: skip
        assert m and 0 < float(m.group(1)) < wall, proc.stderr
        rate = next(i for i, line in enumerate(lines) if re.search(r" in [\d.]+ s", line))
        assert found[0] < rate
