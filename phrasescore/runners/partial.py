"""The output of a chunked job (``rescore``, ``nbest``) while it is written: chunks appended to
a partial file and its resume state, then published under the output's name (the outputs that
cannot be resumed, streams and outputs written whole, are :mod:`.streams`').

Chunks and resume
-----------------
The input is read in chunks (``rescore``: ``chunk_lines`` lines of the table; ``nbest``: about
as many lines, cut between sentence ids). Each chunk is scored, formatted and appended to a
partial file next to the output (``.NAME.partial``; for rescore's ``.gz`` output every chunk is
one complete gzip member, and a file of several members is a valid gzip file that zlib, Moses
and ``zcat`` read as one stream). After each chunk the partial file is synced and a small JSON
state file (``.NAME.partial.json``) records the lines and bytes done, the size and CRC-32 of the
last chunk and the CRC-32 of all the bytes done. Only when the whole input was written is the
partial file published under the output name: renamed, or, for nbest's ``.gz`` and
``--one-best`` outputs, rewritten through :class:`TextPublish`.

``resume`` proves the partial file against its state before it keeps a byte of it: at least as
many bytes, the last chunk's CRC-32, then a read of the whole kept prefix whose CRC-32 must be the
state's and whose lines (decompressed, for a ``.gz`` output) must be the state's count. Anything
else is refused in one line, never resumed into a corrupt table; a state of an earlier version,
without the CRC-32 of the whole prefix, cannot be proven and the run starts again from the
beginning (with a warning saying why). It then truncates the file to the last recorded chunk and
goes on from the next input line, so the result is byte-identical to an uninterrupted run with
the same flags. With nothing to resume it starts from the beginning; a ``--shard`` part that is
complete with its manifest is left as it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import zlib
from collections.abc import Callable, Iterable

from phrasescore.compression import TABLE_LEVEL, compress_member
from phrasescore.errors import InputError, RunStopped
from phrasescore.files.disk import DISK_ERRORS
from phrasescore.files.kinds import IO_BUFFER, is_pipe, is_stream_target
from phrasescore.files.outputs import AtomicOutput
from phrasescore.runners.shards import (
    Shard,
    manifest_path,
)

log = logging.getLogger(__name__)

"""Bytes read at a time when a resume checks the partial file."""


def chunk_bytes(text: str | bytes, gzip_level: int | None) -> bytes:
    """A chunk's output lines as written: UTF-8 (bytes as they are), and for a ``.gz`` output (``gzip_level`` not
    None) one complete gzip member (a file of members is one valid gzip stream;
    :mod:`phrasescore.compression`)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if gzip_level is None:
        return data
    return compress_member(data, gzip_level)


def partial_paths(output: str) -> tuple[str, str]:
    """The hidden partial file beside ``output`` and its JSON state (``--resume``)."""
    directory, name = os.path.split(os.path.abspath(output))
    partial = os.path.join(directory, f".{name}.partial")
    return partial, partial + ".json"


def run_outputs(output: str, shard: Shard | None = None) -> dict[str, str | None]:
    """The files a chunked run on ``output`` writes, by what they are (for
    :func:`~phrasescore.files.refuse_outputs_onto_inputs`): ``-o`` and, beside a file output, the
    partial output, its state and a shard's manifest."""
    if output == "-" or is_stream_target(output):
        return {"-o": output}
    partial, state = partial_paths(output)
    return {
        "-o": output,
        "-o's partial output": partial,
        "-o's partial state": state,
        "-o's manifest": manifest_path(output) if shard is not None else None,
    }


def check_work_paths(output: str, shard: Shard | None = None) -> None:
    """Refuse, before any work, a directory where the run will write a file of its own beside
    ``output``: the partial file, its state, a shard's manifest."""
    if output == "-":
        return
    partial, state = partial_paths(output)
    paths = {partial: "partial output", state: "partial output's state"}
    if shard is not None:
        paths[manifest_path(output)] = "part's manifest"
    for path, what in paths.items():
        if os.path.isdir(path):
            raise InputError(f"is a directory where the {what} goes: remove it", path)


def check_resume_input(path: str, what: str) -> None:
    """Refuse ``--resume`` on a named pipe: a resume reads its input again from the start (to
    check the lines the partial output was made from), which a pipe cannot give twice."""
    if path != "-" and is_pipe(path):
        raise InputError(
            f"--resume reads the {what} again from its start: give the file, not a pipe", path
        )


