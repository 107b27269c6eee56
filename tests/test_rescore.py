"""phrasescore rescore on real Moses tables with a real (tiny) trained model."""

from __future__ import annotations

import gzip
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from phrasescore.bundle import load_model
from phrasescore.engine.scoring import PairScorer
from phrasescore.errors import InputError
from phrasescore.jobs.rescore.rescore import RescoreOptions, rescore_table
from phrasescore.moses.ini import count_features_and_weights
from phrasescore.moses.phrase_table import format_entry, read_phrase_table

from .conftest import DATA, run_cli, train_tiny

TABLES = [
    DATA / "moses" / "multi30k.head300.phrase-table.gz",
    DATA / "moses" / "de-en.4scores.slice300.phrase-table.gz",
    DATA / "moses" / "de-en.5scores.slice300.phrase-table.gz",
    DATA / "moses" / "sparse.phrase-table.gz",
    DATA / "moses" / "tiny.phrase-table",
]
EXAMPLE_TABLE = DATA.parent.parent / "examples" / "model" / "phrase-table.gz"


def read_text(path) -> str:
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8")


@pytest.mark.parametrize("table", TABLES, ids=lambda p: p.name)
def test_one_more_column_and_every_other_byte_unchanged(table, tiny_model_path, tmp_path):
    out = tmp_path / ("out.gz" if table.name.endswith(".gz") else "out")
    result = rescore_table(str(table), [tiny_model_path], str(out), progress=False)
    src_entries = list(read_phrase_table(str(table)))
    out_entries = list(read_phrase_table(str(out)))
    assert result.lines == len(src_entries) == len(out_entries)
    model = load_model(tiny_model_path)
    scored = PairScorer(model).score_phrases(
        [e.source for e in src_entries], [e.target for e in src_entries]
    )
    for i, (a, b) in enumerate(zip(src_entries, out_entries, strict=True)):
        assert len(b.scores) == len(a.scores) + 1
        assert format_entry(b._replace(scores=b.scores[:-1])) == format_entry(a)
        value = float(b.scores[-1])
        assert 0.0 < value <= 1.0
        assert value == pytest.approx(math.exp(max(scored.logprob[i], -100.0)), rel=1e-5)
    assert result.signatures == [model.signature]


def test_same_flags_same_bytes_and_batching_does_not_change_scores(tiny_model_path, tmp_path):
    table = str(TABLES[0])
    runs = {}
    for name, opts in {
        "a": RescoreOptions(batch_tokens=8192, chunk_lines=50000),
        "b": RescoreOptions(batch_tokens=8192, chunk_lines=50000),
        "c": RescoreOptions(batch_tokens=37, chunk_lines=17),
        "d": RescoreOptions(batch_tokens=100000, chunk_lines=1000, logprob=True),
    }.items():
        out = tmp_path / f"{name}.gz"
        rescore_table(table, [tiny_model_path], str(out), opts, progress=False)
        runs[name] = out
    assert runs["a"].read_bytes() == runs["b"].read_bytes()
    col = {
        k: np.array([float(e.scores[-1]) for e in read_phrase_table(str(v), validate=False)])
        for k, v in runs.items()
    }
    assert np.abs(np.log(col["a"]) - np.log(col["c"])).max() < 1e-4
    assert np.abs(np.log(col["a"]) - col["d"]).max() < 1e-4


def test_normalize_unk_column_and_two_models(tiny_model_path, tmp_path, corpus_files):
    table = str(TABLES[0])
    out = tmp_path / "out.gz"
    opts = RescoreOptions(normalize=True, unk_column=True)
    rescore_table(table, [tiny_model_path, tiny_model_path], str(out), opts, progress=False)
    model = load_model(tiny_model_path)
    entries = list(read_phrase_table(table))
    scored = PairScorer(model).score_phrases(
        [e.source for e in entries], [e.target for e in entries]
    )
    for i, e in enumerate(read_phrase_table(str(out))):
        assert len(e.scores) == 4 + 3
        per_token = math.exp(scored.logprob[i] / scored.n_tokens[i])
        assert float(e.scores[4]) == pytest.approx(per_token, rel=1e-5)
        assert e.scores[5] == e.scores[4]
        unknown = scored.src_unknown[i] + scored.tgt_unknown[i]
        assert float(e.scores[6]) == pytest.approx(math.exp(-unknown))


