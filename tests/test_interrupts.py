"""SIGTERM, SIGKILL and dead workers: workers die with their parent,
SIGTERM is Ctrl-C, a killed worker is one line, nothing is left behind but the partial output.

Every run reads standard input from a pipe that the test keeps open, so it cannot finish before
the test has done what it tests, however fast or loaded the machine is; the test waits for
states by polling with generous deadlines, never by sleeping a fixed time.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from phrasescore.runners.chunk_pool import ChunkPool, WorkerDied

from .conftest import DATA, run_cli

TABLE_GZ = DATA / "moses" / "multi30k.head300.phrase-table.gz"
NBEST_LIST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
NBEST_SOURCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"
DEADLINE = 300


def _lines_done(state) -> int:
    try:
        return json.loads(state.read_text())["lines"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _group(pgid: int) -> list[int]:
    """The processes of a process group (a killed parent's workers keep its group)."""
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(child) for child in out.split()]


@contextlib.contextmanager
def _started(args: list, lines: list[str]):
    """``phrasescore ARGS`` in a session of its own, given ``lines`` on a standard input that
    stays open; on the way out whatever is left of the session is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "phrasescore", *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        proc.stdin.write("".join(lines).encode("utf-8"))
        proc.stdin.flush()
        yield proc
    finally:
        for pid in _group(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        proc.wait()


def _table_lines() -> list[str]:
    return gzip.open(TABLE_GZ, "rt", encoding="utf-8").read().splitlines(True)


def _rescore_flags(model: str, workers: int) -> list:
    flags = ["-m", model, "--chunk-lines", "10", "--no-progress"]
    return flags + (["--workers", str(workers)] if workers > 1 else ["--threads", "1"])


def _resume_gives_one_process_bytes(model, part, workers: int) -> None:
    text = "".join(_table_lines())
    flags = _rescore_flags(model, workers)
    resumed = run_cli("rescore", "-", "-o", part, *flags, "--resume", input=text)
    assert resumed.returncode == 0, resumed.stderr
    alone = run_cli("rescore", "-", "-o", "-", *_rescore_flags(model, 1), input=text)
    assert gzip.decompress(part.read_bytes()).decode() == alone.stdout


# ---------------------------------------------------------------- SIGTERM and SIGKILL of the parent
@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_is_ctrl_c_partial_kept_exit_143(tiny_model_path, tmp_path, workers):
    part = tmp_path / "part.gz"
    args = ["rescore", "-", "-o", part, *_rescore_flags(tiny_model_path, workers)]
    state = tmp_path / ".part.gz.partial.json"
    with _started(args, _table_lines()[:100]) as proc:
        _wait_for(lambda: _lines_done(state) >= 50, "50 lines written")
        if workers > 1:
            assert len(_children(proc.pid)) == workers
        os.kill(proc.pid, signal.SIGTERM)  # the parent alone, as `kill PID`
        _, err = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 143
        assert err.decode().strip().splitlines()[-1] == "phrasescore: terminated (SIGTERM)"
        assert "Traceback" not in err.decode()
        _wait_for(lambda: _group(proc.pid) == [], "the workers to end")
    assert sorted(os.listdir(tmp_path)) == [".part.gz.partial", ".part.gz.partial.json"]
    _resume_gives_one_process_bytes(tiny_model_path, part, workers)


def test_workers_die_with_a_parent_killed_by_sigkill(tiny_model_path, tmp_path):
    part = tmp_path / "part.gz"
    args = ["rescore", "-", "-o", part, *_rescore_flags(tiny_model_path, 2)]
    state = tmp_path / ".part.gz.partial.json"
    with _started(args, _table_lines()[:100]) as proc:
        _wait_for(lambda: _lines_done(state) >= 50, "50 lines written")
        workers = _children(proc.pid)
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        _wait_for(lambda: _group(proc.pid) == [], "the workers to die with their parent")
    assert not part.exists() and state.exists()
    _resume_gives_one_process_bytes(tiny_model_path, part, 2)


# ---------------------------------------------------------------------------- a worker killed
WORKER_DIED = re.compile(
    r"phrasescore: error: worker [12] died \(signal 9; out of memory\?\)"
    r"( at chunk \d+ \(lines \d+-\d+\))?; rerun with --resume"
)


def test_a_worker_killed_by_sigkill_is_one_line_and_the_partial_is_kept(tiny_model_path, tmp_path):
    lines = _table_lines()
    part = tmp_path / "part.gz"
    args = ["rescore", "-", "-o", part, *_rescore_flags(tiny_model_path, 2)]
    state = tmp_path / ".part.gz.partial.json"
    with _started(args, lines[:100]) as proc:
        _wait_for(lambda: _lines_done(state) >= 50, "50 lines written")
        for worker in _children(proc.pid):  # as the OOM killer would
            # the parent notices the first death at once and stops the other worker itself:
            # that one may be gone by now
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
        rest = "".join(lines[100:]).encode("utf-8")  # work that no worker is left to take
        _, err = proc.communicate(rest, timeout=DEADLINE)
    assert proc.returncode == 1
    last = err.decode().strip().splitlines()[-1]
    assert WORKER_DIED.fullmatch(last), err.decode()
    assert "Traceback" not in err.decode()
    assert not part.exists() and _lines_done(state) >= 50
    _resume_gives_one_process_bytes(tiny_model_path, part, 2)


def _die_at(x: int) -> int:
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_the_pool_names_the_dead_worker_and_its_chunk():
    with pytest.raises(WorkerDied) as caught, ChunkPool(_die_at, 2) as pool:
        list(pool.imap(range(30)))
    assert re.fullmatch(
        r"worker [12] died \(signal 9; out of memory\?\) at chunk 5", str(caught.value)
    )


# ---------------------------------------------------------------------------- n-best stopped
@pytest.mark.parametrize("workers", [1, 2])
def test_nbest_stopped_by_sigterm_keeps_its_partial_output_for_resume(
    tiny_model_path, tmp_path, workers
):
    listing = gzip.open(NBEST_LIST, "rt", encoding="utf-8").read().splitlines(True)
    out = tmp_path / "out.gz"
    # one chunk per sentence (100, 100, 66, 12, 46 lines): the first 290 lines hold 4 whole
    # sentences, as many chunks as 2 workers keep in flight, and id 4's stays open
    one = ["--source", NBEST_SOURCE, "-m", tiny_model_path, "--chunk-lines", "1", "--no-progress"]
    flags = [*one, "-o", out, *(["--workers", str(workers)] if workers > 1 else ["--threads", "1"])]
    state = tmp_path / ".out.gz.partial.json"
    with _started(["nbest", "-", *flags], listing[:290]) as proc:
        _wait_for(lambda: _lines_done(state) >= 100, "the first chunk written")
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 143, err.decode()
        assert err.decode().strip().splitlines()[-1] == "phrasescore: terminated (SIGTERM)"
        _wait_for(lambda: _group(proc.pid) == [], "the workers to end")
    assert sorted(os.listdir(tmp_path)) == [".out.gz.partial", ".out.gz.partial.json"]
    done = _lines_done(state)
    resumed = run_cli("nbest", "-", *flags, "--resume", input="".join(listing))
    assert resumed.returncode == 0, resumed.stderr
    assert f"(resumed after {done} hypotheses)" in resumed.stderr
    alone = run_cli("nbest", "-", *one, "--threads", "1", "-o", "-", input="".join(listing))
    assert gzip.decompress(out.read_bytes()).decode() == alone.stdout


# ------------------------------------------------------------------ a worker's death wakes the pool
_WAIT_FOR_A_DEATH = """
import os, signal, sys
from phrasescore.runners import chunk_pool

