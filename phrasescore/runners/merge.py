"""The checked merge of the parts of ``rescore --shard`` and ``nbest --shard`` (each with the
manifest :mod:`.shards` writes beside it).

:func:`merge_shards` checks that the parts are complete (size and SHA-256 as recorded, each chunk
of the planned line count, every gzip stream complete), come from the same input, models and
flags, and cover every chunk exactly once; then it interleaves the chunks in plan order into one
atomically written file. A gzip part holds one gzip member per chunk, as the unsharded output
does, and members are copied as they are: the merged file is byte-identical to one process's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass

from phrasescore.compression import ZLIB_LEVEL, compress_member
from phrasescore.errors import InputError
from phrasescore.files import (
    IO_BUFFER,
    AtomicOutput,
    display_name,
    output_lock,
    remove_stale_temporaries,
)
from phrasescore.runners.shards import (
    MANIFEST_FORMAT,
    NBEST,
    PHRASE_TABLE,
    Shard,
    joined_runs,
    manifest_path,
)

log = logging.getLogger(__name__)

_KIND_NAMES = {PHRASE_TABLE: "a phrase table", NBEST: "an n-best list"}


@dataclass
class MergeResult:
    output: str
    lines: int
    parts: int
    chunks: int
    manifest: dict
    groups: int | None = None
    """A table's distinct sources (as one process counts them: runs of one source), an n-best
    list's sentences; None when a part's manifest has no chunk records (an older phrasescore)."""

    @property
    def kind(self) -> str:
        return part_kind(self.manifest)

    @property
    def column_names(self) -> list[str]:
        return self.manifest["job"]["columns"]

    @property
    def new_columns(self) -> int:
        return len(self.column_names)


def read_manifest(part: str) -> dict:
    if not os.path.isfile(part):
        raise InputError("no such part", part)
    path = manifest_path(part)
    if not os.path.isfile(path):
        raise InputError(
            f"no manifest {os.path.basename(path)} beside the part (not a finished "
            "`phrasescore rescore --shard` or `nbest --shard` output)",
            part,
        )
    try:
        with open(path) as fh:
            manifest = json.load(fh)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"unreadable manifest ({exc})", path) from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise InputError("not a phrasescore shard manifest", path)
    problem = _manifest_problem(manifest)
    if problem:
        raise InputError(f"invalid manifest: {problem}", path)
    return manifest


def recorded_inputs(parts: list[str]) -> list[str]:
    """The files the ``parts``' manifests record as the input they were scored from (the table
    or n-best list: ``input_path``), for those whose manifest can be read (:func:`check_parts`
    reports the others): an output of the merge must not overwrite them."""
    paths = []
    for part in parts:
        with suppress(InputError):
            path = read_manifest(part).get("input_path")
            if isinstance(path, str):
                paths.append(path)
    return paths


_INT, _STR, _BOOL, _DICT, _LIST = "an integer", "a string", "true or false", "an object", "a list"
_MANIFEST_FIELDS = {
    "shard": _INT,
    "of": _INT,
    "input": _DICT,
    "input.size": _INT,
    "input.lines": _INT,
    "plan": _DICT,
    "plan.chunk_lines": _INT,
    "plan.chunks": _INT,
    "job": _DICT,
    "part": _DICT,
    "part.name": _STR,
    "part.size": _INT,
    "part.sha256": _STR,
    "part.lines": _INT,
    "part.gzip": _BOOL,
}
_OPTIONAL_FIELDS = {
    "kind": _STR,
    "input_path": _STR,
    "plan.chunk_sizes": _LIST,
    "part.chunks": _LIST,
}
_CHECKS = {
    _INT: lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    _STR: lambda v: isinstance(v, str),
    _BOOL: lambda v: isinstance(v, bool),
    _DICT: lambda v: isinstance(v, dict),
    _LIST: lambda v: isinstance(v, list),
}


def _manifest_problem(manifest: dict) -> str | None:
    """What makes a manifest unusable (a field missing or of the wrong type), or None."""

    def get(key: str):
        value = manifest
        for name in key.split("."):
            if not isinstance(value, dict) or name not in value:
                return _MISSING
            value = value[name]
        return value

    for fields, required in ((_MANIFEST_FIELDS, True), (_OPTIONAL_FIELDS, False)):
        for key, kind in fields.items():
            value = get(key)
            if value is _MISSING:
                if required:
                    return f'"{key}" is missing'
                continue
            if not _CHECKS[kind](value):
                return f'"{key}" is not {kind}{" >= 0" if kind == _INT else ""}'
    if not 1 <= manifest["shard"] <= manifest["of"]:
        return f'"shard" {manifest["shard"]} is not between 1 and "of" {manifest["of"]}'
    sizes = get("plan.chunk_sizes")
    if sizes is not _MISSING and not all(_CHECKS[_INT](n) for n in sizes):
        return '"plan.chunk_sizes" holds something other than integers >= 0'
    records = get("part.chunks")
    if records is not _MISSING:
        for record in records:
            if not (
                isinstance(record, dict)
                and all(_CHECKS[_INT](record.get(k)) for k in ("chunk", "lines", "runs"))
                and (
                    not record["lines"]
                    or all(_CHECKS[_STR](record.get(k)) for k in ("first", "last"))
                )
            ):
                return f'"part.chunks" holds an invalid chunk record {record!r}'[:200]
    return None


_MISSING = object()


def part_kind(manifest: dict) -> str:
    """:data:`PHRASE_TABLE` or :data:`NBEST`: what a part holds."""
    return manifest.get("kind", PHRASE_TABLE)


def _kind_name(manifest: dict) -> str:
    kind = part_kind(manifest)
    return _KIND_NAMES.get(kind, repr(kind))


def _common(manifest: dict) -> dict:
    """What every part of one job shares."""
    return {key: manifest.get(key) for key in ("kind", "of", "input", "plan", "job")}


def check_parts(parts: list[str]) -> list[tuple[str, dict]]:
    """The parts with their manifests, in shard order, after the checks that need no reading:
    same job, every shard exactly once, part files of the recorded size."""
    if not parts:
        raise InputError("give the parts to merge")
    loaded = [(part, read_manifest(part)) for part in parts]
    first_part, first = loaded[0]
    for part, manifest in loaded[1:]:
        mine, theirs = _common(manifest), _common(first)
        if mine["kind"] != theirs["kind"]:
            raise InputError(
                f"foreign part: a part of {_kind_name(manifest)}, but {display_name(first_part)} "
                f"is a part of {_kind_name(first)}",
                part,
            )
        if mine != theirs:
            what = next(k for k in ("input", "job", "of", "plan") if mine[k] != theirs[k])
            reason = {
                "input": f"another input {'n-best list' if mine['kind'] == NBEST else 'table'}",
                "job": "other models or flags",
                "of": "another number of shards",
                "plan": "another --chunk-lines",
            }[what]
            raise InputError(
                f"foreign part: made from {reason} than {display_name(first_part)}", part
            )
    count = first["of"]
    by_index: dict[int, str] = {}
    for part, manifest in loaded:
        index = manifest["shard"]
        if index in by_index:
            raise InputError(
                f"shard {index}/{count} given twice (also {display_name(by_index[index])})", part
            )
        by_index[index] = part
        size = os.path.getsize(part)
        if size != manifest["part"]["size"]:
            raise InputError(
                f"truncated or changed part: {size} bytes, the manifest says "
                f"{manifest['part']['size']}",
                part,
            )
    setups = sorted({f"{m.get('device')} x{m.get('threads')}" for _, m in loaded})
    if len(setups) > 1:
        log.warning(
            "parts were scored on different devices or thread counts (%s): scores may differ "
            "in the last digits from one process's",
            ", ".join(setups),
        )
    missing = [str(k) for k in range(1, count + 1) if k not in by_index]
    if missing:
        raise InputError(
            f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of {count} missing "
            f"(give all {count} parts)"
        )
    return sorted(loaded, key=lambda item: item[1]["shard"])


def in_members(manifest: dict) -> bool:
    """Whether the job writes a ``.gz`` output one gzip member a chunk: a phrase table always,
    an n-best list since its manifest gives the gzip level (before, one gzip stream)."""
    return part_kind(manifest) == PHRASE_TABLE or "gzip_level" in manifest["job"].get("options", {})


class _PartReader:
    """The chunks of one part in order, as (text bytes, gzip member bytes or None), checked
    against the manifest: SHA-256 of the whole file, lines per chunk, complete gzip members.

    A gzip part holds one gzip member per chunk (copied as they are); an n-best part written
    before n-best lists were compressed chunk by chunk is one gzip stream, read as text
    (``members`` False: :func:`in_members`)."""

    def __init__(self, part: str, manifest: dict):
        self.part = part
        self.manifest = manifest
        self.gzip = manifest["part"]["gzip"]
        self.members = self.gzip and in_members(manifest)
        self.digest = hashlib.sha256()
        self.handle = open(part, "rb")
        self.lines_read = 0
        self._members = self._gzip_members() if self.members else None
        self._text = self._gzip_text() if self.gzip and not self.members else None
        self._pending = b""

    def _read(self) -> bytes:
        block = self.handle.read(IO_BUFFER)
        self.digest.update(block)
        return block

    def _read_text(self) -> bytes:
        """The next block of the part's text (decompressed for a gzip stream)."""
        if self._text is None:
            return self._read()
        return next(self._text, b"")

    def _gzip_text(self) -> Iterator[bytes]:
        """The text of a gzip file, block by block, member after member; a stream cut short is
        an error."""
        data = self._read()
        while data:
            decomp = zlib.decompressobj(wbits=31)
            while True:
                try:
                    text = decomp.decompress(data)
                except zlib.error as exc:
                    raise InputError(f"corrupt gzip stream ({exc})", self.part) from None
                if text:
                    yield text
                if decomp.eof:
                    data = decomp.unused_data or self._read()
                    break
                data = self._read()
                if not data:
                    raise InputError("truncated gzip stream (part incomplete)", self.part)

    def _gzip_members(self) -> Iterator[tuple[bytes, bytes]]:
        data = b""
        while True:
            if not data:
                data = self._read()
                if not data:
                    return
            decomp = zlib.decompressobj(wbits=31)
            member = bytearray()
            text = bytearray()
            while True:
                try:
                    out = decomp.decompress(data)
                except zlib.error as exc:
                    raise InputError(f"corrupt gzip stream ({exc})", self.part) from None
                text += out
                if decomp.eof:
                    used = len(data) - len(decomp.unused_data)
                    member += data[:used]
                    data = decomp.unused_data
                    break
                member += data
                data = self._read()
                if not data:
                    raise InputError("truncated gzip stream (part incomplete)", self.part)
            yield bytes(text), bytes(member)

    def chunk(self, n_lines: int) -> tuple[bytes, bytes | None]:
        """The next chunk, which must have ``n_lines`` lines."""
        if self.members:
            while True:
                item = next(self._members, None)
                if item is None:
                    raise InputError("part ends early: fewer chunks than planned", self.part)
                text, member = item
                if text or n_lines == 0:
                    break  # an empty member only ends an empty part
            lines = text.count(b"\n") + (0 if text.endswith(b"\n") or not text else 1)
            if lines != n_lines:
                raise InputError(
                    f"chunk of {lines} lines where the plan has {n_lines} (not this job's part)",
                    self.part,
                )
            self.lines_read += lines
            return text, member
        text = bytearray()
        for _ in range(n_lines):
            line = self._readline()
            if not line:
                raise InputError("part ends early: fewer lines than planned", self.part)
            text += line
        self.lines_read += n_lines
        return bytes(text), None

    def _readline(self) -> bytes:
        while True:
            end = self._pending.find(b"\n")
            if end >= 0:
                line, self._pending = self._pending[: end + 1], self._pending[end + 1 :]
                return line
            block = self._read_text()
            if not block:
                line, self._pending = self._pending, b""
                return line
            self._pending += block

    def finish(self) -> None:
        """Read to the end: nothing may be left but an empty gzip member; check the SHA-256."""
        if self.members:
            for text, _member in self._members:
                if text:
                    raise InputError("part has more lines than planned", self.part)
        elif self._pending or self._readline():
            raise InputError("part has more lines than planned", self.part)
        while self._read():
            pass
        self.handle.close()
        if self.digest.hexdigest() != self.manifest["part"]["sha256"]:
            raise InputError("part changed since it was written (SHA-256 differs)", self.part)
        if self.lines_read != self.manifest["part"]["lines"]:
            raise InputError(
                f"part has {self.lines_read} lines, its manifest {self.manifest['part']['lines']}",
                self.part,
            )

    def close(self) -> None:
        self.handle.close()


