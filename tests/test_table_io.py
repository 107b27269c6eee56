"""The table's path spread over the cores (``rescore --io-workers``), gzip by ISA-L
(``--gzip-level``), the block reader, the scorer that costs nothing and the synthetic table."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from phrasescore import compression
from phrasescore.bundle import load_model
from phrasescore.engine.constant_scoring import ConstantScorer
from phrasescore.errors import InputError
from phrasescore.files.reading import LineBlocks, iter_raw_lines
from phrasescore.jobs.rescore.columns import NewColumns
from phrasescore.jobs.rescore.merge_shards import run_merge
from phrasescore.jobs.rescore.rescore import RescoreOptions, rescore_table
from phrasescore.moses.phrase_table import format_probability, read_phrase_table
from phrasescore.runners.chunk_pool import IN_FLIGHT_PER_WORKER, ChunkPool
from phrasescore.runners.shards import Shard

from .conftest import DATA, interrupt_at_call, run_cli

TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"  # 300 lines, 205 distinct sources
TOOLS = Path(__file__).parent.parent / "tools"


def _options(level: int = 1, **kw) -> RescoreOptions:
    # max_phrase_length 3: some pairs get the floor value unscored (the too-long path)
    return RescoreOptions(chunk_lines=40, gzip_level=level, max_phrase_length=3, **kw)


# ---------------------------------------------------------------------------- the same bytes
@pytest.mark.parametrize("suffix,level", [(".gz", 1), (".gz", 6), ("", 1)])
def test_io_workers_write_the_bytes_of_one_process(tiny_model_path, tiny_lm_path, tmp_path, suffix,
                                                   level):  # fmt: skip
    """Every column kind (model, CSLM, unknown words, too-long pairs): 1, 2 and 3 processes
    that parse and write while this one scores give one process's bytes."""
    flags = dict(lm_paths=[tiny_lm_path], progress=False)
    serial = tmp_path / f"serial{suffix}"
    one = rescore_table(str(TABLE), [tiny_model_path], str(serial), _options(level, unk_column=True),
                        **flags)  # fmt: skip
    assert one.lines == 300 and one.too_long > 0
    expected = serial.read_bytes()
    for io_workers in (1, 2, 3):
        out = tmp_path / f"io{io_workers}{suffix}"
        result = rescore_table(str(TABLE), [tiny_model_path], str(out),
                               _options(level, unk_column=True), io_workers=io_workers, **flags)  # fmt: skip
        assert out.read_bytes() == expected, io_workers
        assert (result.lines, result.distinct_sources, result.too_long) == (
            300, one.distinct_sources, one.too_long)  # fmt: skip
    # the columns are there: model, CSLM, unknown words after the table's 4 scores
    assert {len(e.scores) for e in read_phrase_table(str(serial))} == {7}


def test_gzip_level_changes_the_bytes_not_the_content(tiny_model_path, tmp_path):
    """ISA-L's members (level 1) decompress with Python's gzip (zlib) to what level 6 and a
    plain output hold; each chunk is one member, and the same flags give the same bytes."""
    outputs = {}
    for name, level in (("isal1.gz", 1), ("isal1-again.gz", 1), ("zlib6.gz", 6), ("plain", 1)):
        rescore_table(str(TABLE), [tiny_model_path], str(tmp_path / name), _options(level),
                      progress=False, io_workers=2)  # fmt: skip
        outputs[name] = (tmp_path / name).read_bytes()
    assert outputs["isal1.gz"] == outputs["isal1-again.gz"]
    assert outputs["isal1.gz"] != outputs["zlib6.gz"]
    assert gzip.decompress(outputs["isal1.gz"]) == gzip.decompress(outputs["zlib6.gz"])
    assert gzip.decompress(outputs["isal1.gz"]) == outputs["plain"]
    assert outputs["isal1.gz"].count(b"\x1f\x8b\x08\x00\x00\x00\x00\x00") == 300 // 40 + 1


def test_compress_member_isal_and_zlib_hold_the_same_content():
    data = TABLE.read_bytes()
    text = gzip.decompress(data)
    for level in compression.LEVELS:
        member = compression.compress_member(text, level)
        assert gzip.decompress(member) == text and zlib.decompress(member, 31) == text
        assert member[4:8] == b"\0\0\0\0"  # mtime 0: the same bytes tomorrow
        assert compression.compress_member(text, level) == member
    assert compression.compressor(1).startswith("isal-") and compression.compressor(6) == "zlib:6"
    two = compression.compress_member(b"a\n", 1) + compression.compress_member(b"b\n", 6)
    assert gzip.decompress(two) == b"a\nb\n"  # members of either library concatenate
    with pytest.raises(ValueError):
        compression.check_level(10)