def test_no_eos_scores_the_target_words_alone(tiny_model_path, tmp_path):
    """--no-eos: log p without the end-of-sequence term, i.e. the sum of the per-word log p
    of the target words; the column is still a probability, and larger than with EOS."""
    table = str(TABLES[0])
    with_eos, without = tmp_path / "eos.gz", tmp_path / "no-eos.gz"
    rescore_table(table, [tiny_model_path], str(with_eos), RescoreOptions(), progress=False)
    rescore_table(
        table, [tiny_model_path], str(without), RescoreOptions(no_eos=True), progress=False
    )
    model = load_model(tiny_model_path)
    entries = list(read_phrase_table(table))
    scored = PairScorer(model).score_phrases(
        [e.source for e in entries], [e.target for e in entries], per_token=True
    )
    pairs = zip(read_phrase_table(str(with_eos)), read_phrase_table(str(without)), strict=True)
    for i, (a, b) in enumerate(pairs):
        words = float(scored.token_logprobs[i][:-1].sum())
        assert float(b.scores[4]) == pytest.approx(math.exp(max(words, -100.0)), rel=1e-5)
        assert 0.0 < float(a.scores[4]) < float(b.scores[4]) <= 1.0
        assert a.scores[:4] == b.scores[:4] == entries[i].scores


def test_inverse_model_scores_source_given_target(tiny_model_path, tmp_path):
    table = str(TABLES[0])
    out = tmp_path / "inv.gz"
    rescore_table(table, [], str(out), inverse_model_paths=[tiny_model_path], progress=False)
    model = load_model(tiny_model_path)
    entries = list(read_phrase_table(table))[:20]
    scored = PairScorer(model).score_phrases(
        [e.target for e in entries], [e.source for e in entries]
    )
    for i, e in enumerate(list(read_phrase_table(str(out)))[:20]):
        assert float(e.scores[-1]) == pytest.approx(math.exp(scored.logprob[i]), rel=1e-5)


def test_moses_ini_is_updated_for_the_new_table(tiny_model_path, tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text((DATA / "moses" / "multi30k.moses.ini").read_text())
    table = tmp_path / "phrase-table.gz"
    table.write_bytes(TABLES[0].read_bytes())
    proc = run_cli(
        "rescore",
        table,
        "-m",
        tiny_model_path,
        "--unk-column",
        "--moses-ini",
        ini,
        "--no-progress",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    new_ini = tmp_path / "moses.rescored.ini"
    text = new_ini.read_text()
    assert "num-features=6 path=phrase-table.rescored.gz" in text
    assert "TranslationModel0= 0.2 0.2 0.2 0.2 0.2 0.2" in text
    assert load_model(tiny_model_path).signature in text
    for name, (features, weights) in count_features_and_weights(text).items():
        if features is not None:
            assert features == weights, name
    assert (tmp_path / "phrase-table.rescored.gz").exists()
    assert "pairs/s" in proc.stderr


def test_stdin_to_stdout(tiny_model_path):
    data = TABLES[4].read_bytes()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "phrasescore",
            "-q",
            "rescore",
            "-",
            "-m",
            tiny_model_path,
            "-o",
            "-",
            "--no-progress",
        ],
        input=data,
        capture_output=True,
    )
    assert proc.returncode == 0, proc.stderr
    out_lines = proc.stdout.decode().splitlines()
    in_lines = data.decode().splitlines()
    assert len(out_lines) == len(in_lines)
    for a, b in zip(in_lines, out_lines, strict=True):
        head, _, rest = a.partition(" ||| ")
        assert b.startswith(head + " ||| ")


def test_bad_input_or_bad_model_leaves_no_output(tiny_model_path, tmp_path):
    bad = tmp_path / "bad.pt"
    lines = TABLES[4].read_text().splitlines(True)
    lines[6] = "only ||| two fields\n"
    bad.write_text("".join(lines))
    out = tmp_path / "out"
    proc = run_cli("rescore", bad, "-m", tiny_model_path, "-o", out, "--chunk-lines", "2")
    assert proc.returncode == 1
    assert f"{bad}:7:" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad.pt"]
    proc = run_cli("rescore", TABLES[4], "-m", bad, "-o", out)
    assert proc.returncode == 1 and "not a phrasescore model" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("digits", ["\u0660.\u0665", "\uff15"], ids=["arabic-indic", "fullwidth"])
