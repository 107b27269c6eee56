"""Sharded rescoring: the plan and the manifest beside each part (the checked merge: :mod:`.merge`).

The plan
--------
``rescore`` reads a table in chunks of ``chunk_lines`` lines and scores each chunk on its own (the
batch plan of :mod:`phrasescore.engine.scoring` depends only on the chunk), so a chunk is the unit that
keeps the bytes: chunk ``i`` (0-based) belongs to shard ``i % N + 1``. The plan depends only on the
input and ``--chunk-lines``; every shard reads the input once, from the beginning, scores its own
chunks and skips the others, so it needs no line count before it starts, and the shards get equal
work whatever the order of the table. A source group that straddles a chunk boundary is split
exactly where one process splits it, which is what makes the merged table byte-identical; each
chunk's record in the manifest (:func:`chunk_record`) keeps its first and last source, so that the
merge counts such a group once (:func:`joined_runs`), as one process does.

``nbest`` reads a Moses n-best list in chunks too, the same rule, but cut at sentence-id groups:
a chunk ends after the group that brings it to ``chunk_lines`` lines or more (the blocks one
process scores), so no sentence's hypotheses are ever split; its plan lists every chunk's lines.

The manifest
------------
Each part ``PART`` gets ``PART.manifest.json``, written just before the part takes its final name:
the input's identity (size, SHA-256 of its first and last MiB, line count), the plan (N, K,
chunk lines, number of chunks), the models' signatures and the flags that change the bytes, and
the part's own size, SHA-256 and line count.

The merge of the parts (checked, chunks interleaved in plan order) is :mod:`.merge`'s.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
from dataclasses import dataclass

import torch

from phrasescore import __version__
from phrasescore.errors import InputError
from phrasescore.files.kinds import IO_BUFFER
from phrasescore.files.outputs import AtomicOutput

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "phrasescore-shard"
PHRASE_TABLE = "phrase-table"
NBEST = "nbest"
_EDGE_BYTES = 1 << 20


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``K/N`` as given to ``--shard``."""
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
        if not match:
            raise InputError(f"{text!r} is not K/N (e.g. 3/8)")
        index, count = int(match.group(1)), int(match.group(2))
        if count < 1 or not 1 <= index <= count:
            raise InputError(f"{text!r}: K must be between 1 and N, and N at least 1")
        return cls(index, count)

    def owns(self, chunk: int) -> bool:
        """Whether chunk ``chunk`` (0-based, in input order) is this shard's."""
        return chunk % self.count == self.index - 1

    def first_unscored_chunk(self, chunks_done: int) -> int:
        """The input chunk after the first ``chunks_done`` chunks of this shard (for resume)."""
        return self.index - 1 + chunks_done * self.count

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def manifest_path(part: str) -> str:
    return part + MANIFEST_SUFFIX


def input_identity(path: str, lines: int) -> dict:
    """Size, line count and SHA-256 of the first and last MiB: the same table on any machine,
    wherever it is mounted, without a second read of the whole file."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = hashlib.sha256(fh.read(_EDGE_BYTES)).hexdigest()
        fh.seek(max(0, size - _EDGE_BYTES))
        tail = hashlib.sha256(fh.read(_EDGE_BYTES)).hexdigest()
    return {"size": size, "lines": lines, "head_sha256": head, "tail_sha256": tail}


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(IO_BUFFER):
            digest.update(block)
    return digest.hexdigest()


def chunk_record(index: int, keys: list[str]) -> dict:
    """What a manifest keeps of one chunk of its part: the chunk's index and lines, the runs of
    equal consecutive ``keys`` in it (a table's sources: its distinct sources as one process
    counts them; an n-best list's sentence ids: its sentences) and the SHA-256 of its first and
    last key, so that the merge can tell a run cut by the chunk's edges (:func:`joined_runs`)."""
    runs = sum(1 for i, key in enumerate(keys) if i == 0 or key != keys[i - 1])
    if not keys:
        return runs_record(index, 0, 0, None, None)
    return runs_record(index, len(keys), runs, keys[0].encode("utf-8"), keys[-1].encode("utf-8"))


def runs_record(index: int, lines: int, runs: int, first: bytes | None, last: bytes | None):
    """:func:`chunk_record` of a chunk whose runs were counted already (``first``, ``last``:
    its first and last key as UTF-8; None for a chunk of no line)."""
    record = {"chunk": index, "lines": lines, "runs": runs}
    if lines:
        record["first"] = hashlib.sha256(first).hexdigest()
        record["last"] = hashlib.sha256(last).hexdigest()
    return record


def joined_runs(records: list[dict]) -> int:
    """The runs of equal keys over chunks laid end to end in plan order (``records`` of
    :func:`chunk_record`): each chunk's runs, less one for each edge whose two sides have the
    same key (one run cut in two by the chunk edge)."""
    records = [r for r in records if r["lines"]]
    joins = sum(1 for a, b in itertools.pairwise(records) if a["last"] == b["first"])
    return sum(r["runs"] for r in records) - joins


def write_manifest(
    part: str,
    written: str,
    shard: Shard,
    table: str,
    input_lines: int,
    chunk_lines: int,
    part_lines: int,
    job: dict,
    device: str = "cpu",
    kind: str = PHRASE_TABLE,
    chunk_sizes: list[int] | None = None,
    chunks: list[dict] | None = None,
) -> dict:
    """Write ``part``'s manifest; ``written`` is the complete file that is about to become
    ``part``. ``job`` holds what must agree across parts (models, flags, columns).

    ``chunk_sizes``: the lines of every chunk of the input, where chunks are cut at groups
    (n-best lists); without it every chunk but the last has ``chunk_lines`` lines. ``chunks``:
    the part's :func:`chunk_record` of each of its chunks, in order."""
    plan = {"chunk_lines": chunk_lines, "rule": "chunk i -> shard i%N+1"}
    if chunk_sizes is None:
        plan["chunks"] = -(-input_lines // chunk_lines)
    else:
        plan["chunks"] = len(chunk_sizes)
        plan["cut"] = "after the sentence-id group that reaches chunk_lines"
        plan["chunk_sizes"] = list(chunk_sizes)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": 1,
        "phrasescore": __version__,
        "kind": kind,
        "shard": shard.index,
        "of": shard.count,
        "input_path": os.path.abspath(table),
        "input": input_identity(table, input_lines),
        "plan": plan,
        "job": job,
        "device": device,
        "threads": torch.get_num_threads(),
        "part": {
            "name": os.path.basename(part),
            "size": os.path.getsize(written),
            "sha256": file_sha256(written),
            "lines": part_lines,
            "gzip": part.endswith(".gz"),
        },
    }
    if chunks is not None:
        manifest["part"]["chunks"] = chunks
    with AtomicOutput(manifest_path(part), compress=False) as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return manifest


# ---------------------------------------------------------------------------- torchrun
def shard_part_path(output: str, shard: Shard) -> str:
    """The hidden part of rank ``shard`` beside ``output`` under torchrun."""
    directory, name = os.path.split(os.path.abspath(output))
    suffix = ".gz" if name.endswith(".gz") else ""
    return os.path.join(directory, f".{name}.shard-{shard.index}-of-{shard.count}{suffix}")