class PartialOutput:
    """The partial output file and its JSON state (see the module docstring)."""

    resumable = True

    def __init__(
        self,
        output: str,
        identity: dict,
        gzip_level: int = TABLE_LEVEL,
        text: TextPublish | None = None,
    ):
        self.output = output
        self.path, self.state_path = partial_paths(output)
        self.identity = identity
        self.text = text
        """None: the partial file holds the output's bytes (a ``.gz`` output's gzip members) and
        is renamed into place; else it holds plain text that :meth:`publish` writes whole."""
        self.compress = output.endswith(".gz") and text is None
        self.gzip_level = gzip_level if self.compress else None
        """What :func:`chunk_bytes` compresses with (None: a plain output)."""
        self.totals: dict | None = None
        """The job's running totals after the chunks written (kept in the state, restored by
        a resume)."""
        self.lines_done = 0
        self.bytes_done = 0
        self.last_chunk: list[int] | None = None
        """[size, CRC-32] of the last chunk written: checked against the file on resume."""
        self.crc = 0
        """CRC-32 of all the bytes written: the whole kept prefix is checked against it."""
        self.input_crc = 0
        """CRC-32 of the input lines those bytes were made from: a resume reads them again and
        checks that they are the same (:meth:`check_input`)."""
        self.input_crc_recorded = True
        """False for a state of an earlier version, which records no input CRC-32."""
        self.handle = None

    @contextlib.contextmanager
    def _writing(self):
        """A disk's write error (full, quota, I/O) in the block, writing the partial file or
        its state: one line naming the output, the partial output kept for ``--resume``."""
        try:
            yield
        except (OSError, RunStopped) as exc:
            if isinstance(exc, OSError) and exc.errno not in DISK_ERRORS:
                raise
            reason = exc.strerror if isinstance(exc, OSError) else exc.reason
            if reason is None:
                raise
            raise RunStopped(
                f"cannot write the partial output {os.path.basename(self.path)}: {reason}; it "
                "is kept: free space, then rerun with --resume",
                self.output,
            ) from None

    def open(self, resume: bool) -> int:
        if resume:
            here = [os.path.exists(p) for p in (self.path, self.state_path)]
            if all(here) and self._resume():
                return self.lines_done
            if not all(here):
                log.info(
                    "nothing to resume for %s (%s): starting from the beginning",
                    self.output,
                    "no partial output of an earlier run"
                    if not any(here)
                    else f"{os.path.basename(self.state_path if here[0] else self.path)} is "
                    "missing",
                )
        if os.path.exists(self.state_path):
            log.info("starting again: %s held an earlier partial run", self.path)
        try:
            self.handle = open(self.path, "wb")
        except OSError as exc:
            raise InputError(
                f"cannot write the partial output ({exc.strerror})", self.path
            ) from None
        self._write_state()
        return 0

    def _resume(self) -> bool:
        """Go on with the partial file after proving it against its state (True), or start
        again (False) when the state cannot prove it (one written by an earlier version)."""
        again = "; run without --resume to start again"
        try:
            with open(self.state_path, encoding="utf-8") as fh:
                state = json.load(fh)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise InputError(
                f"unreadable resume state ({reason}){again}", self.state_path
            ) from None
        if not isinstance(state, dict) or not _valid_state(state):
            raise InputError(
                f"invalid resume state (lines, bytes or last chunk missing or out of range){again}",
                self.state_path,
            )
        if state.get("identity") != self.identity:
            raise InputError(
                "cannot resume: the partial output was made from another input, model or "
                f"flags ({identity_difference(state.get('identity'), self.identity)} differs; "
                "run without --resume to start again)",
                self.output,
            )
        lines, size, last = state["lines"], state["bytes"], state["last_chunk"]
        actual = os.path.getsize(self.path)
        if actual < size:
            raise InputError(
                f"partial output has {actual} bytes, its state {os.path.basename(self.state_path)}"
                f" records {size}: truncated or changed since{again}",
                self.path,
            )
        try:
            self.handle = open(self.path, "r+b")
        except OSError as exc:
            raise InputError(
                f"cannot resume the partial output ({exc.strerror})", self.path
            ) from None
        try:
            if last is not None:
                self.handle.seek(size - last[0])
                if zlib.crc32(self.handle.read(last[0])) != last[1]:
                    raise InputError(
                        "partial output does not match its state (the CRC-32 of its last chunk "
                        f"differs): changed since it was written{again}",
                        self.path,
                    )
            if "crc32" not in state:
                log.warning(
                    "%s: its resume state records no CRC-32 of the whole partial output (an "
                    "earlier phrasescore wrote it), so its %d lines cannot be checked: starting "
                    "again from the beginning",
                    self.path,
                    lines,
                )
                self.handle.close()
                return False
            self._check_prefix(size, lines, state["crc32"], again)
        except BaseException:
            self.handle.close()
            raise
        self.lines_done, self.bytes_done, self.last_chunk = lines, size, last
        self.crc = state["crc32"]
        self.input_crc = state.get("input_crc32", 0)
        self.input_crc_recorded = "input_crc32" in state
        totals = state.get("totals")
        self.totals = dict(totals) if isinstance(totals, dict) else None
        self.handle.truncate(size)
        self.handle.seek(size)
        return True

    def _check_prefix(self, size: int, lines: int, crc: int, again: str) -> None:
        """Read the first ``size`` bytes of the partial file: their CRC-32 must be ``crc`` and
        their lines (decompressed, gzip member after member, for a ``.gz`` output) ``lines``."""
        self.handle.seek(0)
        actual_crc, newlines, whole = 0, 0, True
        decomp = zlib.decompressobj(wbits=31) if self.compress else None
        remaining = size
        while remaining:
            block = self.handle.read(min(IO_BUFFER, remaining))
            if not block:
                break
            remaining -= len(block)
            actual_crc = zlib.crc32(block, actual_crc)
            if decomp is None:
                newlines += block.count(b"\n")
                continue
            while block and whole is not None:
                try:
                    newlines += decomp.decompress(block).count(b"\n")
                except zlib.error:
                    whole = None  # not gzip
                    break
                whole = decomp.eof
                if decomp.eof:  # a member ends: the next one starts with what is left
                    block = decomp.unused_data
                    decomp = zlib.decompressobj(wbits=31)
                else:
                    block = b""
        if actual_crc != crc or remaining:
            raise InputError(
                f"partial output does not match its state (the CRC-32 of its first {size} "
                f"bytes differs): damaged since it was written{again}",
                self.path,
            )
        if not whole:
            raise InputError(
                f"partial output is not whole gzip members in its first {size} bytes: damaged "
                f"since it was written{again}",
                self.path,
            )
        if newlines != lines:
            raise InputError(
                f"partial output has {newlines} lines, its state "
                f"{os.path.basename(self.state_path)} records {lines}: changed since it was "
                f"written{again}",
                self.path,
            )

    def check_input(self, input_crc: int, before_refusal=None, provable: bool = True) -> None:
        """Refuse to resume when the input lines read again (their CRC-32: ``input_crc``) are
        not those the partial output was made from: another table on standard input, or under
        the same name, size and modification time (``cp -p``). A state of an earlier version
        records no such CRC-32: a file's name, size and time must do, standard input
        (``provable`` False) is refused. The partial output is kept either way.
        ``before_refusal`` runs first (the progress bar's close)."""
        if self.input_crc_recorded and input_crc == self.input_crc:
            return
        if not self.input_crc_recorded and provable:
            self.input_crc, self.input_crc_recorded = input_crc, True
            return
        if before_refusal is not None:
            before_refusal()
        if not self.input_crc_recorded:
            raise InputError(
                "cannot resume from standard input: the partial output's state (of an earlier "
                "version) records no CRC-32 of its input lines to check them against; give the "
                "table as a file, or run without --resume to start again",
                self.output,
            )
        raise InputError(
            f"cannot resume: the first {self.lines_done} lines of the input are not those the "
            "partial output was made from (their CRC-32 differs); run without --resume to "
            "start again",
            self.output,
        )

    def append_chunk(
        self, data: bytes, n_lines: int, source: bytes = b"", totals: dict | None = None
    ) -> None:
        """Append a chunk's bytes (:func:`chunk_bytes`: one gzip member for a ``.gz`` output)
        made from the input lines ``source``; ``totals``: the job's running totals after it."""
        with self._writing():
            self.handle.write(data)
            self.handle.flush()
            os.fsync(self.handle.fileno())
        self.lines_done += n_lines
        self.bytes_done += len(data)
        self.last_chunk = [len(data), zlib.crc32(data)] if data else self.last_chunk
        self.crc = zlib.crc32(data, self.crc)
        self.input_crc = zlib.crc32(source, self.input_crc)
        if totals is not None:
            self.totals = dict(totals)
        with self._writing():
            self._write_state()

    def _write_state(self) -> None:
        with AtomicOutput(self.state_path, compress=False) as fh:
            json.dump(
                {
                    "identity": self.identity,
                    "lines": self.lines_done,
                    "bytes": self.bytes_done,
                    "last_chunk": self.last_chunk,
                    "crc32": self.crc,
                    "input_crc32": self.input_crc,
                    **({"totals": self.totals} if self.totals is not None else {}),
                },
                fh,
            )

    def complete(self) -> None:
        """Close the partial file, complete (still under its partial name, resumable)."""
        with self._writing():
            if self.compress and self.bytes_done == 0:
                self.handle.write(compress_member(b"", self.gzip_level))
            self.handle.close()

    def publish(self, before_rename: Callable[[str], None] | None = None) -> None:
        """Give the output its name (``before_rename(complete file)`` first: a shard's
        manifest): the partial file renamed, or its text written whole (:class:`TextPublish`)."""
        if self.text is None or not self.text.rewrites(self.output):
            if before_rename is not None:
                before_rename(self.path)
            os.replace(self.path, self.output)
        else:
            self.text.write(self.path, self.output, before_rename)
            os.unlink(self.path)
        os.unlink(self.state_path)

    def close_incomplete(self) -> None:
        """Leave the partial file and state for ``--resume`` (never under the final name)."""
        if self.handle is not None and not self.handle.closed:
            # bytes a full disk refused are past the state's count: --resume cuts them off
            with contextlib.suppress(OSError):
                self.handle.close()

    def discard(self) -> None:
        self.close_incomplete()
        for path in (self.path, self.state_path):
            if os.path.exists(path):
                os.unlink(path)