@pytest.mark.parametrize("command", ["check-table", "rescore"])
def test_a_score_in_digits_moses_does_not_read_is_refused(
    tiny_model_path, tmp_path, command, digits
):
    """Python's float reads other scripts' digits (0.5, 5); Moses' parser does not, so the
    table is not the one Moses would load."""
    bad = tmp_path / "bad.pt"
    lines = TABLES[4].read_text().splitlines(True)
    source, target, scores, *tail = lines[6].split(" ||| ")
    scores = " ".join([digits, *scores.split()[1:]])
    lines[6] = " ||| ".join([source, target, scores, *tail])
    bad.write_text("".join(lines), encoding="utf-8")
    out = tmp_path / "out"
    args = [bad] if command == "check-table" else [bad, "-m", tiny_model_path, "-o", out]
    proc = run_cli(command, *args)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"phrasescore: error: {bad}:7: score 1 is not a number: {digits!r} (Moses reads ASCII "
        "digits only)"
    )
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad.pt"]


def test_resume_after_kill_gives_identical_bytes(tiny_model_path, tmp_path):
    lines = gzip.open(EXAMPLE_TABLE, "rt", encoding="utf-8").read().splitlines(True)[:6000]
    table = tmp_path / "pt.gz"
    with gzip.open(table, "wt", encoding="utf-8") as fh:
        fh.write("".join(lines))
    flags = ["-m", tiny_model_path, "--chunk-lines", "400", "--no-progress", "--threads", "1"]
    full = tmp_path / "full.gz"
    assert run_cli("rescore", table, "-o", full, *flags).returncode == 0
    part = tmp_path / "part.gz"
    # The first run reads standard input and gets only 2,000 of the 6,000 lines (the pipe stays
    # open), so it cannot finish before it is killed, however fast or loaded the machine is.
    proc = subprocess.Popen(
        [sys.executable, "-m", "phrasescore", "rescore", "-", "-o", str(part), *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc.stdin.write("".join(lines[:2000]).encode("utf-8"))
    proc.stdin.flush()
    state = tmp_path / ".part.gz.partial.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if json.loads(state.read_text())["lines"] >= 1200:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdin.close()
    assert not part.exists()
    done = json.loads(state.read_text())["lines"]
    assert 1200 <= done <= 2000
    with open(table, "rb") as stdin:
        resumed = run_cli("rescore", "-", "-o", part, *flags, "--resume", stdin=stdin)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming after line {done}" in resumed.stderr
    got, want = gzip.decompress(part.read_bytes()), gzip.decompress(full.read_bytes())
    assert got == want, f"resumed after line {done}: other lines than an uninterrupted run"
    assert part.read_bytes() == full.read_bytes(), f"resumed after line {done}: other gzip bytes"
    assert not state.exists()


def test_models_of_different_directions_are_refused(tiny_model_path, tmp_path, corpus_files):
    fr_en = str(tmp_path / "fr-en.safetensors")
    train_tiny(fr_en, corpus_files[1], corpus_files[0], src_lang="fr", tgt_lang="en", max_steps=2)
    out = tmp_path / "out"
    proc = run_cli("rescore", TABLES[4], "-m", tiny_model_path, "-m", fr_en, "-o", out)
    assert proc.returncode == 1 and "--inverse-model" in proc.stderr
    assert not out.exists()
    proc = run_cli("rescore", TABLES[4], "-m", tiny_model_path, "--inverse-model", fr_en, "-o", out)
    assert proc.returncode == 0, proc.stderr
    before = [len(e.scores) for e in read_phrase_table(str(TABLES[4]))]
    assert [len(e.scores) for e in read_phrase_table(str(out))] == [n + 2 for n in before]


def test_subword_model_trains_and_rescores(tmp_path, corpus_files):
    model = tmp_path / "sw.safetensors"
    proc = run_cli(
        "train",
        *corpus_files,
        "-o",
        model,
        "--preset",
        "tiny",
        "--subwords",
        "300",
        "--max-steps",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    assert load_model(str(model)).tgt_vocab.kind == "subword"
    out = tmp_path / "out.gz"
    result = rescore_table(str(TABLES[0]), [str(model)], str(out), progress=False)
    assert result.lines == 300
    assert all(0 < float(e.scores[-1]) <= 1 for e in read_phrase_table(str(out)))


# ---------------------------------------------------------- checks before work, summaries, warnings
def _moses_system(tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text((DATA / "moses" / "multi30k.moses.ini").read_text())
    table = tmp_path / "phrase-table.gz"
    table.write_bytes(TABLES[0].read_bytes())
    return ini, table


def test_chunk_lines_zero_is_a_usage_error_and_writes_nothing(tiny_model_path, tmp_path):
    out = tmp_path / "out.gz"
    for value in ("0", "-5"):
        proc = run_cli(
            "rescore", TABLES[0], "-m", tiny_model_path, "-o", out, "--chunk-lines", value
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "Invalid value for '--chunk-lines'" in proc.stderr
    assert os.listdir(tmp_path) == []
    with pytest.raises(InputError):
        rescore_table(str(TABLES[0]), [tiny_model_path], str(out), RescoreOptions(chunk_lines=0))
    assert os.listdir(tmp_path) == []


def test_ini_out_in_a_missing_directory_fails_before_scoring(tiny_model_path, tmp_path):
    ini, table = _moses_system(tmp_path)
    before = sorted(os.listdir(tmp_path))
    proc = run_cli(
        "rescore",
        table,
        "-m",
        tiny_model_path,
        "--moses-ini",
        ini,
        "--ini-out",
        tmp_path / "no-such-dir" / "new.ini",
        "--no-progress",
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "new.ini: moses.ini directory does not exist" in proc.stderr
    assert "pairs/s" not in proc.stderr  # refused before scoring
    assert sorted(os.listdir(tmp_path)) == before  # no table, no partial file


def test_table_and_ini_appear_together_or_not_at_all(tiny_model_path, tmp_path, monkeypatch):
    from phrasescore.jobs.rescore import rescore as rescore_module
    from phrasescore.jobs.rescore.ini_update import IniUpdate

    ini, table = _moses_system(tmp_path)
    before = sorted(os.listdir(tmp_path))

    def fail(self, ini_out, result):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(IniUpdate, "stage", fail)
    with pytest.raises(OSError):
        rescore_module.run_rescore(
            str(table), [tiny_model_path], None, RescoreOptions(), moses_ini=str(ini)
        )
    published = sorted(name for name in os.listdir(tmp_path) if not name.startswith("."))
    assert published == before  # neither the table nor the ini under its final name
    monkeypatch.undo()
    job = rescore_module.run_rescore(
        str(table), [tiny_model_path], None, RescoreOptions(), moses_ini=str(ini), resume=True
    )
    assert job.rescore.lines == 300 and job.rescore.resumed_from_line == 300
    assert sorted(os.listdir(tmp_path)) == sorted(
        before + ["moses.rescored.ini", "phrase-table.rescored.gz"]
    )


def test_progress_ends_at_100_percent_and_one_summary_line(tiny_model_path, tmp_path):
    proc = run_cli("rescore", TABLES[0], "-m", tiny_model_path, "-o", tmp_path / "out.gz")
    assert proc.returncode == 0, proc.stderr
    last_bar = proc.stderr.replace("\r", "\n").split("\n")
    last_bar = [line for line in last_bar if line.startswith("rescore:")][-1]
    assert "100%" in last_bar, last_bar
    summary = [line for line in proc.stderr.splitlines() if "distinct sources" in line]
    assert summary == [
        line for line in summary if line.startswith("phrasescore: rescored 300 lines, 205 ")
    ]
    assert len(summary) == 1, proc.stderr


def test_summary_after_resume_counts_the_whole_table(tiny_model_path, tmp_path, monkeypatch):
    from phrasescore.jobs.rescore.columns import NewColumns

    out = tmp_path / "out.gz"
    options = RescoreOptions(chunk_lines=70)
    full = rescore_table(str(TABLES[0]), [tiny_model_path], str(tmp_path / "full.gz"), options)
    original = NewColumns.format_chunk
    calls = []

    def interrupted(self, chunk, *args):
        calls.append(len(chunk))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, chunk, *args)

    monkeypatch.setattr(NewColumns, "format_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rescore_table(str(TABLES[0]), [tiny_model_path], str(out), options, progress=False)
    monkeypatch.undo()
    resumed = rescore_table(
        str(TABLES[0]), [tiny_model_path], str(out), RescoreOptions(chunk_lines=70), resume=True
    )
    assert resumed.resumed_from_line == 140
    assert (
        (resumed.lines, resumed.distinct_sources)
        == (full.lines, full.distinct_sources)
        == (
            300,
            205,
        )
    )
    assert out.read_bytes() == (tmp_path / "full.gz").read_bytes()


def test_model_files_follow_the_umask(tmp_path, corpus_files):
    old = os.umask(0o027)
    try:
        path = tmp_path / "m.safetensors"
        train_tiny(path, *corpus_files, max_steps=2)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert os.stat(str(path) + ".checkpoint").st_mode & 0o777 == 0o640


def test_a_lone_model_of_the_other_direction_is_warned_about(
    tiny_model_path, tmp_path, corpus_files
):
    fr_en = str(tmp_path / "fr-en.safetensors")
    train_tiny(fr_en, corpus_files[1], corpus_files[0], src_lang="fr", tgt_lang="en", max_steps=2)
    flags = ["--no-progress", "--chunk-lines", "100"]
    proc = run_cli("rescore", TABLES[0], "-m", fr_en, "-o", tmp_path / "a.gz", *flags)
    assert proc.returncode == 0, proc.stderr
    assert f"{fr_en} (fr->en) looks trained in the other direction" in proc.stderr
    assert "give it as --inverse-model" in proc.stderr
    # a shard checks its own first chunk (here the table's second), in a worker too
    part = tmp_path / "part.gz"
    proc = run_cli("rescore", TABLES[0], "-m", fr_en, "-o", part, *flags, "--shard", "2/2",
                   "--workers", "2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("looks trained in the other direction") == 1
    for args in (["-m", tiny_model_path], ["--inverse-model", fr_en]):
        proc = run_cli("rescore", TABLES[0], *args, "-o", tmp_path / "b.gz", *flags)
        assert proc.returncode == 0, proc.stderr
        assert "other direction" not in proc.stderr
    proc = run_cli(
        "rescore", TABLES[0], "--inverse-model", tiny_model_path, "-o", tmp_path / "c.gz"
    )
    assert "give it as --model" in proc.stderr


def test_a_phrase_over_the_length_limit_gets_the_floor_value_unscored(
    tiny_model_path, tmp_path, monkeypatch
):
    # a phrase over --max-phrase-length is never run through the network, whose time grows with
    # the phrase: it gets the floor value at once
    from phrasescore.engine.scoring import BlockScorer

    longest = []
    score_arrays = BlockScorer.score_arrays

    def spy(self, pairs, *args, **kwargs):
        longest.append(max(pairs.src.lengths().max(), pairs.tgt.lengths().max()))
        return score_arrays(self, pairs, *args, **kwargs)

    monkeypatch.setattr(BlockScorer, "score_arrays", spy)
    long_source = " ".join(["a"] * 5000)
    table = tmp_path / "pt"
    table.write_text(
        "a man ||| un homme ||| 0.5 0.5\n"
        f"{long_source} ||| un ||| 0.5 0.5\n"
        "a dog ||| un chien ||| 0.5 0.5\n"
        f"a ||| {long_source} ||| 0.5 0.5\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    result = rescore_table(
        str(table),
        [tiny_model_path],
        str(out),
        RescoreOptions(unk_column=True),
        progress=False,
    )
    assert longest and max(longest) <= 2  # the network saw "a man" and "un chien" only
    assert result.lines == 4 and result.too_long == 2
    floor = "3.720075976020836e-44"
    rows = [line.split(" ||| ")[2].split() for line in out.read_text().splitlines()]
    assert [r[2] for r in rows] == [rows[0][2], floor, rows[2][2], floor]
    assert float(rows[0][2]) > float(floor) and float(rows[2][2]) > float(floor)
    assert [r[3] for r in rows[1::2]] == ["1", "1"]  # unknown words counted as ever: none


def test_the_summary_counts_long_pairs_of_the_whole_table_after_resume(tiny_model_path, tmp_path):
    long_phrase = " ".join(["a"] * 8)
    table = tmp_path / "pt"
    table.write_text(
        "".join(
            f"{long_phrase if i % 2 else 'a man'} ||| un homme ||| 0.5 0.5\n" for i in range(6)
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    flags = ["-m", tiny_model_path, "-o", out, "--dtype", "float32", "--no-progress"]
    flags += ["--max-phrase-length", "7"]
    proc = run_cli("rescore", table, *flags, "--chunk-lines", "2")
    assert proc.returncode == 0, proc.stderr
    assert "6 lines" in proc.stderr and ", 3 over --max-phrase-length (floor value)" in proc.stderr
    assert "3 pairs have a phrase of more than 7 tokens" in proc.stderr
    full = out.read_bytes()
    # the same table resumed after its first chunk: the summary still counts all 6 lines
    options = RescoreOptions(chunk_lines=2, max_phrase_length=7)

    def stop(result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rescore_table(
            str(table), [tiny_model_path], str(out), options, progress=False, before_publish=stop
        )
    result = rescore_table(
        str(table), [tiny_model_path], str(out), options, progress=False, resume=True
    )
    assert result.resumed_from_line == 6 and result.too_long == 3
    assert out.read_bytes() == full
    proc = run_cli("rescore", table, *flags[:-1], "0")
    assert proc.returncode == 2 and "Invalid value for '--max-phrase-length'" in proc.stderr


# ---------------------------------------------------------------------------- an empty table
@pytest.mark.parametrize("name", ["empty.phrase-table", "empty.phrase-table.gz"])
def test_an_empty_table_is_said_in_a_warning_and_in_the_summary(tiny_model_path, tmp_path, name):
    """An empty table gives an empty output, and both a warning and the summary say the table
    is empty (a summary of 0 lines alone would not)."""
    table = tmp_path / name
    table.write_bytes(gzip.compress(b"", mtime=0) if name.endswith(".gz") else b"")
    out = tmp_path / "out.gz"
    proc = run_cli("rescore", table, "-m", tiny_model_path, "-o", out, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert f"phrasescore: {table} is empty: no line to rescore, the output {out} is empty too" in (
        lines
    )
    assert lines[-1].startswith("phrasescore: rescored 0 lines, 0 distinct sources")
    assert lines[-1].endswith("; the table is empty: so is the output")
    assert gzip.decompress(out.read_bytes()) == b""
    assert sorted(os.listdir(tmp_path)) == sorted([name, "out.gz"])


def test_an_ini_declaring_fewer_scores_than_the_table_has_is_warned_about(
    tiny_model_path, tmp_path
):
    """A moses.ini of num-features=4 for a table of 5 scores per line is carried over (4 + 1)
    with a warning naming the ini's line and the table's."""
    import shutil

    table = tmp_path / "phrase-table.gz"
    shutil.copy(DATA / "moses" / "de-en.5scores.slice300.phrase-table.gz", table)
    ini = tmp_path / "moses.ini"
    shutil.copy(DATA / "moses" / "multi30k.moses.ini", ini)  # num-features=4, line 21
    flags = ["-m", tiny_model_path, "--no-progress", "--moses-ini", ini]
    proc = run_cli("rescore", table, *flags, "-o", tmp_path / "out.gz")
    assert proc.returncode == 0, proc.stderr
    assert (
        f"{ini}:21: TranslationModel0 declares 4 features but {table} has 5 scores per line "
        f"(line 1): the new ini carries that over (4 + 1); fix num-features= in {ini}"
    ) in proc.stderr
    # the table of 4 scores the ini declares: no warning
    shutil.copy(DATA / "moses" / "multi30k.head300.phrase-table.gz", table)
    proc = run_cli("rescore", table, *flags, "-o", tmp_path / "out2.gz")
    assert proc.returncode == 0, proc.stderr
    assert "declares 4 features" not in proc.stderr
