"""--resume that does not trust its state, and the Slurm-array recipe."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest

from phrasescore.errors import InputError
from phrasescore.jobs.rescore.columns import NewColumns
from phrasescore.jobs.rescore.rescore import RescoreOptions, rescore_table
from phrasescore.runners.shards import Shard

from .conftest import DATA, run_cli

TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"  # 300 lines, 205 distinct sources


def _interrupt_after(monkeypatch, chunks: int) -> None:
    """Make the next rescore stop (KeyboardInterrupt) when it starts chunk ``chunks`` + 1."""
    original = NewColumns.format_chunk
    calls = []

    def interrupted(self, chunk, *args):
        calls.append(1)
        if len(calls) > chunks:
            raise KeyboardInterrupt
        return original(self, chunk, *args)

    monkeypatch.setattr(NewColumns, "format_chunk", interrupted)


def _interrupted_run(monkeypatch, model, out, chunks=2, **kw):
    _interrupt_after(monkeypatch, chunks)
    with pytest.raises(KeyboardInterrupt):
        rescore_table(str(TABLE), [model], str(out), RescoreOptions(chunk_lines=40), **kw)
    monkeypatch.undo()


# --------------------------------------------------------------------------- the Slurm-array recipe
def test_slurm_recipe_resume_starts_fresh_and_a_finished_part_is_left_alone(
    tiny_model_path, tmp_path
):
    flags = ["-m", tiny_model_path, "--chunk-lines", "40", "--no-progress", "--threads", "1"]
    parts = tmp_path / "parts"
    parts.mkdir()
    for k in (1, 2):  # first submission: nothing to resume
        proc = run_cli("rescore", TABLE, *flags, "--resume", "--shard", f"{k}/2", "-o",
                       parts / f"part.{k}.gz")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "nothing to resume" in proc.stderr and "starting from the beginning" in proc.stderr
    assert "rescored 140 lines, 94 distinct sources" in proc.stderr  # chunks 1, 3, 5, 7
    before = {p.name: p.read_bytes() for p in parts.iterdir()}
    # a requeued task whose part is complete: exit 0, nothing done, nothing changed
    again = run_cli("rescore", TABLE, *flags, "--resume", "--shard", "2/2", "-o",
                    parts / "part.2.gz")  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines()[-1] == (
        f"phrasescore: {parts / 'part.2.gz'} is complete already (140 lines, 94 distinct "
        "sources, +1 column(s)): nothing to do"
    )
    assert "complete already (its manifest matches)" in again.stderr
    assert {p.name: p.read_bytes() for p in parts.iterdir()} == before
    merged = run_cli("merge-shards", parts / "part.1.gz", parts / "part.2.gz", "-o",
                     tmp_path / "all.gz")  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    whole = run_cli("rescore", TABLE, *flags, "-o", tmp_path / "whole.gz")
    assert whole.returncode == 0, whole.stderr
    assert (tmp_path / "all.gz").read_bytes() == (tmp_path / "whole.gz").read_bytes()
    # a finished part of other flags is not taken for this job's
    other = run_cli("rescore", TABLE, *flags, "--normalize", "--resume", "--shard", "2/2",
                    "-o", parts / "part.2.gz")  # fmt: skip
    assert other.returncode == 1
    assert other.stderr.strip().splitlines()[-1] == (
        f"phrasescore: error: {parts / 'part.2.gz'}: cannot resume: a finished part of another "
        "input, shard, model or flags is here (run without --resume to replace it)"
    )
    assert {p.name: p.read_bytes() for p in parts.iterdir()} == before


def test_resume_without_shard_and_nothing_to_resume_starts_fresh(tiny_model_path, tmp_path):
    out = tmp_path / "out.gz"
    flags = ["-m", tiny_model_path, "--chunk-lines", "40", "--no-progress", "--threads", "1"]
    proc = run_cli("rescore", TABLE, *flags, "--resume", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "rescored 300 lines, 205 distinct sources" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["out.gz"]
    assert gzip.decompress(out.read_bytes()).count(b"\n") == 300


# --------------------------------------------------- a partial output that disagrees with its state
@pytest.fixture
def interrupted(tiny_model_path, tmp_path, monkeypatch):
    """An output stopped after 2 chunks of 40 lines: (output, partial, state)."""
    out = tmp_path / "out.gz"
    _interrupted_run(monkeypatch, tiny_model_path, out, progress=False)
    partial, state = tmp_path / ".out.gz.partial", tmp_path / ".out.gz.partial.json"
    assert json.loads(state.read_text())["lines"] == 80
    return out, partial, state


def _resume(model, out):
    return rescore_table(
        str(TABLE), [model], str(out), RescoreOptions(chunk_lines=40), resume=True, progress=False
    )


def test_a_partial_shorter_than_its_state_is_refused(interrupted, tiny_model_path):
    out, partial, state = interrupted
    size = partial.stat().st_size
    with open(partial, "r+b") as fh:
        fh.truncate(size - 10)
    with pytest.raises(InputError) as caught:
        _resume(tiny_model_path, out)
    assert str(caught.value) == (
        f"{partial}: partial output has {size - 10} bytes, its state .out.gz.partial.json "
        f"records {size}: truncated or changed since; run without --resume to start again"
    )
    assert partial.stat().st_size == size - 10 and not out.exists()


def test_a_changed_last_chunk_is_refused(interrupted, tiny_model_path):
    out, partial, state = interrupted
    data = bytearray(partial.read_bytes())
    data[-12] ^= 0xFF  # inside the last gzip member (its CRC field)
    partial.write_bytes(bytes(data))
    with pytest.raises(InputError, match="CRC-32 of its last chunk differs"):
        _resume(tiny_model_path, out)
    assert not out.exists()


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: "{not json",
        lambda s: json.dumps({**json.loads(s), "lines": -5}),
        lambda s: json.dumps({**json.loads(s), "bytes": "12"}),
        lambda s: json.dumps({k: v for k, v in json.loads(s).items() if k != "last_chunk"}),
        lambda s: "[1, 2]",
    ],
    ids=["not-json", "negative-lines", "string-bytes", "no-last-chunk", "a-list"],
)
def test_an_unreadable_or_invalid_state_is_one_error_naming_it(interrupted, tiny_model_path, edit):
    out, partial, state = interrupted
    state.write_text(edit(state.read_text()))
    with pytest.raises(InputError) as caught:
        _resume(tiny_model_path, out)
    message = str(caught.value)
    assert message.startswith(f"{state}: ") and message.endswith(
        "; run without --resume to start again"
    )
    assert not out.exists()


def test_cli_refuses_a_state_of_negative_lines_in_one_line(interrupted, tiny_model_path):
    out, partial, state = interrupted
    state.write_text(json.dumps({**json.loads(state.read_text()), "lines": -5}))
    proc = run_cli("rescore", TABLE, "-m", tiny_model_path, "--chunk-lines", "40", "-o", out,
                   "--resume", "--no-progress")  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"phrasescore: error: {state}: invalid resume state (lines, bytes or last chunk missing "
        "or out of range); run without --resume to start again"
    )
    assert "Traceback" not in proc.stderr and not out.exists()


def test_a_partial_ending_inside_a_chunk_is_refused(interrupted, tiny_model_path):
    out, partial, state = interrupted
    saved = json.loads(state.read_text())
    state.write_text(json.dumps({**saved, "lines": 79}))
    # the kept prefix is counted first: its 80 lines are not the state's 79
    with pytest.raises(InputError, match="has 80 lines, its state .out.gz.partial.json records 79"):
        _resume(tiny_model_path, out)


# ------------------------------------------------------------------- the summary of a resumed shard
def test_the_summary_of_a_resumed_shard_is_the_uninterrupted_one(
    tiny_model_path, tmp_path, monkeypatch
):
    options = dict(shard=Shard(1, 2), progress=False)
    whole = rescore_table(
        str(TABLE), [tiny_model_path], str(tmp_path / "whole.gz"), RescoreOptions(chunk_lines=40),
        **options,
    )  # fmt: skip
    out = tmp_path / "part.gz"
    _interrupted_run(monkeypatch, tiny_model_path, out, **options)
    resumed = rescore_table(
        str(TABLE), [tiny_model_path], str(out), RescoreOptions(chunk_lines=40), resume=True,
        **options,
    )  # fmt: skip
    assert resumed.resumed_from_line == 80
    assert (resumed.lines, resumed.distinct_sources) == (whole.lines, whole.distinct_sources)
    assert (whole.lines, whole.distinct_sources) == (160, 114)
    assert out.read_bytes() == (tmp_path / "whole.gz").read_bytes()


# --------------------------------------------------------------- a directory where the partial goes
def test_a_directory_at_the_partial_path_is_one_line_and_nothing_is_left(tiny_model_path, tmp_path):
    (tmp_path / ".out.gz.partial").mkdir()
    proc = run_cli("rescore", TABLE, "-m", tiny_model_path, "-o", tmp_path / "out.gz",
                   "--no-progress")  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"phrasescore: error: {tmp_path / '.out.gz.partial'}: is a directory where the partial "
        "output goes: remove it"
    ]
    assert sorted(os.listdir(tmp_path)) == [".out.gz.partial"]


# ---------------------------------------------------------------------------- shards without -o
def test_shards_without_output_get_one_file_each(tiny_model_path, tmp_path):
    table = tmp_path / "pt.gz"
    shutil.copy(TABLE, table)
    flags = ["-m", tiny_model_path, "--chunk-lines", "40", "--no-progress", "--threads", "1"]
    for k in (1, 2, 3):
        proc = run_cli("rescore", table, *flags, "--shard", f"{k}/3")
        assert proc.returncode == 0, proc.stderr
    parts = [tmp_path / f"pt.rescored.part-{k}-of-3.gz" for k in (1, 2, 3)]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["pt.gz"] + [p.name for p in parts] + [p.name + ".manifest.json" for p in parts]
    )
    merged = run_cli("merge-shards", *parts, "-o", tmp_path / "pt.rescored.gz")
    assert merged.returncode == 0, merged.stderr
    assert gzip.decompress((tmp_path / "pt.rescored.gz").read_bytes()).count(b"\n") == 300


def test_torchrun_refuses_a_directory_at_a_ranks_partial_path_before_any_work(
    tiny_model_path, tmp_path
):
    from .test_distributed import torchrun

    blocker = tmp_path / "..out.gz.shard-2-of-2.gz.partial"  # rank 1's partial part
    blocker.mkdir()
    flags = ["-m", tiny_model_path, "--no-progress", "--threads", "1"]
    result = torchrun("-m", "phrasescore", "rescore", TABLE, *flags, "-o", tmp_path / "out.gz")
    assert result.returncode != 0
    errors = {line for line in result.stderr.splitlines() if line.startswith("phrasescore: error")}
    assert errors == {
        f"phrasescore: error: {blocker}: is a directory where the partial output goes: remove it"
    }, result.stderr
    assert os.listdir(tmp_path) == [blocker.name]  # rank 0 wrote nothing either


# ------------------------------------------------------------ damaged partials, live runs and locks
def _member_sizes(data: bytes) -> list[int]:
    """The sizes of the gzip members of ``data``, in order."""
    import zlib

    sizes = []
    while data:
        decomp = zlib.decompressobj(wbits=31)
        decomp.decompress(data)
        used = len(data) - len(decomp.unused_data)
        sizes.append(used)
        data = decomp.unused_data
    return sizes


def test_a_partial_damaged_in_its_middle_is_refused_never_published(interrupted, tiny_model_path):
    out, partial, state = interrupted
    data = bytearray(partial.read_bytes())
    first = _member_sizes(bytes(data))[0]
    assert first < len(data) // 2 + 200  # two chunks: the damage is well before the last one
    for i in (first // 2, first // 2 + 1, first // 2 + 2):
        data[i] ^= 0x55
    partial.write_bytes(bytes(data))
    with pytest.raises(InputError) as caught:
        _resume(tiny_model_path, out)
    assert str(caught.value) == (
        f"{partial}: partial output does not match its state (the CRC-32 of its first "
        f"{len(data)} bytes differs): damaged since it was written; run without --resume to "
        "start again"
    )
    assert not out.exists() and partial.read_bytes() == bytes(data)


def test_cli_refuses_a_plain_partial_damaged_in_its_middle_in_one_line(
    tiny_model_path, tmp_path, monkeypatch
):
    out = tmp_path / "out.txt"
    _interrupted_run(monkeypatch, tiny_model_path, out, progress=False)
    partial = tmp_path / ".out.txt.partial"
    text = partial.read_bytes()
    assert text.count(b"\n") == 80
    damaged = text.replace(b" ||| ", b" ||x ", 1)  # line 1, the first chunk
    assert len(damaged) == len(text) and damaged != text
    partial.write_bytes(damaged)
    proc = run_cli("rescore", TABLE, "-m", tiny_model_path, "--chunk-lines", "40", "-o", out,
                   "--dtype", "float32", "--resume", "--no-progress", "--threads", "1")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"phrasescore: error: {partial}: partial output does not match its state (the CRC-32 of "
        f"its first {len(text)} bytes differs): damaged since it was written; run without "
        "--resume to start again"
    )
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize("lines", [120, 40])
def test_a_state_whose_lines_disagree_with_the_partial_is_refused(
    interrupted, tiny_model_path, lines
):
    """15000 edited to 16000 in a valid state: the output would be 1,000 lines short."""
    out, partial, state = interrupted
    state.write_text(json.dumps({**json.loads(state.read_text()), "lines": lines}))
    with pytest.raises(InputError) as caught:
        _resume(tiny_model_path, out)
    assert str(caught.value) == (
        f"{partial}: partial output has 80 lines, its state .out.gz.partial.json records "
        f"{lines}: changed since it was written; run without --resume to start again"
    )
    assert not out.exists()


def test_a_state_of_an_earlier_version_without_a_crc_starts_again_with_a_warning(
    interrupted, tiny_model_path, tmp_path, caplog
):
    out, partial, state = interrupted
    saved = json.loads(state.read_text())
    del saved["crc32"]
    state.write_text(json.dumps(saved))
    with caplog.at_level("WARNING"):
        result = _resume(tiny_model_path, out)
    assert result.resumed_from_line == 0 and result.lines == 300
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"{partial}: its resume state records no CRC-32 of the whole partial output (an "
        "earlier phrasescore wrote it), so its 80 lines cannot be checked: starting again from "
        "the beginning"
    ]
    whole = rescore_table(str(TABLE), [tiny_model_path], str(tmp_path / "whole.gz"),
                          RescoreOptions(chunk_lines=40), progress=False)  # fmt: skip
    assert whole.lines == 300
    assert out.read_bytes() == (tmp_path / "whole.gz").read_bytes()
    assert not partial.exists() and not state.exists()


def test_an_intact_partial_still_resumes_to_the_same_bytes(interrupted, tiny_model_path, tmp_path):
    out, partial, state = interrupted
    result = _resume(tiny_model_path, out)
    assert result.resumed_from_line == 80
    rescore_table(str(TABLE), [tiny_model_path], str(tmp_path / "whole.gz"),
                  RescoreOptions(chunk_lines=40), progress=False)  # fmt: skip
    assert out.read_bytes() == (tmp_path / "whole.gz").read_bytes()


_HOLDER = """
import sys
from phrasescore.files.locks import output_lock
with output_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()  # held until the test closes stdin or kills this process
"""


def _hold_lock(output) -> subprocess.Popen:
    """A live process holding the lock of ``output`` (as a run writing it does)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(output)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "locked\n"  # blocks until it holds the lock
    return holder


