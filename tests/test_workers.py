"""rescore --workers: chunks scored in forked single-threaded processes (phrasescore.runners.chunk_pool)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from phrasescore.errors import InputError
from phrasescore.runners.chunk_pool import ChunkPool, WorkerDied

from .conftest import DATA, run_cli

TABLE_GZ = DATA / "moses" / "multi30k.head300.phrase-table.gz"
TABLE_PLAIN = DATA / "moses" / "tiny.phrase-table"


@pytest.mark.parametrize("table", [TABLE_GZ, TABLE_PLAIN], ids=lambda p: p.name)
def test_workers_write_the_bytes_of_one_process(table, tiny_model_path, tmp_path):
    suffix = ".gz" if table.name.endswith(".gz") else ""
    flags = ["-m", tiny_model_path, "-m", tiny_model_path, "--unk-column"]
    flags += ["--normalize", "--chunk-lines", "7", "--no-progress"]
    one = tmp_path / f"one{suffix}"
    many = tmp_path / f"many{suffix}"
    first = run_cli("rescore", table, "-o", one, *flags, "--threads", "1")
    assert first.returncode == 0, first.stderr
    second = run_cli("rescore", table, "-o", many, *flags, "--workers", "3")
    assert second.returncode == 0, second.stderr
    assert "3 worker processes" in second.stderr
    assert many.read_bytes() == one.read_bytes()
    lines = (gzip.decompress(one.read_bytes()) if suffix else one.read_bytes()).count(b"\n")
    assert lines == (gzip.open(table) if suffix else open(table, "rb")).read().count(b"\n")
    # the summary's counts (lines, distinct sources) are those of one process
    summary = lambda proc: proc.stderr.strip().splitlines()[-1].split(", ")[:2]  # noqa: E731
    assert summary(second) == summary(first)
    assert sorted(os.listdir(tmp_path)) == sorted([one.name, many.name])


def test_workers_with_a_shard_and_standard_output(tiny_model_path, tmp_path):
    """A worker has one thread: its bytes are those of one process with ``--threads 1`` (the
    CPU's float sums depend on the thread count)."""
    flags = ["-m", tiny_model_path, "--chunk-lines", "20", "--no-progress"]
    for workers in ("1", "2"):
        part = tmp_path / f"part{workers}.gz"
        threads = ["--threads", "1"] if workers == "1" else []
        proc = run_cli(
            "rescore",
            TABLE_GZ,
            "-o",
            part,
            *flags,
            "--shard",
            "2/3",
            "--workers",
            workers,
            *threads,
        )
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "part1.gz").read_bytes() == (tmp_path / "part2.gz").read_bytes()
    with gzip.open(TABLE_GZ) as stdin:
        data = stdin.read()
    piped = run_cli("rescore", "-", "-o", "-", *flags, "--workers", "2", input=data.decode())
    alone = run_cli("rescore", "-", "-o", "-", *flags, "--threads", "1", input=data.decode())
    assert piped.returncode == 0 and piped.stdout == alone.stdout
    assert piped.stdout.count("\n") == data.count(b"\n")


def test_a_bad_line_seen_by_a_worker_is_one_error_line_and_no_output(tiny_model_path, tmp_path):
    lines = gzip.open(TABLE_GZ, "rt", encoding="utf-8").read().splitlines(True)
    # a phrase the model cannot score is not an input error; a malformed line is, and it is
    # found while reading: the workers are stopped, nothing is left behind
    lines[150] = "only ||| two fields\n"
    bad = tmp_path / "bad.gz"
    with gzip.open(bad, "wt", encoding="utf-8") as fh:
        fh.write("".join(lines))
    out = tmp_path / "out.gz"
    proc = run_cli(
        "rescore", bad, "-m", tiny_model_path, "-o", out, "--chunk-lines", "10", "--workers", "2"
    )
    assert proc.returncode == 1
    assert f"{bad}:151:" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad.gz"]