# ---------------------------------------------------------------------------- resume, shards
def test_io_workers_resume_after_an_interruption(tiny_model_path, tmp_path, monkeypatch):
    """Stopped (Ctrl-C) while this process scores its 6th chunk, then --resume with other
    io-workers: one uninterrupted run's bytes. The 6th chunk is sent to a worker only once no
    more than 4 (2 per worker) are in flight: chunks 1 and 2 at least are written."""
    full = tmp_path / "full.gz"
    rescore_table(str(TABLE), [tiny_model_path], str(full), _options(), progress=False)
    out = tmp_path / "out.gz"
    interrupt_at_call(monkeypatch, NewColumns, "score_request", 6)
    with pytest.raises(KeyboardInterrupt):
        rescore_table(str(TABLE), [tiny_model_path], str(out), _options(), progress=False,
                      io_workers=2)  # fmt: skip
    monkeypatch.undo()
    assert not out.exists()
    resumed = rescore_table(str(TABLE), [tiny_model_path], str(out), _options(), progress=False,
                            io_workers=3, resume=True)  # fmt: skip
    assert resumed.resumed_from_line in (80, 120, 160, 200)  # the chunks written before the stop
    assert out.read_bytes() == full.read_bytes()
    # another level is another job: its partial output is not resumed into this one
    rescore_table(str(TABLE), [tiny_model_path], str(tmp_path / "l6.gz"), _options(6),
                  progress=False)  # fmt: skip
    assert (tmp_path / "l6.gz").read_bytes() != full.read_bytes()


def test_io_workers_shards_merge_into_one_run(tiny_model_path, tmp_path):
    full = tmp_path / "full.gz"
    rescore_table(str(TABLE), [tiny_model_path], str(full), _options(2), progress=False)
    for suffix in (".gz", ""):  # plain parts: the merge compresses at the job's level
        parts = []
        for k in (1, 2, 3):
            part = tmp_path / f"part{k}{suffix}"
            rescore_table(str(TABLE), [tiny_model_path], str(part), _options(2), progress=False,
                          shard=Shard(k, 3), io_workers=2)  # fmt: skip
            parts.append(str(part))
        merged = tmp_path / f"merged{suffix}.gz"
        run_merge(parts, str(merged))
        assert merged.read_bytes() == full.read_bytes(), suffix


# ---------------------------------------------------------------------------- back-pressure
def _doubled_by_parent(item: int, ask) -> int:
    return ask(item) + 1


def test_serve_pool_keeps_its_bounds_and_the_order():
    """Structural bounds, not timing: the pool never holds more than IN_FLIGHT_PER_WORKER
    items per worker between taking one from its source and handing its result on, and each
    result comes in input order, its request answered by this process."""
    pulled, yielded, gaps = [], [], []

    def source():
        for i in range(60):
            gaps.append(len(pulled) - len(yielded))
            pulled.append(i)
            yield i

    with ChunkPool(_doubled_by_parent, 3, serve=lambda x: 2 * x) as pool:
        for item, value in pool.imap(source()):
            assert value == 2 * item + 1
            yielded.append(item)
        assert pool.served == 60
        assert pool.most_in_flight == pool.in_flight_limit == 3 * IN_FLIGHT_PER_WORKER
    assert yielded == list(range(60))
    assert max(gaps) < 3 * IN_FLIGHT_PER_WORKER  # taken only when there is room


# ---------------------------------------------------------------------------- the block reader
@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b""])
def test_line_blocks_cut_exactly_where_lines_end(tmp_path, ending):
    text = b"".join((b"w%d ||| m ||| 0.5\r\n" if i % 7 == 0 else b"w%d ||| m ||| 0.5\n") % i
                    for i in range(5000))  # fmt: skip
    text += b"last ||| line ||| 0.5" + ending
    for name, data in (("t", text), ("t.gz", compression.compress_member(text, 1))):
        path = tmp_path / name
        path.write_bytes(data)
        lines = list(iter_raw_lines(str(path)))
        blocks = LineBlocks(str(path))
        taken = 0
        for count in (1, 999, 1, 3000, 5000, 7):
            chunk = blocks.take(count)
            assert chunk == b"".join(lines[taken : taken + count])
            taken += count
        assert blocks.take(10) == b""