def test_a_second_run_on_a_live_runs_output_is_refused_in_one_line(interrupted, tiny_model_path):
    """A Slurm array task launched twice: the second must not resume from the first one's live
    partial output: one line naming the lock's holder, the partial and its state untouched,
    and a resume once the holder is gone."""
    out, partial, state = interrupted
    before = {p: p.read_bytes() for p in (partial, state)}
    flags = ["-m", tiny_model_path, "--chunk-lines", "40", "--dtype", "float32", "--threads", "1"]
    holder = _hold_lock(out)
    try:
        proc = run_cli("rescore", TABLE, *flags, "--resume", "--no-progress", "-o", out)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.splitlines() == [
            f"phrasescore: error: {out}: another run is writing this output (process "
            f"{holder.pid} holds its lock .out.gz.lock): wait for it to end, or stop it"
        ]
        assert {p: p.read_bytes() for p in (partial, state)} == before and not out.exists()
    finally:
        holder.kill()  # like kill -9: the kernel releases its lock, its lock file stays
        holder.wait()
    assert (out.parent / ".out.gz.lock").exists()
    proc = run_cli("rescore", TABLE, *flags, "--resume", "--no-progress", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "resuming after line 80" in proc.stderr
    assert sorted(os.listdir(out.parent)) == ["out.gz"]


def test_a_lock_is_released_when_the_block_ends_however_it_ends(tmp_path):
    from phrasescore.files.locks import output_lock

    out = tmp_path / "out.gz"
    with pytest.raises(KeyboardInterrupt), output_lock(str(out)):
        assert (tmp_path / ".out.gz.lock").read_bytes() == b""  # no block of a full disk
        message = f"another run is writing this output \\(process {os.getpid()} holds its lock"
        with pytest.raises(InputError, match=message):
            with output_lock(str(out)):
                pass
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []
    with output_lock(str(out)):
        pass
    with output_lock("-"):
        assert os.listdir(tmp_path) == []