def chunk_sizes(manifest: dict) -> list[int]:
    """The lines of each chunk of the input, in plan order."""
    plan = manifest["plan"]
    total = manifest["input"]["lines"]
    if "chunk_sizes" in plan:
        sizes = plan["chunk_sizes"]
        if sum(sizes) != total or len(sizes) != plan["chunks"]:
            raise InputError(
                "manifest's plan does not add up to its input", manifest["part"]["name"]
            )
        return sizes
    chunk_lines = plan["chunk_lines"]
    return [min(chunk_lines, total - i * chunk_lines) for i in range(plan["chunks"])]


def _merged_groups(ordered: list[tuple[str, dict]], sizes: list[int]) -> int | None:
    """:func:`joined_runs` over every part's chunk records laid out in plan order; None when a
    part has no records (written by an older phrasescore)."""
    records: list[dict | None] = [None] * len(sizes)
    for part, manifest in ordered:
        own = manifest["part"].get("chunks")
        if own is None:
            return None
        shard = Shard(manifest["shard"], manifest["of"])
        for record in own:
            i = record.get("chunk")
            if not (isinstance(i, int) and 0 <= i < len(sizes)) or not shard.owns(i):
                raise InputError(f"manifest records chunk {i}, not this shard's", part)
            if records[i] is not None or record["lines"] != sizes[i]:
                raise InputError(f"manifest's record of chunk {i} does not fit the plan", part)
            records[i] = record
    if any(record is None for record in records):
        return None
    return joined_runs(records)


