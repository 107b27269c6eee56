"""``nbest``'s chunks read as raw lines, cut after whole sentence-id groups, and
``nbest --io-workers``: processes that parse, look up ids and format while this one scores give
one process's bytes, with every kind of feature, re-ranking, shards and errors.

The list is the real Multi30k 100-best list of test2016 ids 0-4 (324 hypotheses: 100, 100, 66,
12, 46)."""

from __future__ import annotations

import gzip

import pytest

from phrasescore.errors import InputError
from phrasescore.jobs.nbest.chunks import RawList, list_chunks
from phrasescore.jobs.nbest.features import ChunkFeatures
from phrasescore.jobs.nbest.nbest import NBestOptions, rescore_nbest
from phrasescore.moses.nbest import iter_nbest_groups, read_nbest
from phrasescore.runners.shards import Shard

from .conftest import DATA, interrupt_at_call, run_cli
from .test_nbest import weights_file

LIST = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
SOURCE = DATA / "nbest" / "multi30k.test2016.head5.tok.lc.en"


def _odd_list(tmp_path):
    """The real list with Windows line endings on ids 1 and 3 and its last line without a
    newline: the bytes a chunk must keep."""
    lines = gzip.open(LIST, "rb").read().splitlines(True)
    lines = [ln.replace(b"\n", b"\r\n") if ln[:2] in (b"1 ", b"3 ") else ln for ln in lines]
    lines[-1] = lines[-1].rstrip(b"\n")
    path = tmp_path / "odd.nbest"
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize("size", [1, 7, 66, 100, 101, 167, 1000])
def test_a_chunk_ends_after_the_group_that_brings_it_to_its_size(tmp_path, size):
    """The raw cut gives the chunks of the parsed groups (a chunk ends after the group that
    brings it to ``size`` lines or more), every byte kept, each chunk's first line numbered."""
    path = _odd_list(tmp_path)
    expected, count, lengths = [], 0, []
    for group in iter_nbest_groups(read_nbest(str(path))):
        count += len(group)
        if count >= size:
            expected.append(count)
            count = 0
    if count:
        expected.append(count)
    chunks = list(list_chunks(RawList(str(path)), size))
    lengths = [chunk.lines for chunk in chunks]
    assert lengths == expected
    assert b"".join(chunk.data for chunk in chunks) == path.read_bytes()
    assert [chunk.first_lineno for chunk in chunks] == [
        1 + sum(lengths[:i]) for i in range(len(chunks))
    ]
    assert [chunk.index for chunk in chunks] == list(range(len(chunks)))


def _run(out, models, **kw):
    options = NBestOptions(chunk_lines=kw.pop("chunk_lines", 30), **kw.pop("options", {}))
    return rescore_nbest(str(LIST), str(SOURCE), models, str(out), options, progress=False, **kw)


def test_io_workers_write_the_bytes_of_one_process(
    tiny_model_path, tiny_second_seed_model_path, tiny_inverse_model_path, tiny_lm_path, tmp_path
):
    """A model, an ensemble, a target->source model and a CSLM, each a feature: 1, 2 and 3
    processes that parse and format while this one scores give one process's bytes; the values
    are in every line."""
    models = [f"A={tiny_model_path}", f"E={tiny_model_path},{tiny_second_seed_model_path}"]
    options = {"inverse_models": (f"Inv={tiny_inverse_model_path}",), "lm": tiny_lm_path}
    one = _run(tmp_path / "one.gz", models, options=options)
    expected = (tmp_path / "one.gz").read_bytes()
    text = gzip.decompress(expected).decode()
    assert text.count("\n") == 324 == one.hypotheses
    for name in ("CSLM0", "A", "E", "Inv"):
        assert text.count(f" {name}= ") == 324, name
    for io_workers in (1, 2, 3):
        out = tmp_path / f"io{io_workers}.gz"
        result = _run(out, models, options=options, io_workers=io_workers)
        assert out.read_bytes() == expected, io_workers
        assert (result.hypotheses, result.sentences) == (324, 5)