class TextPublish:
    """How a partial file of plain text becomes its output: as it is (renamed), or written
    whole through :class:`~phrasescore.files.AtomicOutput` a line at a time, the lines passed
    through ``final_lines`` (``nbest --one-best``: the best texts placed by sentence id) and
    compressed for a ``.gz`` output, one gzip stream (the bytes of :class:`~phrasescore.runners.streams.WholeOutput`)."""

    def __init__(self, final_lines: Callable[[Iterable[str]], Iterable[str]] | None = None):
        self.final_lines = final_lines

    def rewrites(self, output: str) -> bool:
        """Whether the partial file's bytes are not the output's as they are."""
        return self.final_lines is not None or output.endswith(".gz")

    def write(self, partial: str, output: str, before_rename) -> None:
        with open(partial, encoding="utf-8", newline="\n") as fh:  # only "\n" ends a line
            lines = self.final_lines(fh) if self.final_lines is not None else fh
            with AtomicOutput(output, before_rename=before_rename) as out:
                out.writelines(lines)


_IDENTITY_PARTS = {
    "input": "the input file (its path, size or modification time)",
    "source": "--source",
    "models": "the models (their signatures)",
    "inverse": "the models' directions (-m, --inverse-model)",
    "lms": "--lm",
    "features": "the features added (-m, --inverse-model, --lm, --name, --lm-name)",
    "shard": "--shard",
    "gzip": "the gzip library",
    "version": "the resume state's version",
}


