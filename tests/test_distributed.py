"""Scaling out: rescore --shard + merge-shards, and torchrun rescoring and training.

Distributed runs use 2 CPU processes with the gloo backend, launched with
``python -m torch.distributed.run --standalone`` (a free port on localhost).
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from phrasescore.jobs.rescore.rescore import RescoreOptions, rescore_table
from phrasescore.runners.merge import merge_shards
from phrasescore.runners.shards import Shard

from .conftest import DATA, TEXT, train_tiny

REPO = Path(__file__).resolve().parent.parent
SAMPLE_TABLE = TEXT / "multi30k-phrase-table-sample.gz"  # 200 real lines
MOSES_TABLE = DATA / "moses" / "de-en.4scores.slice300.phrase-table.gz"
CHUNK = 30


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "phrasescore", *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(),
    )


def torchrun(*args, nproc: int = 2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={nproc}", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)


def one_line_error(result) -> str:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phrasescore: error: "), result.stderr
    return lines[0]


def _options(**kw) -> RescoreOptions:
    return RescoreOptions(dtype="float32", chunk_lines=CHUNK, **kw)


def _shards(table, model, folder: Path, count: int, suffix=".gz", **kw) -> list[str]:
    parts = []
    for k in range(1, count + 1):
        part = folder / f"part.{k}{suffix}"
        rescore_table(
            str(table), [model], str(part), _options(**kw), progress=False, shard=Shard(k, count)
        )
        parts.append(str(part))
    return parts


@pytest.fixture(scope="module")
def whole(tiny_model_path, tmp_path_factory) -> Path:
    """The sample table rescored by one process."""
    out = tmp_path_factory.mktemp("whole") / "whole.gz"
    rescore_table(str(SAMPLE_TABLE), [tiny_model_path], str(out), _options(), progress=False)
    return out


@pytest.fixture(scope="module")
def parts(tiny_model_path, tmp_path_factory) -> list[str]:
    return _shards(SAMPLE_TABLE, tiny_model_path, tmp_path_factory.mktemp("parts"), 3)


# ---------------------------------------------------------------------------- shards
def test_merged_shards_are_byte_identical_to_one_process(whole, parts, tmp_path):
    result = run_cli("merge-shards", *reversed(parts), "-o", tmp_path / "merged.gz")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "merged.gz").read_bytes() == whole.read_bytes()
    # a plain-text merge of gzip parts is the plain table
    merged = merge_shards(parts, str(tmp_path / "merged.txt"))
    assert merged.lines == 200 and merged.chunks == 7
    assert (tmp_path / "merged.txt").read_bytes() == gzip.decompress(whole.read_bytes())


@pytest.mark.parametrize("count,suffix", [(2, ""), (9, ".gz")])
def test_any_shard_count_and_plain_parts(tiny_model_path, tmp_path, count, suffix):
    """More shards than chunks leaves empty parts; plain parts merge the same."""
    options = dict(unk_column=True)
    one = tmp_path / f"one{suffix}"
    rescore_table(
        str(MOSES_TABLE), [tiny_model_path], str(one), _options(**options), progress=False
    )
    parts = _shards(MOSES_TABLE, tiny_model_path, tmp_path, count, suffix, **options)
    merge_shards(parts, str(tmp_path / f"merged{suffix}"))
    assert (tmp_path / f"merged{suffix}").read_bytes() == one.read_bytes()


def test_merge_writes_the_moses_ini(parts, tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text(
        "[feature]\n"
        f"PhraseDictionaryMemory name=TranslationModel0 num-features=4 path={SAMPLE_TABLE} "
        "input-factor=0 output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n"
    )
    out_ini = tmp_path / "new.ini"
    result = run_cli(
        "merge-shards", *parts, "-o", tmp_path / "m.gz", "--moses-ini", ini, "--ini-out", out_ini
    )
    assert result.returncode == 0, result.stderr
    text = out_ini.read_text()
    assert "num-features=5" in text and str(tmp_path / "m.gz") in text


def test_missing_duplicated_truncated_or_foreign_parts_are_refused(
    parts, tiny_model_path, tmp_path
):
    out = tmp_path / "out.gz"
    assert "shard 2 of 3 missing" in one_line_error(
        run_cli("merge-shards", parts[0], parts[2], "-o", out)
    )
    copy = tmp_path / "copy.gz"
    shutil.copy(parts[1], copy)
    shutil.copy(parts[1] + ".manifest.json", str(copy) + ".manifest.json")
    assert "given twice" in one_line_error(run_cli("merge-shards", *parts, copy, "-o", out))
    # truncated (as by a full disk or a copy cut short)
    cut = tmp_path / "cut" / "part.2.gz"
    cut.parent.mkdir()
    shutil.copy(parts[1] + ".manifest.json", str(cut) + ".manifest.json")
    cut.write_bytes(Path(parts[1]).read_bytes()[:-20])
    assert "truncated" in one_line_error(
        run_cli("merge-shards", parts[0], cut, parts[2], "-o", out)
    )
    # same size, other bytes
    data = bytearray(Path(parts[1]).read_bytes())
    data[-12] ^= 0xFF
    cut.write_bytes(bytes(data))
    one_line_error(run_cli("merge-shards", parts[0], cut, parts[2], "-o", out))
    # no manifest
    cut.with_name("part.2.gz.manifest.json").unlink()
    assert "no manifest" in one_line_error(run_cli("merge-shards", parts[0], cut, "-o", out))
    # foreign: other flags, another input
    other = _shards(SAMPLE_TABLE, tiny_model_path, tmp_path, 3, normalize=True)
    err = one_line_error(run_cli("merge-shards", parts[0], other[1], parts[2], "-o", out))
    assert "foreign part" in err and "flags" in err
    sub = tmp_path / "sub"
    sub.mkdir()
    other = _shards(MOSES_TABLE, tiny_model_path, sub, 3)
    err = one_line_error(run_cli("merge-shards", parts[0], other[1], parts[2], "-o", out))
    assert "another input table" in err
    assert not out.exists()


def _sources(table) -> list[str]:
    return [line.split(" ||| ")[0] for line in gzip.open(table, "rt", encoding="utf-8")]


@pytest.mark.parametrize(
    "table,chunk,count",
    [
        (SAMPLE_TABLE, 7, 3),  # chunk edges at lines 21, 42, 70, ... fall inside source groups
        (MOSES_TABLE, 30, 2),  # one source on all 300 lines: every edge is inside it
    ],
)
def test_merged_distinct_sources_count_a_group_cut_by_a_chunk_edge_once(
    tiny_model_path, tmp_path, table, chunk, count
):
    """Regression: the merge added the shards' distinct sources, so a source group cut by a
    chunk edge counted twice (630,218 against one process's 630,216 on the whole table)."""
    sources = _sources(table)
    assert any(sources[i] == sources[i - 1] for i in range(chunk, len(sources), chunk))
    one = rescore_table(
        str(table), [tiny_model_path], str(tmp_path / "one.gz"), _options(), progress=False
    )
    assert one.distinct_sources == sum(
        1 for i, s in enumerate(sources) if i == 0 or s != sources[i - 1]
    )
    parts = []
    for k in range(1, count + 1):
        parts.append(str(tmp_path / f"part.{k}.gz"))
        options = RescoreOptions(dtype="float32", chunk_lines=chunk)
        rescore_table(
            str(table), [tiny_model_path], parts[-1], options, progress=False, shard=Shard(k, count)
        )
    result = run_cli("merge-shards", *parts, "-o", tmp_path / "merged.gz")
    assert result.returncode == 0, result.stderr
    assert f", {one.distinct_sources} distinct sources -> " in result.stderr
    assert merge_shards(parts, str(tmp_path / "again.gz")).groups == one.distinct_sources


@pytest.mark.parametrize("shard", ["4/3", "0/3", "3", "1/0"])
def test_bad_shard_argument_is_refused_by_click(tiny_model_path, tmp_path, shard):
    result = run_cli(
        "rescore", SAMPLE_TABLE, "-m", tiny_model_path, "--shard", shard, "-o", tmp_path / "p"
    )
    assert result.returncode == 2, result.stderr
    assert "Invalid value for '--shard'" in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------- torchrun
def test_torchrun_rescoring_is_byte_identical_to_one_process(tiny_model_path, tmp_path):
    """The same --threads on both sides: the thread count changes the last float digits."""
    flags = ["--dtype", "float32", "--chunk-lines", CHUNK, "--threads", "1", "--no-progress"]
    one = run_cli("rescore", SAMPLE_TABLE, "-m", tiny_model_path, "-o", tmp_path / "one.gz", *flags)
    assert one.returncode == 0, one.stderr
    out = tmp_path / "torchrun.gz"
    result = torchrun(
        "-m", "phrasescore", "rescore", SAMPLE_TABLE, "-m", tiny_model_path, "-o", out, *flags
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == (tmp_path / "one.gz").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["one.gz", "torchrun.gz"]  # parts removed
    # the summary counts the source group cut by the edge at line 90 once, as one process does
    assert _distinct(result.stderr) == _distinct(one.stderr) == 127


def _distinct(stderr: str) -> int:
    return int(re.search(r", (\d+) distinct sources,", stderr).group(1))


TRAIN_SCRIPT = """
import sys
from tests.conftest import train_tiny
path, src, tgt, steps = sys.argv[1:5]
train_tiny(path, src, tgt, max_steps=int(steps), valid_every=4, optimizer="sgd", learning_rate=0.5,
           seed=5, resume=len(sys.argv) > 5)
"""


def _torchrun_train(path, corpus_files, steps, resume=False):
    script = Path(path).parent / "train_script.py"
    script.write_text(TRAIN_SCRIPT)
    args = [script, path, *corpus_files, steps] + (["resume"] if resume else [])
    result = torchrun(*args)
    assert result.returncode == 0, result.stderr
    return torch.load(str(path) + ".checkpoint", weights_only=True)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, corpus_files):
    path = tmp_path_factory.mktemp("ddp") / "m.safetensors"
    return _torchrun_train(path, corpus_files, 10)


class _GlobalBatches:
    """The batcher of one process that takes, per step, the batches two ranks take together."""

    def __init__(self, inner):
        self.inner = inner

    def batches(self, epoch):
        plan = self.inner.batches(epoch)
        return [sum((list(b) for b in plan[i : i + 2]), []) for i in range(0, len(plan), 2)]


def test_ddp_training_equals_one_process_on_the_same_global_batches(
    ddp_run, tmp_path, corpus_files, monkeypatch
):
    """Tolerance: the ranks' summed NLL and one process's NLL of the concatenated batch differ
    only by float32 summation order; after 10 SGD steps weights agree to 1e-5 (absolute, 1e-4
    relative), perplexities to 1e-5 relative. (SGD: Adam's m / sqrt(v) turns rounding noise in
    near-zero gradients into whole learning-rate steps.)"""
    import phrasescore.training.trainer as train

    real = train.TokenBudgetBatcher
    monkeypatch.setattr(train, "TokenBudgetBatcher", lambda *a, **k: _GlobalBatches(real(*a, **k)))
    path = tmp_path / "one.safetensors"
    train_tiny(
        path, *corpus_files, max_steps=10, valid_every=4, optimizer="sgd", learning_rate=0.5, seed=5
    )
    one = torch.load(str(path) + ".checkpoint", weights_only=True)
    for name, value in one["network"].items():
        torch.testing.assert_close(ddp_run["network"][name], value, atol=1e-5, rtol=1e-4)
    import json

    ddp_hist = json.loads(ddp_run["meta"])["position"]["history"]
    one_hist = json.loads(one["meta"])["position"]["history"]
    assert [h["step"] for h in ddp_hist] == [h["step"] for h in one_hist]
    for a, b in zip(ddp_hist, one_hist, strict=True):
        assert a["train_ppl"] == pytest.approx(b["train_ppl"], rel=1e-5)
        assert a["valid_ppl"] == pytest.approx(b["valid_ppl"], rel=1e-5)


def test_resume_under_torchrun_is_exact_and_needs_the_same_world_size(
    ddp_run, tmp_path, corpus_files
):
    path = tmp_path / "m.safetensors"
    _torchrun_train(path, corpus_files, 6)
    resumed = _torchrun_train(path, corpus_files, 10, resume=True)
    for name, value in ddp_run["network"].items():
        assert torch.equal(resumed["network"][name], value), name
    with pytest.raises(Exception, match="written with 2 processes"):
        train_tiny(path, *corpus_files, max_steps=12, resume=True, seed=5)