def test_line_blocks_name_the_line_of_a_truncated_gzip(tmp_path):
    text = b"".join(b"w%d ||| m ||| 0.5\n" % i for i in range(400000))
    data = compression.compress_member(text, 1)
    path = tmp_path / "cut.gz"
    path.write_bytes(data[: len(data) // 2])
    blocks = LineBlocks(str(path))
    with pytest.raises(InputError) as info:
        while blocks.take(1000):
            pass
    assert "corrupt or truncated gzip stream" in info.value.message
    assert info.value.path == str(path) and 1 < info.value.line < 400000


# ---------------------------------------------------------------------------- bench-io's scorer
def test_constant_scorer_runs_the_whole_path(tiny_model_path, tmp_path):
    model = load_model(tiny_model_path)
    outputs = []
    for io_workers in (0, 2):
        out = tmp_path / f"const{io_workers}.gz"
        result = rescore_table(str(TABLE), [], str(out), _options(), progress=False,
                               scorers=[ConstantScorer(model, -1.0)], io_workers=io_workers)  # fmt: skip
        assert result.lines == 300
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    entries = list(read_phrase_table(str(tmp_path / "const2.gz")))
    values = {e.scores[-1] for e in entries}
    floor = format_probability(np.exp(-100.0))
    assert values == {format_probability(np.exp(-1.0)), floor}  # floor: the too-long pairs


def test_bench_io_prints_its_summary_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(TOOLS / "bench-io"), str(TABLE), "--repeat", "1", "--io-workers",
         "2", "--chunk-lines", "50", "--vocab-lines", "300"],
        capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("io: ") and last.endswith(" x zcat|gzip"), proc.stdout
    assert "load" in proc.stdout and "peak RSS" in proc.stdout


# ---------------------------------------------------------------------------- the synthetic table
def test_make_synthetic_table_gives_distinct_valid_lines(tmp_path):
    out = tmp_path / "synthetic.gz"
    args = [sys.executable, str(TOOLS / "make-synthetic-table"), str(out), "--lines", "1000",
            "--base", str(TABLE)]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = gzip.decompress(out.read_bytes()).splitlines()
    assert len(lines) == 1000 and len(set(lines)) == 1000
    base = gzip.decompress(TABLE.read_bytes()).splitlines()
    assert lines[:300] == base  # the first pass is the table itself
    # every line has the base line's length and fields but one suffixed source word
    assert [len(x.split()) for x in lines[300:600]] == [len(x.split()) for x in base]
    first = out.read_bytes()
    assert subprocess.run(args, capture_output=True).returncode == 0
    assert out.read_bytes() == first  # deterministic
    check = run_cli("check-table", out)
    assert check.returncode == 0 and "1000 lines" in check.stdout + check.stderr, check


# ---------------------------------------------------------------------------- the command line
def test_io_workers_and_workers_exclude_each_other(tiny_model_path, tmp_path):
    out = tmp_path / "out.gz"
    proc = run_cli("rescore", TABLE, "-m", tiny_model_path, "-o", out, "--workers", "2",
                   "--io-workers", "2", "--no-progress")  # fmt: skip
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert "--workers and --io-workers exclude each other" in proc.stderr
    assert not out.exists()
    proc = run_cli("rescore", TABLE, "-m", tiny_model_path, "-o", out, "--gzip-level", "10")
    assert proc.returncode == 2 and "--gzip-level" in proc.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_io_workers_feed_a_gpu_with_the_bytes_of_one_process(tiny_model_path, tmp_path):
    outputs = []
    for io_workers in (0, 3):
        out = tmp_path / f"cuda{io_workers}.gz"
        rescore_table(str(TABLE), [tiny_model_path], str(out), _options(dtype="float32"),
                      device="cuda", progress=False, io_workers=io_workers)  # fmt: skip
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


# ---------------------------------------------------------------------------- the chunk parser
def _first_error(parse) -> tuple[str, int] | None:
    try:
        parse()
    except InputError as exc:
        return exc.message, exc.line
    return None


def test_chunk_parser_gives_the_line_parsers_entries_and_errors():
    from phrasescore.moses.phrase_table import parse_phrase_table_chunk, parse_phrase_table_lines

    real = gzip.decompress(TABLE.read_bytes()).decode("utf-8")
    odd = ("a ||| b ||| 0.5 1\r\n" "c\t|||d|||0.25\t1 ||| 0-0 ||| 1 1 ||| |||\n"
           "e  ||| f g ||| 1e-3 2.718\n" "last ||| line ||| 1 1")  # fmt: skip
    for text, first in ((real, 1), (odd, 41)):
        lines = text.splitlines(keepends=True)
        expected = list(parse_phrase_table_lines(lines, "t", first))
        assert parse_phrase_table_chunk(text, "t", first) == expected
    good = "a ||| b ||| 0.5 1\n"
    cases = [
        good * 2 + "c ||| d ||| 0 1\n" + good + "only ||| two\n",  # a score first (line 3)
        good * 4 + "only ||| two\n" + "c ||| d ||| nan 1\n",  # the fields first (line 5)
        good + " ||| d ||| 0 1\n",  # a bad score and an empty phrase on one line: the score
        good + "c ||| d ||| 0.5\n",  # the score count
        good + "c ||| d ||| 1_0 1\n" + good + "c ||| d ||| 1e999 1\n",
        good + "c ||| d ||| -1 1\n",
    ]
    for text in cases:
        lines = text.splitlines(keepends=True)
        old = _first_error(lambda: list(parse_phrase_table_lines(lines, "t", 7)))  # noqa: B023
        new = _first_error(lambda: parse_phrase_table_chunk(text, "t", 7))  # noqa: B023
        assert old is not None and new == old, text


def test_without_isal_zlib_writes_every_level(tmp_path):
    """python-isal missing (as on a machine without the package): levels 0-3 fall back to zlib
    at the same level, with one warning; the content is the same and gzip input is read."""
    code = (
        "import sys, logging, gzip\n"
        "sys.modules['isal'] = None\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from phrasescore import compression\n"
        "from phrasescore.files.reading import LineBlocks\n"
        "assert not compression.have_isal() and compression.compressor(1) == 'zlib:1'\n"
        "data = b'a ||| b ||| 0.5\\n' * 1000\n"
        "one = compression.compress_member(data, 1)\n"
        "assert gzip.decompress(one) == data and one == compression.compress_member(data, 1)\n"
        "assert one[3] == 0 and one[4:8] == bytes(4)  # no name, mtime 0\n"
        "open(sys.argv[1], 'wb').write(one)\n"
        "assert LineBlocks(sys.argv[1]).take(2000) == data\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t.gz")],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr
    assert proc.stderr.count("python-isal is not installed") == 1


