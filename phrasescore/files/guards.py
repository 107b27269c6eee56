"""No output onto an input: every file a command writes, renames or removes (beside an output, in
a work folder) compared with every file it reads, by identity (device and inode, links
resolved), before any work (:func:`refuse_outputs_onto_inputs`, :func:`check_work_folder`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from contextlib import suppress

from phrasescore.errors import InputError
from phrasescore.files.kinds import is_stream_target
from phrasescore.files.locks import lock_path
from phrasescore.files.outputs import check_output_dir, temporary_pattern

PathsByRole = Mapping[str, "str | Iterable[str | None] | None"]
"""``{role: path}`` or ``{role: [paths]}`` (``-m`` given twice); None, ``""`` and ``-`` are
skipped."""


def _paths_by_role(named: PathsByRole) -> Iterator[tuple[str, str]]:
    for role, paths in named.items():
        for path in [paths] if isinstance(paths, str) or paths is None else paths:
            if path and path != "-":
                yield role, path


def refuse_outputs_onto_inputs(inputs: PathsByRole, outputs: PathsByRole) -> None:
    """Refuse, in one :class:`InputError` line naming both, an output that is one of the
    inputs: ``-o en-fr.txt is the input corpus (train.en): refusing to overwrite an input``.

    Every command calls this once with all the files it reads and all it writes (the files it
    writes, renames or deletes beside an output too: a training's best model, checkpoint and
    log, rescore's partial output; the lock of ``-o``, :func:`with_locks`) before any work. Files are compared by identity, not by name: device and inode after
    following links (a symlink to the input, a hard link of it, the input reached through a
    symlinked directory), and resolved paths too. Only regular inputs count: a pipe or a
    terminal (``/dev/stdin``) is read as a stream and cannot be written over; ``-`` is standard
    input or output; an input that does not exist is :func:`check_files_exist`'s to report.
    ``inputs`` and ``outputs`` map what a file is (``input corpus``, ``-o``) to its path or paths.
    (Without this check ``train -o`` onto its corpus, ``copy-table t -o t``, ``rescore --ini-out``
    onto ``--moses-ini`` and 20 more destroyed their input and exited 0.)
    """
    known = []
    outputs = with_locks(outputs)
    for role, path in _paths_by_role(inputs):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            known.append((role, path, (st.st_dev, st.st_ino), os.path.realpath(path)))
    for option, output in _paths_by_role(outputs):
        resolved = os.path.realpath(output)
        try:
            st = os.stat(output)
            identity = (st.st_dev, st.st_ino)
        except OSError:
            identity = None
        for role, path, input_identity, input_resolved in known:
            if identity == input_identity or resolved == input_resolved:
                raise InputError(
                    f"{option} {output} is the {role} ({path}): refusing to overwrite an input"
                )
            if _is_temporary_of(input_resolved, resolved):
                raise InputError(
                    f"the {role} {path} is named as a temporary file of {option} {output}, "
                    "which a run removes as left by a killed run: rename it"
                )


def _is_temporary_of(path: str, output: str) -> bool:
    """Whether ``path`` (resolved) has the name of a temporary file beside ``output``
    (``.NAME.XXXXXXXX.tmp``, :func:`remove_stale_temporaries` removes them)."""
    directory, name = os.path.split(output)
    head, base = os.path.split(path)
    return head == directory and temporary_pattern(name).fullmatch(base) is not None


def check_work_folder(folder: str | None, inputs: PathsByRole, option: str = "--workdir") -> None:
    """Refuse, in one :class:`InputError` line before any work, a work folder that cannot hold
    the files a command and the programs it runs make there under their own names
    (``features.dat``, ``scores.dat``, ``weights.txt``, logs, outputs): an existing file that is
    not a folder (:func:`check_output_dir`), and a folder that holds one of the ``inputs`` (as
    :func:`refuse_outputs_onto_inputs`: by path, through links, or a hard link of it among the
    folder's files). A work folder holds only files the command made: otherwise
    ``rerank-tune --workdir wd --reference wd/scores.dat`` would have the reference replaced by
    the extractor's statistics. A new folder, or one of an earlier run, passes."""
    if not folder:
        return
    check_output_dir(folder, option)
    if not os.path.isdir(folder):
        return
    root = os.path.realpath(folder)
    identities: dict[tuple[int, int], tuple[str, str]] = {}
    for role, path in _paths_by_role(inputs):
        try:
            st = os.stat(path)
        except OSError:
            continue
        resolved = os.path.realpath(path)
        if resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep):
            _refuse_work_folder(option, folder, role, path)
        if stat.S_ISREG(st.st_mode):
            identities[(st.st_dev, st.st_ino)] = (role, path)
    for directory, _, names in os.walk(root):  # a hard link of an input among its files
        for name in names:
            with suppress(OSError):
                st = os.lstat(os.path.join(directory, name))
                if (st.st_dev, st.st_ino) in identities:
                    _refuse_work_folder(option, folder, *identities[(st.st_dev, st.st_ino)])


def _refuse_work_folder(option: str, folder: str, role: str, path: str) -> None:
    raise InputError(
        f"{option} {folder} holds the {role} ({path}): the tools write their files there under "
        "their own names and would overwrite it; give a folder of its own"
    )


LOCKED_OUTPUT = "-o"
"""The role of the output a command locks (:func:`output_lock`): its ``.NAME.lock`` is made and
removed beside it, so :func:`refuse_outputs_onto_inputs` checks that file too."""


def with_locks(outputs: PathsByRole) -> dict[str, object]:
    """``outputs`` and the lock file (:func:`lock_path`) of the :data:`LOCKED_OUTPUT` among them
    (a file, not ``-`` or a stream), as ``-o's lock``: a command creates and deletes it, so an
    input of that name would be lost."""
    extended: dict[str, object] = dict(outputs)
    for role, path in _paths_by_role({LOCKED_OUTPUT: outputs.get(LOCKED_OUTPUT)}):
        if not is_stream_target(path):
            extended.setdefault(f"{role}'s lock", lock_path(path))
    return extended
