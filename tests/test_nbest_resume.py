"""``nbest --resume``: a run killed (SIGKILL) after some chunks goes on after its last complete
chunk and ends with the bytes of an uninterrupted run; a resume of another list, model or flags
is refused naming what differs, the partial output kept.

The list is the real Multi30k 100-best list of test2016 ids 0-4 (324 hypotheses: 100, 100, 66,
12, 46); with ``--chunk-lines 50`` it is cut into 4 chunks of 100, 100, 66 and 58 lines. A run is
killed by a hook in its own process that sends it SIGKILL right after its Nth chunk is appended
(the partial output and its state synced), never on a timer.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys

import pytest

from .conftest import DATA, run_cli
from .test_nbest import weights_file

LIST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
SOURCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"

_KILLED_AFTER = """
import os, signal, sys
from phrasescore.cli import main
from phrasescore.runners.partial import PartialOutput

chunks = int(sys.argv.pop(1))
append = PartialOutput.append_chunk
appended = []

def append_then_die(self, *args, **kwargs):
    append(self, *args, **kwargs)
    appended.append(1)
    if len(appended) == chunks:
        os.kill(os.getpid(), signal.SIGKILL)

PartialOutput.append_chunk = append_then_die
sys.argv[0] = "phrasescore"
main()
"""


def _killed_after(chunks: int, *args) -> subprocess.CompletedProcess:
    """``phrasescore ARGS`` in a fresh process that kills itself after its ``chunks``-th chunk."""
    return subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER, str(chunks), *map(str, args)],
        capture_output=True,
        text=True,
    )


def _flags(model: str, *extra) -> list:
    return [LIST, "--source", SOURCE, "-m", model, "--chunk-lines", "50", "--no-progress",
            "--threads", "1", *extra]  # fmt: skip


def _state(output) -> dict:
    return json.loads((output.parent / f".{output.name}.partial.json").read_text())


@pytest.mark.parametrize("one_best", [False, True], ids=["list-gz", "one-best"])
def test_a_killed_nbest_resumes_after_its_last_chunk_with_the_bytes_of_a_whole_run(
    tiny_model_path, tmp_path, one_best
):
    extra = ["--weights", weights_file(tmp_path, 0.5), "--one-best"] if one_best else []
    name = "best.txt" if one_best else "out.gz"
    out = tmp_path / "killed" / name
    out.parent.mkdir()
    killed = _killed_after(2, "nbest", *_flags(tiny_model_path, *extra), "-o", out)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not out.exists()  # never under its name before it is whole
    assert _state(out)["lines"] == (2 if one_best else 200)  # ids 0 and 1: 100 lines each
    resumed = run_cli("nbest", *_flags(tiny_model_path, *extra), "--resume", "-o", out)
    assert resumed.returncode == 0, resumed.stderr
    summary = resumed.stderr.strip().splitlines()[-1]
    assert summary.startswith(
        "phrasescore: 324 hypotheses of 5 sentences (resumed after 200 hypotheses), "
    ), summary
    whole = tmp_path / "whole" / name
    whole.parent.mkdir()
    alone = run_cli("nbest", *_flags(tiny_model_path, *extra), "-o", whole)
    assert alone.returncode == 0, alone.stderr
    assert out.read_bytes() == whole.read_bytes()
    assert sorted(p.name for p in out.parent.iterdir()) == [name]  # no partial output left
    text = out.read_text() if one_best else gzip.decompress(out.read_bytes()).decode()
    assert text.count("\n") == (5 if one_best else 324)
    if one_best:  # the changed count survives the kill: the resumed summary is the whole run's
        assert summary.split(", ")[2] == alone.stderr.strip().splitlines()[-1].split(", ")[2]


def test_a_resume_with_another_flag_is_refused_naming_it_and_the_partial_is_kept(
    tiny_model_path, tmp_path
):
    out = tmp_path / "out.gz"
    killed = _killed_after(1, "nbest", *_flags(tiny_model_path), "-o", out)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    partial = tmp_path / ".out.gz.partial"
    before = partial.read_bytes(), _state(out)
    other = run_cli("nbest", *_flags(tiny_model_path, "--normalize"), "--resume", "-o", out)
    assert other.returncode == 1
    assert other.stderr.strip().splitlines()[-1] == (
        f"phrasescore: error: {out}: cannot resume: the partial output was made from another "
        "input, model or flags (--normalize differs; run without --resume to start again)"
    )
    assert (partial.read_bytes(), _state(out)) == before
    chunks = run_cli("nbest", *_flags(tiny_model_path), "--chunk-lines", "60", "--resume",
                     "-o", out)  # fmt: skip
    assert chunks.returncode == 1
    assert "(--chunk-lines differs; run without --resume" in chunks.stderr
    # the pair plan's values differ from the tries' in their last digits: not mixed in one list
    plan = run_cli("nbest", *_flags(tiny_model_path, "--no-shared-prefixes"), "--resume",
                   "-o", out)  # fmt: skip
    assert plan.returncode == 1
    assert "(--shared-prefixes differs; run without --resume" in plan.stderr
    assert (partial.read_bytes(), _state(out)) == before


def test_a_resume_of_a_finished_shard_does_nothing_and_says_so(tiny_model_path, tmp_path):
    part = tmp_path / "part.1.gz"
    flags = [*_flags(tiny_model_path), "--shard", "1/2", "--resume", "-o", part]
    first = run_cli("nbest", *flags)
    assert first.returncode == 0, first.stderr
    assert "nothing to resume" in first.stderr
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    again = run_cli("nbest", *flags)
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip().splitlines()[-1] == (
        f"phrasescore: {part} is complete already (166 hypotheses of 2 sentences): nothing to do"
    )  # chunks 0 and 2: ids 0 and 2, 100 and 66 lines
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_resume_needs_an_output_file(tiny_model_path):
    proc = run_cli("nbest", *_flags(tiny_model_path), "--resume", "-o", "-")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "phrasescore: error: --resume needs an output file, not standard output"
    )
    assert proc.stdout == ""


@pytest.mark.parametrize("command", ["rescore", "nbest"])
def test_resume_from_a_named_pipe_is_refused_in_one_line_before_reading_it(
    command, tiny_model_path, tmp_path
):
    """A resume reads its input again from the start, which a pipe cannot give twice: the
    refusal names the pipe, before anything opens it (no writer ever comes, so a read would
    hang), and no output file appears."""
    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out.gz"
    args = [fifo, "-m", tiny_model_path, "--no-progress", "--resume", "-o", out]
    if command == "nbest":
        args[1:1] = ["--source", SOURCE]
    proc = run_cli(command, *args, timeout=120)
    what = "table" if command == "rescore" else "list"
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"phrasescore: error: {fifo}: --resume reads the {what} again from its start: give the "
        "file, not a pipe"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.fifo"]