def _memory_limited(gib: int):
    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))

    return limit


@pytest.mark.parametrize("reader", ["check-table", "LineBlocks"])
def test_an_endless_line_is_one_line_error_under_a_memory_limit(reader):
    """``check-table /dev/zero`` read one endless line until a MemoryError traceback; a line
    longer than the reader's bound is now an error naming the file and line 1."""
    if reader == "check-table":
        code = "from phrasescore.cli import main; main()"
        args = ["check-table", "/dev/zero"]
    else:  # rescore's reader
        code = (
            "import sys\nfrom phrasescore.errors import InputError\n"
            "from phrasescore.files.reading import LineBlocks\n"
            "try:\n    LineBlocks('/dev/zero').take(3)\n"
            "except InputError as exc:\n    sys.exit(f'phrasescore: error: {exc}')"
        )
        args = []
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        preexec_fn=_memory_limited(2),
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "phrasescore: error: /dev/zero:1: a line longer than 64 MiB: not a file of text lines "
        "(a binary file, /dev/zero?)\n"
    )


def _damaged_gzip(tmp_path, damage: str) -> tuple[Path, int]:
    """A gzip of 3,000 table lines cut in the middle or followed by bytes that are not gzip,
    and the line to name: the first not read whole (what ``zcat`` gives complete, plus one)."""
    lines = b"".join(b"a%d ||| b ||| 0.5\n" % i for i in range(3000))
    data = gzip.compress(lines, mtime=0)
    path = tmp_path / f"{damage}.gz"
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
        whole = zlib.decompressobj(31).decompress(data[: len(data) // 2]).count(b"\n")
    else:
        path.write_bytes(data + b"garbage after the gzip data\n")
        whole = 3000
    return path, whole + 1


@pytest.mark.parametrize("damage", ["truncated", "trailing garbage"])
def test_a_damaged_gzip_is_named_at_the_same_line_by_every_reader(tmp_path, damage):
    """check-table named a truncated gzip's line 139 and rescore's reader line 1; bytes after
    complete gzip data were "corrupt ... at line 2985" of 3,000."""
    path, line = _damaged_gzip(tmp_path, damage)
    messages = []
    with pytest.raises(InputError) as info:
        for _ in iter_raw_lines(str(path)):
            pass
    messages.append(str(info.value))
    blocks = LineBlocks(str(path))
    with pytest.raises(InputError) as info:
        while blocks.take(100):
            pass
    messages.append(str(info.value))
    if damage == "truncated":
        expected = f"{path}:{line}: corrupt or truncated gzip stream ("
    else:
        expected = (
            f"{path}:3001: bytes that are not gzip after the end of the gzip data, which holds "
            "3000 lines (gzip -t: trailing garbage); cut them off or recompress the data"
        )
    assert [m[: len(expected)] for m in messages] == [expected, expected]