def lines_done(state) -> int:
    try:
        return json.loads(state.read_text())["lines"]
    except (OSError, ValueError, KeyError):
        return 0


def test_ctrl_c_stops_the_workers_and_keeps_the_partial_output(tiny_model_path, tmp_path):
    lines = gzip.open(TABLE_GZ, "rt", encoding="utf-8").read().splitlines(True)
    part = tmp_path / "part.gz"
    flags = ["-m", tiny_model_path, "--chunk-lines", "10", "--no-progress", "--workers", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "phrasescore", "rescore", "-", "-o", str(part), *flags],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=True,
    )
    # 100 of 300 lines and the pipe stays open: the run cannot end before the signal (the
    # parent reads ahead of the workers by up to 2 chunks each, so 50 lines get written)
    proc.stdin.write("".join(lines[:100]).encode())
    proc.stdin.flush()
    state = tmp_path / ".part.gz.partial.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and lines_done(state) < 50:
        time.sleep(0.05)
    assert lines_done(state) >= 50
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert b"Traceback" not in err
    assert not part.exists() and state.exists()
    # no worker outlives the command
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
    assert left.stdout.strip() == ""
    # --resume goes on from the last chunk written: the bytes of one uninterrupted process
    text = "".join(lines)
    resumed = run_cli("rescore", "-", "-o", part, *flags, "--resume", input=text)
    assert resumed.returncode == 0, resumed.stderr
    alone = run_cli("rescore", "-", "-o", "-", *flags[:-2], "--threads", "1", input=text)
    assert gzip.decompress(part.read_bytes()).decode() == alone.stdout


# ---------------------------------------------------------------------------- the pool itself
def _slow_square(x: int) -> int:
    time.sleep(0.001 * ((7 * x) % 5))  # later items often finish first
    return x * x


def _fail_at(x: int) -> int:
    if x == 13:
        raise InputError("no thirteen", "items.txt", 13)
    return x


def _die_at(x: int) -> int:
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_pool_results_come_in_input_order():
    with ChunkPool(_slow_square, 3) as pool:
        assert [(x, y) for x, y in pool.imap(range(40))] == [(x, x * x) for x in range(40)]


def test_pool_passes_an_input_error_on_with_its_place():
    with pytest.raises(InputError) as caught, ChunkPool(_fail_at, 2) as pool:
        list(pool.imap(range(30)))
    assert str(caught.value) == "items.txt:13: no thirteen"


def test_pool_notices_a_killed_worker():
    with pytest.raises(WorkerDied, match="died \\(signal 9"), ChunkPool(_die_at, 2) as pool:
        list(pool.imap(range(30)))


# ---------------------------------------------------------------------------- nbest --workers
NBEST_LIST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
NBEST_SOURCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"


def test_nbest_workers_write_the_bytes_of_one_process(tiny_model_path, tmp_path):
    ini = (DATA / "moses" / "multi30k.moses.ini").read_text(encoding="utf-8")
    weights = tmp_path / "w.ini"
    weights.write_text(ini + "RNNEncDec0= 0.5\n", encoding="utf-8")
    flags = ["--source", NBEST_SOURCE, "-m", tiny_model_path, "--chunk-lines", "30"]
    flags += ["--normalize", "--weights", weights, "--no-progress"]
    runs = {}
    for name, extra in {
        "one": ["--threads", "1"],
        "many": ["--workers", "3"],
        "part": ["--workers", "2", "--shard", "2/3"],
        "part1": ["--threads", "1", "--shard", "2/3"],
    }.items():
        out = tmp_path / f"{name}.gz"
        proc = run_cli("nbest", NBEST_LIST, "-o", out, *flags, *extra)
        assert proc.returncode == 0, proc.stderr
        runs[name] = out.read_bytes()
    assert runs["many"] == runs["one"]
    assert runs["part"] == runs["part1"]
    text = gzip.decompress(runs["one"]).decode()
    assert text.count("\n") == 324 and text.count("RNNEncDec0=") == 324
    # a list whose ids the source does not have: one error line, no output, workers stopped
    short = tmp_path / "short.en"
    short.write_text("".join(NBEST_SOURCE.read_text().splitlines(True)[:2]), encoding="utf-8")
    out = tmp_path / "bad.gz"
    args = [*flags[2:], "--source", short, "--workers", "2"]
    proc = run_cli("nbest", NBEST_LIST, "-o", out, *args)
    assert proc.returncode == 1 and "out of range" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


