"""Reading and writing files the way Moses pipelines use them, one module per job:

* :mod:`~phrasescore.files.kinds`: what a path names (``-``, a pipe read once, a stream target);
* :mod:`~phrasescore.files.reading`: inputs opened (plain or gzip by their magic bytes, ``-`` is
  standard input) and read as lines or blocks of lines, every problem one line naming file and
  line;
* :mod:`~phrasescore.files.inputs`: inputs checked before any work, and their content's digest;
* :mod:`~phrasescore.files.outputs`: atomic, staged and streamed outputs, gzip with a fixed
  header, output locations checked before any work;
* :mod:`~phrasescore.files.locks`: one writer per output, the temporaries of killed runs removed;
* :mod:`~phrasescore.files.guards`: no output, file beside one, or work folder onto an input;
* :mod:`~phrasescore.files.disk`: a disk's write errors as one line.

The names below are those modules' own, gathered so that ``from phrasescore.files import X``
reads the same whichever module X lives in.
"""

from phrasescore.files.disk import DISK_ERRORS, disk_errors, disk_full_error, write_error
from phrasescore.files.guards import (
    LOCKED_OUTPUT,
    PathsByRole,
    check_work_folder,
    refuse_outputs_onto_inputs,
    with_locks,
)
from phrasescore.files.inputs import (
    DIGEST_WHOLE,
    check_files_exist,
    check_input_file,
    content_digest,
)
from phrasescore.files.kinds import IO_BUFFER, display_name, is_pipe, is_stream_target
from phrasescore.files.locks import lock_path, output_lock, remove_stale_temporaries
from phrasescore.files.outputs import (
    GZIP_LEVEL,
    AtomicOutput,
    StagedFile,
    WholeWrites,
    atomic_path,
    check_output_dir,
    check_output_path,
    check_output_paths,
    default_file_mode,
    gzip_writer,
)
from phrasescore.files.reading import (
    GZIP_MAGIC,
    OTHER_COMPRESSIONS,
    LineBlocks,
    ReadPosition,
    count_lines,
    decode_lines,
    decode_text,
    iter_lines,
    iter_raw_lines,
    open_binary_input,
)

__all__ = [
    "DIGEST_WHOLE",
    "DISK_ERRORS",
    "GZIP_LEVEL",
    "GZIP_MAGIC",
    "IO_BUFFER",
    "LOCKED_OUTPUT",
    "OTHER_COMPRESSIONS",
    "AtomicOutput",
    "LineBlocks",
    "PathsByRole",
    "ReadPosition",
    "StagedFile",
    "WholeWrites",
    "atomic_path",
    "check_files_exist",
    "check_input_file",
    "check_output_dir",
    "check_output_path",
    "check_output_paths",
    "check_work_folder",
    "content_digest",
    "count_lines",
    "decode_lines",
    "decode_text",
    "default_file_mode",
    "disk_errors",
    "disk_full_error",
    "display_name",
    "gzip_writer",
    "is_pipe",
    "is_stream_target",
    "iter_lines",
    "iter_raw_lines",
    "lock_path",
    "open_binary_input",
    "output_lock",
    "refuse_outputs_onto_inputs",
    "remove_stale_temporaries",
    "with_locks",
    "write_error",
]
