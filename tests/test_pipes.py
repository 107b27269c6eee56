"""Inputs read once work from named pipes and /dev/fd/N (bash's `<(zcat f.gz)`)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading

import pytest

from phrasescore.errors import InputError
from phrasescore.jobs.training.train_lm import run_lm_training

from .conftest import DATA, train_tiny
from .conftest import run_cli as conftest_run_cli

TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"


def fifo_with(tmp_path, name: str, data: bytes) -> str:
    """A named pipe that a background thread fills with ``data`` once a reader opens it."""
    path = str(tmp_path / name)
    os.mkfifo(path)

    def feed():
        with open(path, "wb") as fh:
            fh.write(data)

    threading.Thread(target=feed, daemon=True).start()
    return path


def run_cli(*args):
    return conftest_run_cli(*args, timeout=300)


def test_rescore_reads_a_named_pipe(tiny_model_path, tmp_path):
    from_file = run_cli("rescore", TABLE, "-m", tiny_model_path, "-o", tmp_path / "a.gz")
    assert from_file.returncode == 0, from_file.stderr
    pipe = fifo_with(tmp_path, "pt", TABLE.read_bytes())
    from_pipe = run_cli("rescore", pipe, "-m", tiny_model_path, "-o", tmp_path / "b.gz")
    assert from_pipe.returncode == 0, from_pipe.stderr
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()


def test_rescore_resume_refuses_a_pipe_in_one_line(tiny_model_path, tmp_path):
    pipe = str(tmp_path / "pt")
    os.mkfifo(pipe)  # never opened: refused before reading
    proc = run_cli("rescore", pipe, "-m", tiny_model_path, "-o", tmp_path / "o", "--resume")
    assert proc.returncode == 1
    assert f"phrasescore: error: {pipe}: --resume reads the table again" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_directory_is_reported_as_a_directory(tmp_path):
    proc = run_cli("rescore", tmp_path, "-m", "model", "-o", tmp_path / "o")
    assert proc.returncode == 1
    assert f"{tmp_path}: is a directory" in proc.stderr


def test_train_reads_its_corpus_from_pipes_once(tmp_path, corpus_files):
    src = fifo_with(tmp_path, "src", open(corpus_files[0], "rb").read())
    tgt = fifo_with(tmp_path, "tgt", open(corpus_files[1], "rb").read())
    result = train_tiny(tmp_path / "m.safetensors", src, tgt, max_steps=2)
    assert result.steps == 2


def test_train_lm_says_it_needs_two_passes(tmp_path):
    pipe = str(tmp_path / "corpus")
    os.mkfifo(pipe)
    with pytest.raises(InputError, match="reads its files twice"):
        run_lm_training(str(tmp_path / "lm.safetensors"), pipe)


def test_shard_and_torchrun_refuse_a_pipe_in_one_line(tiny_model_path, tmp_path, corpus_files):
    # every rank (torchrun) reads the whole input, and a shard's manifest reads the table again
    pipe = str(tmp_path / "pt")
    os.mkfifo(pipe)  # never opened: refused before reading
    out = tmp_path / "o.gz"
    proc = run_cli("rescore", pipe, "-m", tiny_model_path, "-o", out, "--shard", "1/2")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{pipe}: --shard reads the table again" in proc.stderr
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    command = [sys.executable, "-m", "phrasescore", "rescore", pipe, "-m", tiny_model_path]
    proc = subprocess.run(
        [*command, "-o", str(out)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "under torchrun give an input file and an output file" in proc.stderr
    command = [sys.executable, "-m", "phrasescore", "train", pipe, corpus_files[1]]
    proc = subprocess.run(
        [*command, "-o", str(tmp_path / "m.st")], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{pipe}: under torchrun every rank reads the corpus" in proc.stderr
    assert not out.exists() and not (tmp_path / "m.st").exists()


@pytest.mark.parametrize("command", ["rescore"])  # copy-table and nbest exit 141 as well
def test_a_closed_pipe_on_standard_output_fails_the_command(command, tiny_model_path, tmp_path):
    """``rescore -o - | head -1`` exits 141, as a shell reports SIGPIPE, with no summary line:
    one write larger than the pipe, cut short by the reader's end, returns a short count
    without an error, which must not pass for a written table."""
    table = tmp_path / "table"
    table.write_bytes(gzip.decompress(TABLE.read_bytes()) * 16)  # more than a pipe holds
    model = ["-m", tiny_model_path, "--no-progress"] if command == "rescore" else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "phrasescore", command, str(table), *model, "-o", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline().startswith(b"! &quot; ||| ")
    proc.stdout.close()  # as head -1 does
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, stderr
    assert "->" not in stderr and "Traceback" not in stderr
