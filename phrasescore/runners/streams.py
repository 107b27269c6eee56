"""The outputs of a chunked job that ``--resume`` cannot go on with: standard output, a named
pipe or a device, written as a stream of chunks (:class:`StdoutOutput`: rescore's gzip members)
or as one text stream (:class:`WholeOutput`: nbest's, one gzip stream, ``--one-best`` placed at
the end). Both take chunks as :class:`~.partial.PartialOutput` does.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator

from phrasescore.compression import TABLE_LEVEL, compress_member
from phrasescore.errors import InputError
from phrasescore.files import AtomicOutput, WholeWrites, disk_errors


class StdoutOutput:
    """Standard output (``-``) or a named pipe or device (``output``:
    :func:`~phrasescore.files.is_stream_target`) as a sink of chunks, written as a stream:
    nothing to resume, publish or discard. Standard output is written as it is, never gzip; a
    pipe or device as its name says (a ``.gz`` name: gzip members)."""

    resumable = False
    totals = None  # nothing resumed

    def __init__(self, output: str = "-", gzip_level: int = TABLE_LEVEL):
        self.output = output
        self.compress = output != "-" and output.endswith(".gz")
        self.gzip_level = gzip_level if self.compress else None
        self.stream = WholeWrites(sys.stdout.buffer, owned=False) if output == "-" else None
        self.written = False

    def open(self, resume: bool) -> int:
        _refuse_resume(self.output, resume)
        if self.stream is None:
            try:  # appending: /dev/stdout of a shell's >> keeps what the file held
                self.stream = WholeWrites(open(self.output, "ab"))
            except OSError as exc:
                raise InputError(f"cannot write ({exc.strerror})", self.output) from None
        return 0

    def check_input(self, input_crc: int, before_refusal=None, provable: bool = True) -> None:
        pass  # nothing resumed

    def append_chunk(
        self, data: bytes, n_lines: int, source: bytes = b"", totals: dict | None = None
    ) -> None:
        with disk_errors(self.output):
            self.stream.write(data)
            self.stream.flush()
        self.written = self.written or bool(data)

    def complete(self) -> None:
        with disk_errors(self.output):
            if self.compress and not self.written:  # an empty table: an empty gzip stream
                self.stream.write(compress_member(b"", self.gzip_level))
            self.stream.flush()
            if self.output != "-":
                self.stream.close()

    def publish(self, before_rename: Callable[[str], None] | None = None) -> None:
        pass

    def close_incomplete(self) -> None:
        if self.output != "-" and self.stream is not None and not self.stream.closed:
            with contextlib.suppress(OSError):
                self.stream.close()

    def discard(self) -> None:
        self.close_incomplete()


class WholeOutput:
    """Standard output (``-``), a named pipe or a device written as one text stream, as
    :class:`~phrasescore.files.AtomicOutput` writes one (``.gz``: one gzip stream), as a sink of
    chunks: nothing to resume, publish or rename.

    Each chunk's UTF-8 text is written a line at a time: the writes a gzip stream receives
    (after the text layer's buffer) decide its bytes, and these are those of a list written
    line by line, which ``merge-shards`` writes too."""

    resumable = False
    totals = None  # nothing resumed

    def __init__(
        self, output: str, final_lines: Callable[[Iterable[str]], Iterable[str]] | None = None
    ):
        self.output = output
        self.final_lines = final_lines
        """The lines written at the end from all the chunks' (``--one-best``), else None: each
        chunk's written as it comes."""
        self._kept: list[bytes] = []
        self._atomic: AtomicOutput | None = None
        self._out = None

    def open(self, resume: bool) -> int:
        _refuse_resume(self.output, resume)
        self._atomic = AtomicOutput(self.output)
        self._out = self._atomic.__enter__()
        return 0

    def check_input(self, input_crc: int, before_refusal=None, provable: bool = True) -> None:
        pass  # nothing resumed

    def append_chunk(
        self, data: bytes, n_lines: int, source: bytes = b"", totals: dict | None = None
    ) -> None:
        if self.final_lines is not None:  # written at the end, passed through final_lines
            self._kept.append(data)
            return
        with disk_errors(self.output):
            self._out.writelines(text_lines(data.decode("utf-8")))

    def complete(self) -> None:
        if self.final_lines is not None:
            text = b"".join(self._kept).decode("utf-8")
            with disk_errors(self.output):
                self._out.writelines(self.final_lines(text_lines(text)))

    def publish(self, before_rename: Callable[[str], None] | None = None) -> None:
        atomic, self._atomic = self._atomic, None
        atomic.__exit__(None, None, None)

    def close_incomplete(self) -> None:
        """Remove what was written (called while the error that stopped the run is handled)."""
        atomic, self._atomic = self._atomic, None
        if atomic is not None:
            atomic.__exit__(*sys.exc_info())

    def discard(self) -> None:
        self.close_incomplete()


def _refuse_resume(output: str, resume: bool) -> None:
    if resume:
        where = "standard output" if output == "-" else "a named pipe or a device"
        raise InputError(f"--resume needs an output file, not {where}")


def text_lines(text: str) -> Iterator[str]:
    """The lines of ``text``, each with its ``\\n`` (only ``\\n`` ends a line)."""
    start = 0
    while True:
        end = text.find("\n", start) + 1
        if not end:
            break
        yield text[start:end]
        start = end
    if start < len(text):
        yield text[start:]