@pytest.mark.parametrize("one_best", [False, True], ids=["reranked", "one-best"])
def test_io_workers_rerank_and_shard_with_the_bytes_of_one_process(tiny_model_path, tmp_path,
                                                                  one_best):  # fmt: skip
    """Re-ranking by the model alone (the changed count summed over the workers' chunks), the 1-best
    lines placed by id, and a shard's part: one process's bytes and counts."""
    options = {"weights": weights_file(tmp_path, 1.0, 0.0), "one_best": one_best}
    one = _run(tmp_path / "one.txt", tiny_model_path, options=options)
    two = _run(tmp_path / "two.txt", tiny_model_path, options=options, io_workers=2)
    assert (tmp_path / "two.txt").read_bytes() == (tmp_path / "one.txt").read_bytes()
    assert two.changed == one.changed and one.changed > 0
    if not one_best:
        for k in (1, 2, 3):
            shard = Shard(k, 3)
            _run(tmp_path / f"p{k}.txt", tiny_model_path, options=options, shard=shard)
            _run(tmp_path / f"q{k}.txt", tiny_model_path, options=options, shard=shard,
                 io_workers=2)  # fmt: skip
            assert (tmp_path / f"q{k}.txt").read_bytes() == (tmp_path / f"p{k}.txt").read_bytes()


def test_io_workers_resume_after_an_interruption(tiny_model_path, tmp_path, monkeypatch):
    """Stopped (Ctrl-C) while this process scores the 3rd chunk for one io-worker, then
    --resume with 3: one uninterrupted run's bytes. One worker has at most 2 chunks in flight,
    so the 3rd is sent only once the 1st is written (100 hypotheses; the 2nd may be too)."""
    _run(tmp_path / "full.gz", tiny_model_path)
    out = tmp_path / "out.gz"
    interrupt_at_call(monkeypatch, ChunkFeatures, "serve", 3)
    with pytest.raises(KeyboardInterrupt):
        _run(out, tiny_model_path, io_workers=1)
    monkeypatch.undo()
    assert not out.exists()
    resumed = _run(out, tiny_model_path, io_workers=3, resume=True)
    assert resumed.resumed_hypotheses in (100, 200)
    assert out.read_bytes() == (tmp_path / "full.gz").read_bytes()


def test_a_bad_line_seen_by_an_io_worker_is_one_error_line_and_no_output(tiny_model_path,
                                                                         tmp_path):  # fmt: skip
    lines = gzip.open(LIST, "rb").read().splitlines(True)
    lines[140] = b"1 ||| two fields\n"
    listing = tmp_path / "bad.nbest"
    listing.write_bytes(b"".join(lines))
    out = tmp_path / "out.gz"
    proc = run_cli("-q", "nbest", listing, "--source", SOURCE, "-m", tiny_model_path, "-o", out,
                   "--io-workers", "2", "--chunk-lines", "30", "--no-progress")  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"phrasescore: error: {listing}:141: expected at least 4 fields separated by '|||' "
        "(id ||| hypothesis ||| features ||| total), found 2"
    ], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.nbest"]


@pytest.mark.parametrize("io_workers", [0, 2])
def test_an_id_that_comes_back_in_a_later_chunk_is_refused_at_its_line(tiny_model_path, tmp_path,
                                                                      io_workers):  # fmt: skip
    """Id 0's hypotheses again after id 1's, in another chunk than its first ones: the run
    refuses the list at that line, whichever process parsed the chunk."""
    lines = gzip.open(LIST, "rb").read().splitlines(True)
    back = [b"0" + line[1:] for line in lines[:3]]
    listing = tmp_path / "back.nbest"
    listing.write_bytes(b"".join(lines[:200] + back + lines[200:]))
    with pytest.raises(InputError) as info:
        rescore_nbest(str(listing), str(SOURCE), tiny_model_path, str(tmp_path / "out.gz"),
                      NBestOptions(chunk_lines=30), progress=False, io_workers=io_workers)  # fmt: skip
    assert str(info.value).startswith(
        f"{listing}:201: the hypotheses of sentence 0 are not contiguous"
    )
    assert not (tmp_path / "out.gz").exists()