chunk_pool.POLL_SECONDS = 3600.0  # no looking around on a timer: a death must wake the parent

def work(x):
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return x

try:
    with chunk_pool.ChunkPool(work, 2) as pool:
        list(pool.imap(range(30)))
except chunk_pool.WorkerDied as exc:
    print(exc)
"""


def test_the_pool_is_woken_by_a_workers_death_not_by_a_timer():
    """A worker's end wakes the parent at once, even with POLL_SECONDS set to an hour: a parent
    that looked at its workers only after POLL_SECONDS without a result would wait that long
    (the deadline only keeps a broken run from hanging the suite)."""
    proc = subprocess.run(
        [sys.executable, "-c", _WAIT_FOR_A_DEATH], capture_output=True, text=True, timeout=DEADLINE
    )
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(
        r"worker [12] died \(signal 9; out of memory\?\) at chunk 5\n", proc.stdout
    ), proc.stdout


# ------------------------------------------------------------- a signal as a temporary file is made
class _Stop(BaseException):
    pass


def _raise_stop(signum, frame):
    raise _Stop


@pytest.mark.parametrize("writer", ["AtomicOutput", "atomic_path", "StagedFile"])
def test_a_sigterm_as_the_temporary_file_is_made_leaves_nothing(tmp_path, monkeypatch, writer):
    """SIGTERM (every command's Ctrl-C) landing between the creation of a temporary file and
    the recording of its name would leave the file behind for ever, unknown to the clean-up:
    the signal is held back until the name is known."""
    from phrasescore.files import outputs as files

    made = files._temporary_beside

    def made_then_signalled(path):
        fd, tmp = made(path)
        os.kill(os.getpid(), signal.SIGTERM)  # as if it came right now
        return fd, tmp

    monkeypatch.setattr(files, "_temporary_beside", made_then_signalled)
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    # another thread, as a command has (PyTorch's): the kernel may hand it the signal, and
    # Python runs the handler in the main thread all the same
    other_thread_ends = threading.Event()
    other = threading.Thread(target=other_thread_ends.wait)
    other.start()
    try:
        with pytest.raises(_Stop):
            if writer == "AtomicOutput":
                with files.AtomicOutput(str(tmp_path / "out.gz")) as out:
                    out.write("never\n")
            elif writer == "atomic_path":
                with files.atomic_path(str(tmp_path / "model.safetensors")):
                    pass
            else:
                files.StagedFile(str(tmp_path / "moses.ini"), "never\n")
    finally:
        signal.signal(signal.SIGTERM, previous)
        other_thread_ends.set()
        other.join()
    assert os.listdir(tmp_path) == []


def test_an_interrupt_at_the_rename_leaves_nothing(tmp_path, monkeypatch):
    from phrasescore.files import outputs as files

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt), files.AtomicOutput(str(tmp_path / "out")) as out:
        out.write("complete, but never renamed\n")
    assert os.listdir(tmp_path) == []