def check_not_a_part(output: str | None, parts: list[str], what: str = "output") -> None:
    """Refuse an output (of ``merge-shards``) onto one of its input parts or their manifests."""
    if not output or output == "-":
        return
    target = os.path.abspath(output)
    for part in parts:
        if target == os.path.abspath(part):
            raise InputError(f"the {what} would overwrite a part", output)
        if target == os.path.abspath(manifest_path(part)):
            raise InputError(
                f"the {what} would overwrite the manifest of the part {display_name(part)}", output
            )


def merge_shards(parts: list[str], output: str) -> MergeResult:
    """Check ``parts`` and write their chunks in plan order to ``output`` (atomically).

    The gzip members of a phrase table or an n-best list are copied as they are (a ``.gz``
    output from plain parts gets one member per chunk, as ``rescore`` and ``nbest`` write it);
    an n-best list of an earlier phrasescore is written as its ``nbest`` wrote it: plain text,
    or one gzip stream for a ``.gz`` output."""
    ordered = check_parts(parts)
    manifest = ordered[0][1]
    count = manifest["of"]
    total = manifest["input"]["lines"]
    sizes = chunk_sizes(manifest)
    chunks = len(sizes)
    check_not_a_part(output, [part for part, _ in ordered])
    groups = _merged_groups(ordered, sizes)
    with output_lock(output):  # one merge at a time on an output
        if output != "-":
            remove_stale_temporaries(output)  # of a merge killed before (kill -9)
        readers = [_PartReader(part, m) for part, m in ordered]
        try:
            if in_members(manifest):
                # the level the job wrote with (a table whose manifest has none: gzip's 6)
                level = manifest["job"].get("options", {}).get("gzip_level", ZLIB_LEVEL)
                _merge_members(readers, sizes, output, level)
            else:
                _merge_text(readers, sizes, output)
        finally:
            for reader in readers:
                reader.close()
    log.info(
        "merged %d parts (%d chunks, %d lines) into %s",
        count,
        chunks,
        total,
        display_name(output) if output != "-" else "<stdout>",
    )
    return MergeResult(output, total, count, chunks, manifest, groups)