# ------------------------------------------------------------------ early input errors with workers
def _one_table_line_broken(tmp_path, how: str):
    """The real table with a problem the parent finds early: cut inside line 123 (a truncated
    gzip file) or line 123 with two fields."""
    lines = gzip.open(TABLE_GZ, "rb").read().splitlines(True)
    if how == "two-fields":
        lines[122] = b"only ||| two fields\n"
        data = gzip.compress(b"".join(lines), mtime=0)
    else:
        whole = gzip.compress(b"".join(lines), mtime=0)
        data = whole[: len(whole) * 40 // 100]
    path = tmp_path / "broken.gz"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("how", ["truncated", "two-fields"])
def test_an_early_input_error_with_workers_is_exactly_one_line(tiny_model_path, tmp_path, how):
    """An input error the parent finds early, with --workers 2, is the one error line and
    nothing else: no worker's 'Process phrasescore-worker-N: Traceback ... Terminated' before
    it (workers must not be stopped while they run the parent's SIGTERM handler)."""
    table = _one_table_line_broken(tmp_path, how)
    out = tmp_path / "out.gz"
    proc = run_cli("-q", "rescore", table, "-m", tiny_model_path, "-o", out, "--workers", "2",
                   "--no-progress")  # fmt: skip
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"phrasescore: error: {table}:")
    assert sorted(os.listdir(tmp_path)) == ["broken.gz"]


def test_nbest_an_early_input_error_with_workers_is_exactly_one_line(tiny_model_path, tmp_path):
    lines = gzip.open(NBEST_LIST, "rb").read().splitlines(True)
    lines[40] = b"0 ||| two fields\n"
    listing = tmp_path / "bad.nbest"
    listing.write_bytes(b"".join(lines))
    out = tmp_path / "out.gz"
    proc = run_cli("-q", "nbest", listing, "--source", NBEST_SOURCE, "-m", tiny_model_path,
                   "-o", out, "--workers", "2", "--no-progress")  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"phrasescore: error: {listing}:41: expected at least 4 fields separated by '|||' "
        "(id ||| hypothesis ||| features ||| total), found 2"
    ], proc.stderr


def _block_in_setup(parent, parent_alive) -> None:
    """A worker's start held up (as by a slow library lookup): says it got here, then
    waits until it is stopped."""
    os.write(_READY[1], b"!")
    time.sleep(3600)


_READY: tuple[int, int] = (-1, -1)


def test_workers_stopped_during_their_start_die_quietly(monkeypatch, capfd):
    """The parent's SIGTERM handler (every command's: it raises) must never run in a worker:
    workers stopped in the middle of their start end by the signal, printing nothing."""
    from phrasescore.runners import chunk_pool

    class Stop(BaseException):
        pass

    def parents_handler(signum, frame):
        raise Stop

    global _READY
    _READY = os.pipe()
    monkeypatch.setattr(chunk_pool, "_die_with_parent", _block_in_setup)
    previous = signal.signal(signal.SIGTERM, parents_handler)
    try:
        pool = ChunkPool(_slow_square, 2)
        assert os.read(_READY[0], 1) + os.read(_READY[0], 1) == b"!!"  # both are in their start
        pool.terminate()
    finally:
        signal.signal(signal.SIGTERM, previous)
        for fd in _READY:
            os.close(fd)
    assert [p.exitcode for p in pool.processes] == [-signal.SIGTERM] * 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and "phrasescore-worker" not in err, err
