"""``nbest --shard K/N`` + ``merge-shards``: parts cut at sentence-id groups, merged
byte-identical to one process; incomplete, foreign and mixed parts refused in one line.

The list is the real Multi30k 100-best list of test2016 ids 0-4 (324 hypotheses: 100, 100, 66,
12, 46) with its source; with ``--chunk-lines 50`` it is cut into 4 chunks of 100, 100, 66 and
58 lines (ids 3 and 4 together: a chunk ends after the group that reaches 50 lines).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from phrasescore.cli import cli
from phrasescore.compression import gzip_writer
from phrasescore.jobs.nbest.nbest import NBestOptions, rescore_nbest
from phrasescore.jobs.rescore.rescore import RescoreOptions, rescore_table
from phrasescore.moses.nbest import iter_nbest_groups, read_nbest
from phrasescore.runners.merge import merge_shards
from phrasescore.runners.shards import Shard, file_sha256

from .conftest import DATA, write_lines

NBEST = DATA / "nbest"
LIST = NBEST / "multi30k.test2016.ids0-4.100best.nbest.gz"
SOURCE = NBEST / "multi30k.test2016.head5.tok.lc.en"
CHUNK = 50


def _nbest(model, output, shard=None, nbest=LIST, source=SOURCE, **kw) -> None:
    options = NBestOptions(chunk_lines=kw.pop("chunk", CHUNK), **kw)
    rescore_nbest(str(nbest), str(source), model, str(output), options, progress=False, shard=shard)


def _parts(model, folder: Path, count: int, suffix=".gz", **kw) -> list[str]:
    parts = []
    for k in range(1, count + 1):
        part = folder / f"part.{k}{suffix}"
        _nbest(model, part, Shard(k, count), **kw)
        parts.append(str(part))
    return parts


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phrasescore: error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def parts(tiny_model_path, tmp_path_factory) -> list[str]:
    return _parts(tiny_model_path, tmp_path_factory.mktemp("nbest-parts"), 3)


def test_chunks_are_cut_at_sentence_groups(parts):
    manifest = json.loads(Path(parts[0] + ".manifest.json").read_text())
    assert manifest["kind"] == "nbest"
    assert manifest["plan"]["chunk_sizes"] == [100, 100, 66, 58]
    assert [c["chunk"] for c in manifest["part"]["chunks"]] == [0, 3]  # chunk i -> shard i%3+1
    # every part holds whole sentence groups of the list
    ids = [[g[0].id for g in iter_nbest_groups(read_nbest(p))] for p in parts]
    assert ids == [[0, 3, 4], [1], [2]]


@pytest.mark.parametrize(
    "count,suffix,flags",
    [
        (3, ".gz", {}),
        (2, "", {}),
        (7, ".gz", {}),  # more shards than chunks: parts 5-7 are empty
        (2, ".gz", {"normalize": True, "weights": "rerank"}),
    ],
)
def test_merged_parts_are_byte_identical_to_one_process(
    tiny_model_path, tmp_path, count, suffix, flags
):
    flags = dict(flags)
    if flags.get("weights"):
        ini = (DATA / "moses" / "multi30k.moses.ini").read_text(encoding="utf-8").splitlines()
        flags["weights"] = write_lines(tmp_path / "w.ini", [*ini, "RNNEncDec0= 0.5"])
    one = tmp_path / f"one{suffix}"
    _nbest(tiny_model_path, one, **flags)
    parts = _parts(tiny_model_path, tmp_path, count, suffix, **flags)
    result = invoke("merge-shards", *reversed(parts), "-o", tmp_path / f"merged{suffix}")
    assert result.exit_code == 0, result.output
    assert (tmp_path / f"merged{suffix}").read_bytes() == one.read_bytes()
    assert "324 hypotheses of 5 sentences" in result.stderr
    # the other compression than the parts': the same text
    other = tmp_path / ("merged" if suffix else "merged.gz")
    merged = merge_shards(parts, str(other))
    assert (merged.lines, merged.chunks, merged.groups) == (324, 4, 5)
    text = other.read_bytes()
    plain = one.read_bytes()
    assert (gzip.decompress(text) if not suffix else text) == (
        gzip.decompress(plain) if suffix else plain
    )


def _members(data: bytes) -> int:
    """The gzip members in ``data``."""
    count = 0
    while data:
        member = zlib.decompressobj(wbits=31)
        member.decompress(data)
        data, count = member.unused_data, count + 1
    return count


def test_a_gz_list_is_one_member_a_chunk_and_parts_of_an_earlier_version_still_merge(
    parts, tiny_model_path, tmp_path
):
    """A ``.gz`` list is written one gzip member a chunk (compressed where the chunk is
    formatted); parts an earlier phrasescore wrote as one gzip stream (their manifests without
    the gzip level) merge as it wrote them: one stream of the same text."""
    one = tmp_path / "one.gz"
    _nbest(tiny_model_path, one)
    assert _members(one.read_bytes()) == 4
    earlier = []
    for part in parts:
        old = tmp_path / Path(part).name
        with open(old, "wb") as raw, gzip_writer(raw, 6) as out:
            out.write(gzip.decompress(Path(part).read_bytes()))
        manifest = json.loads(Path(part + ".manifest.json").read_text())
        del manifest["job"]["options"]["gzip_level"]
        manifest["part"].update(size=old.stat().st_size, sha256=file_sha256(str(old)))
        Path(str(old) + ".manifest.json").write_text(json.dumps(manifest))
        earlier.append(str(old))
    merged = tmp_path / "merged.gz"
    assert merge_shards(earlier, str(merged)).lines == 324
    assert _members(merged.read_bytes()) == 1
    assert gzip.decompress(merged.read_bytes()) == gzip.decompress(one.read_bytes())


def test_missing_duplicated_truncated_or_foreign_parts_are_refused(
    parts, tiny_model_path, tmp_path
):
    out = tmp_path / "out.gz"
    assert "shard 2 of 3 missing" in one_line_error(
        invoke("merge-shards", parts[0], parts[2], "-o", out)
    )
    copy = tmp_path / "copy.gz"
    shutil.copy(parts[1], copy)
    shutil.copy(parts[1] + ".manifest.json", str(copy) + ".manifest.json")
    assert "given twice" in one_line_error(invoke("merge-shards", *parts, copy, "-o", out))
    # truncated: cut short, or its gzip stream cut short with the size the manifest says
    cut = tmp_path / "cut" / "part.1.gz"
    cut.parent.mkdir()
    shutil.copy(parts[0] + ".manifest.json", str(cut) + ".manifest.json")
    data = Path(parts[0]).read_bytes()
    cut.write_bytes(data[:-20])
    assert "truncated" in one_line_error(invoke("merge-shards", cut, *parts[1:], "-o", out))
    manifest = json.loads(Path(str(cut) + ".manifest.json").read_text())
    manifest["part"]["size"] = len(data) - 20
    Path(str(cut) + ".manifest.json").write_text(json.dumps(manifest))
    assert "truncated gzip stream" in one_line_error(
        invoke("merge-shards", cut, *parts[1:], "-o", out)
    )
    # same size, other bytes
    changed = bytearray(data)
    changed[len(data) // 2] ^= 0xFF
    cut.write_bytes(bytes(changed))
    shutil.copy(parts[0] + ".manifest.json", str(cut) + ".manifest.json")
    one_line_error(invoke("merge-shards", cut, *parts[1:], "-o", out))
    # foreign: other flags, another --chunk-lines, another list
    other = _parts(tiny_model_path, tmp_path / "cut", 3, normalize=True)
    err = one_line_error(invoke("merge-shards", parts[0], other[1], parts[2], "-o", out))
    assert "foreign part" in err and "flags" in err
    sub = tmp_path / "sub"
    sub.mkdir()
    other = _parts(tiny_model_path, sub, 3, chunk=60)
    err = one_line_error(invoke("merge-shards", parts[0], other[1], parts[2], "-o", out))
    assert "another --chunk-lines" in err
    head = [line for line in gzip.open(LIST, "rt", encoding="utf-8") if int(line.split()[0]) < 3]
    sub2 = tmp_path / "sub2"
    sub2.mkdir()
    short = sub2 / "ids0-2.nbest"
    short.write_text("".join(head), encoding="utf-8")
    source = write_lines(sub2 / "src", SOURCE.read_text(encoding="utf-8").splitlines()[:3])
    other = _parts(tiny_model_path, sub2, 3, nbest=short, source=source)
    err = one_line_error(invoke("merge-shards", parts[0], other[1], parts[2], "-o", out))
    assert "another input n-best list" in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.gz")]


def test_nbest_and_phrase_table_parts_are_not_mixed(parts, tiny_model_path, tmp_path):
    table = DATA / "moses" / "multi30k.head300.phrase-table.gz"
    pt_parts = []
    for k in (1, 2, 3):
        pt_parts.append(str(tmp_path / f"pt.{k}.gz"))
        options = RescoreOptions(dtype="float32", chunk_lines=100)
        rescore_table(
            str(table), [tiny_model_path], pt_parts[-1], options, progress=False, shard=Shard(k, 3)
        )
    out = tmp_path / "out.gz"
    err = one_line_error(invoke("merge-shards", parts[0], pt_parts[1], parts[2], "-o", out))
    assert "a part of a phrase table, but" in err and "n-best list" in err
    err = one_line_error(invoke("merge-shards", *pt_parts[:2], parts[2], "-o", out))
    assert "a part of an n-best list, but" in err and "phrase table" in err
    ini = DATA / "moses" / "multi30k.moses.ini"
    err = one_line_error(
        invoke(
            "merge-shards", *parts, "-o", out, "--moses-ini", ini, "--ini-out", tmp_path / "new.ini"
        )
    )
    assert "--moses-ini is for the parts of a phrase table" in err
    assert not out.exists()


@pytest.mark.parametrize("shard", ["0/3", "4/3", "3", "1/0", "a/b"])
def test_bad_shard_is_refused_by_click(tiny_model_path, tmp_path, shard):
    args = ["nbest", LIST, "--source", SOURCE, "-m", tiny_model_path, "-o", tmp_path / "p.gz"]
    result = invoke(*args, "--shard", shard)
    assert result.exit_code == 2
    assert "Invalid value for '--shard'" in result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "extra, message",
    [
        (["-o", "-"], "--shard and torchrun need an n-best list file and an output file"),
        (
            ["-o", "p.gz", "--one-best", "--weights", DATA / "moses" / "multi30k.moses.ini"],
            "--one-best writes one line per source sentence",
        ),
    ],
)
def test_shard_needs_files_and_a_list_output(
    tiny_model_path, tmp_path, monkeypatch, extra, message
):
    monkeypatch.chdir(tmp_path)
    args = ["nbest", LIST, "--source", SOURCE, "-m", tiny_model_path, "--shard", "1/2"]
    assert message in one_line_error(invoke(*args, *extra))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("io_workers", [[], ["--io-workers", "1"]], ids=["", "io-workers"])
def test_torchrun_nbest_is_byte_identical_to_one_process(tiny_model_path, tmp_path, io_workers):
    """The same --threads on both sides: the thread count changes the last float digits. Each
    rank may have its io-workers."""
    from .test_distributed import run_cli, torchrun

    args = ["nbest", LIST, "--source", SOURCE, "-m", tiny_model_path, "--device", "cpu"]
    flags = ["--chunk-lines", CHUNK, "--threads", "1", "--no-progress"]
    one = run_cli(*args, "-o", tmp_path / "one.gz", *flags)
    assert one.returncode == 0, one.stderr
    out = tmp_path / "torchrun.gz"
    result = torchrun("-m", "phrasescore", *args, "-o", out, *flags, *io_workers)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == (tmp_path / "one.gz").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["one.gz", "torchrun.gz"]  # parts removed
    summary = [line for line in result.stderr.splitlines() if "-> " in line]
    assert len(summary) == 1 and "324 hypotheses of 5 sentences" in summary[0], result.stderr


def test_merge_refuses_an_output_onto_a_parts_manifest(parts, tmp_path):
    """A part's manifest as -o or --ini-out is refused in one line and left as it was: the
    merged list would overwrite an input."""
    manifest = f"{parts[1]}.manifest.json"
    before = Path(manifest).read_bytes()
    for flag in ("-o", "--ini-out"):
        args = ["merge-shards", *parts, "-o", manifest]
        if flag == "--ini-out":
            args = ["merge-shards", *parts, "-o", tmp_path / "all.gz", "--moses-ini",
                    DATA / "moses" / "multi30k.moses.ini", "--ini-out", manifest]  # fmt: skip
        line = one_line_error(invoke(*args))
        assert line == (
            f"phrasescore: error: {flag} {manifest} is the part's manifest ({manifest}): "
            "refusing to overwrite an input"
        )
        assert Path(manifest).read_bytes() == before
    assert not (tmp_path / "all.gz").exists()