def _merge_members(readers: list[_PartReader], sizes: list[int], output: str, level: int) -> None:
    """A phrase table or an n-best list: gzip members copied as they are; a ``.gz`` output from
    plain parts gets one member per chunk, as ``rescore`` and ``nbest`` write it (gzip
    ``level``: the job's)."""
    compress = output.endswith(".gz")
    with AtomicOutput(output, binary=True, compress=False) as out:
        for i, n_lines in enumerate(sizes):
            text, member = readers[i % len(readers)].chunk(n_lines)
            if not compress:
                out.write(text)
            elif member is not None:
                out.write(member)
            else:
                out.write(compress_member(text, level))
        if compress and not sizes:
            out.write(compress_member(b"", level))
        for reader in readers:
            reader.finish()


def _merge_text(readers: list[_PartReader], sizes: list[int], output: str) -> None:
    """An n-best list of an earlier phrasescore: the text written through the very writer its
    ``nbest`` wrote with (a text :class:`AtomicOutput`, one gzip stream for ``.gz``), so that
    the bytes are the same."""
    with AtomicOutput(output) as out:
        for i, n_lines in enumerate(sizes):
            reader = readers[i % len(readers)]
            text, _ = reader.chunk(n_lines)
            try:
                out.write(text.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InputError(f"invalid UTF-8 ({exc.reason})", reader.part) from None
        for reader in readers:
            reader.finish()