def identity_difference(recorded, current: dict) -> str:
    """What differs first between a partial output's resume key and this run's, in words: a
    flag's name for one of the run's options (``options.chunk_lines`` -> ``--chunk-lines``)."""
    recorded = recorded if isinstance(recorded, dict) else {}
    for key in [*current, *(k for k in recorded if k not in current)]:
        mine, theirs = current.get(key), recorded.get(key)
        if mine == theirs:
            continue
        if key == "options" and isinstance(mine, dict) and isinstance(theirs, dict):
            for name in [*mine, *(k for k in theirs if k not in mine)]:
                if mine.get(name) != theirs.get(name):
                    return "--" + name.replace("_", "-")
        return _IDENTITY_PARTS.get(key, key)
    return "nothing"


def _valid_state(state: dict) -> bool:
    """Whether a resume state's numbers are whole and consistent: lines and bytes >= 0, none
    of either without the other, and the last chunk's [size, CRC-32] within the bytes."""
    lines, size, last = state.get("lines"), state.get("bytes"), state.get("last_chunk", False)

    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not (count(lines) and count(size)) or (lines == 0) != (size == 0):
        return False
    if "crc32" in state and not (count(state["crc32"]) and state["crc32"] < 1 << 32):
        return False
    if last is None:
        return size == 0
    return (
        isinstance(last, list)
        and len(last) == 2
        and all(count(v) for v in last)
        and 0 < last[0] <= size
    )


def file_identity(path: str) -> dict:
    """An input of a partial output (part of its resume key): path, size and mtime."""
    if path == "-":
        return {"path": "-"}
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
