"""A full disk: one line naming the file, exit 1, nothing under the final
name, and ``--resume`` once there is space again.

Standard output redirected to /dev/full (every write fails with ENOSPC) runs everywhere; the
file variants write to a real tmpfs of a few pages, which needs root (mount): they are skipped
where it cannot be mounted.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys

import pytest

from .conftest import DATA, run_cli

TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"
INI = DATA / "moses" / "multi30k.moses.ini"
NBEST_LIST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
NBEST_SOURCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"
FULL = "No space left on device"


def _to_dev_full(*args) -> subprocess.CompletedProcess:
    with open("/dev/full", "wb") as full:
        return subprocess.run(
            [sys.executable, "-m", "phrasescore", *map(str, args)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )


def _one_error_line(proc, expected: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"phrasescore: error: {expected}"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("workers", ["1", "2"])
def test_standard_output_on_a_full_disk_is_one_line(tiny_model_path, workers):
    flags = ["-m", tiny_model_path, "--chunk-lines", "40", "--no-progress", "--workers", workers]
    _one_error_line(
        _to_dev_full("rescore", TABLE, "-o", "-", *flags), f"<stdout>: cannot write: {FULL}"
    )
    nbest = ["--source", NBEST_SOURCE, "-m", tiny_model_path, "--no-progress", "--workers", workers]
    _one_error_line(_to_dev_full("nbest", NBEST_LIST, *nbest), f"<stdout>: cannot write: {FULL}")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_merge_to_a_full_standard_output_is_one_line(tiny_model_path, tmp_path):
    flags = ["-m", tiny_model_path, "--chunk-lines", "40", "--no-progress", "--threads", "1"]
    parts = [tmp_path / f"part.{k}.gz" for k in (1, 2)]
    for k, part in enumerate(parts, 1):
        assert run_cli("rescore", TABLE, *flags, "--shard", f"{k}/2", "-o", part).returncode == 0
    _one_error_line(
        _to_dev_full("merge-shards", *parts, "-o", "-"), f"<stdout>: cannot write: {FULL}"
    )


# ---------------------------------------------------------------------------- a small tmpfs
def _mount(folder, size: str, remount: bool = False) -> subprocess.CompletedProcess:
    options = f"remount,size={size}" if remount else f"size={size}"
    return subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True
    )


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 3 pages (12 KiB) at tmp_path/disk; skipped where it cannot be mounted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root")
    mounted = _mount(disk, "12k")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_full_disk_keeps_the_partial_and_resume_finishes(
    tiny_model_path, tmp_path, small_disk, workers
):
    flags = ["-m", tiny_model_path, "--chunk-lines", "10", "--no-progress", "--workers", workers]
    whole = tmp_path / "whole"
    assert run_cli("rescore", TABLE, *flags, "-o", whole).returncode == 0
    out = small_disk / "out"  # plain text: ~40 KB, more than the disk holds
    proc = run_cli("rescore", TABLE, *flags, "-o", out)
    _one_error_line(
        proc,
        f"{out}: cannot write the partial output .out.partial: {FULL}; it is kept: free "
        "space, then rerun with --resume",
    )
    assert sorted(os.listdir(small_disk)) == [".out.partial", ".out.partial.json"]
    assert _mount(small_disk, "1m", remount=True).returncode == 0
    resumed = run_cli("rescore", TABLE, *flags, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming after line" in resumed.stderr
    assert out.read_bytes() == whole.read_bytes()
    assert sorted(os.listdir(small_disk)) == ["out"]


def _fill(disk) -> None:
    """Fill the disk up (the writes that follow fail with ENOSPC)."""
    with open(disk / "filler", "wb", buffering=0) as fh, pytest.raises(OSError, match="No space"):
        while True:
            fh.write(b"\0" * 4096)


def test_ini_out_on_a_full_disk_is_one_line_and_resume_finishes(
    tiny_model_path, tmp_path, small_disk
):
    table = tmp_path / "phrase-table.gz"
    shutil.copy(TABLE, table)
    ini = tmp_path / "moses.ini"
    shutil.copy(INI, ini)  # path=phrase-table.gz, beside the ini
    _fill(small_disk)
    new_ini = small_disk / "moses.rescored.ini"
    out = tmp_path / "out.gz"
    flags = ["-m", tiny_model_path, "--no-progress", "--threads", "1", "-o", out]
    flags += ["--moses-ini", ini, "--ini-out", new_ini]
    proc = run_cli("rescore", table, *flags)
    _one_error_line(proc, f"{new_ini}: cannot write: {FULL}")
    assert not out.exists() and sorted(os.listdir(small_disk)) == ["filler"]
    os.unlink(small_disk / "filler")
    resumed = run_cli("rescore", table, *flags, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert out.exists() and new_ini.exists()
    assert gzip.decompress(out.read_bytes()).count(b"\n") == 300


def test_merge_on_a_full_disk_is_one_line_and_leaves_nothing(tiny_model_path, tmp_path, small_disk):
    flags = ["-m", tiny_model_path, "--chunk-lines", "40", "--no-progress", "--threads", "1"]
    parts = [tmp_path / f"part.{k}" for k in (1, 2)]
    for k, part in enumerate(parts, 1):
        assert run_cli("rescore", TABLE, *flags, "--shard", f"{k}/2", "-o", part).returncode == 0
    merged = small_disk / "merged"
    proc = run_cli("merge-shards", *parts, "-o", merged)
    _one_error_line(proc, f"{merged}: cannot write: {FULL}")
    assert os.listdir(small_disk) == []


def test_a_full_disk_during_train_is_one_line_and_leaves_nothing(corpus_files, small_disk):
    """A disk where the model (600 KB) fits but its checkpoint (1.8 MB) does not: one line
    naming the checkpoint, no traceback, and nothing left on the disk (no ``.checkpoint.tmp``, no
    model of an earlier validation under the final name)."""
    assert _mount(small_disk, "1500k", remount=True).returncode == 0
    model = small_disk / "m.safetensors"
    args = ["train", *corpus_files, "-o", model, "--preset", "tiny", "--max-steps", "4"]
    proc = run_cli(*args, "--valid-every", "2", "--no-progress", "--threads", "1")
    _one_error_line(proc, f"{model}.checkpoint: cannot write: {FULL}")
    assert os.listdir(small_disk) == []


STDOUT_COMMANDS = {
    "sample": lambda m, tmp: ["sample", "a dog", "-m", m, "-n", "5"],
    "info": lambda m, tmp: ["info", m],
    "represent": lambda m, tmp: ["represent", "-m", m, "-o", tmp / "rep", "--phrase-table",
                                 DATA / "moses" / "tiny.phrase-table", "--neighbours", "2"],
    "evaluate": lambda m, tmp: ["evaluate", NBEST_SOURCE, NBEST_SOURCE],
    "ini-tables": lambda m, tmp: ["ini-tables", INI],
    "compare": lambda m, tmp: ["compare", DATA / "moses" / "tiny.phrase-table", "-m", m,
                               "--sample", "2", "--min-targets", "1"],
}  # fmt: skip


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("command", sorted(STDOUT_COMMANDS))
def test_every_report_to_a_full_standard_output_is_one_line(tiny_model_path, tmp_path, command):
    """Every command that reports on standard output, given a full one, exits 1 with one line
    naming <stdout>: no exit 0 with the output lost, no traceback."""
    proc = _to_dev_full(*STDOUT_COMMANDS[command](tiny_model_path, tmp_path))
    _one_error_line(proc, f"<stdout>: cannot write: {FULL}")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("args", [["--help"], ["--version"], ["rescore", "--help"]], ids=" ".join)
def test_help_and_version_to_a_full_standard_output_are_one_line(args):
    """click's own output (help, version) to a full standard output is one line, no traceback."""
    _one_error_line(_to_dev_full(*args), f"<stdout>: cannot write: {FULL}")


@pytest.mark.skipif(
    not all(
        os.path.isfile(os.path.join(os.environ.get("MOSES_HOME", "/nonexistent"), "bin", tool))
        for tool in ("extractor", "mert")
    ),
    reason="needs a Moses build: set MOSES_HOME (bin/extractor, bin/mert)",
)
def test_a_full_disk_under_rerank_tunes_workdir_is_reported_as_one(tmp_path, small_disk):
    """The Moses extractor exits 0 with its files cut short by a full disk: the run reports the
    full disk in one line naming the workdir and writes no weights, instead of failing later on
    the cut files or tuning on features that are not all there."""
    nbest = tmp_path / "list.nbest"
    nbest.write_bytes(gzip.decompress(NBEST_LIST.read_bytes()))  # plain: read in place
    reference = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.fr"
    work = small_disk / "wd"
    proc = run_cli(
        "rerank-tune", nbest, "--reference", reference, "--workdir", work, "-o", tmp_path / "w"
    )
    _one_error_line(
        proc,
        f"{work}: cannot write: {FULL} (the disk filled up while extractor ran: its files here "
        "are incomplete)",
    )
    assert not (tmp_path / "w").exists()
