"""No output onto an input: every file a command writes, renames or removes (beside an output, in
a work folder) compared with every file it reads, by identity (device and inode, links
resolved), before any work (:func:`refuse_outputs_onto_inputs`, :func:`check_work_folder`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Mapping

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
    onto ``--moses-ini`` and the like would destroy their input and exit 0.)
    """
    known = _regular_inputs(inputs)
    for option, output in _paths_by_role(with_locks(outputs)):
        resolved = os.path.realpath(output)
        same = _same_input(output, known)
        if same is not None:
            role, path = same
            raise InputError(
                f"{option} {output} is the {role} ({path}): refusing to overwrite an input"
            )
        for role, path, _, input_resolved in known:
            if _is_temporary_of(input_resolved, resolved):
                raise InputError(
                    f"the {role} {path} is named as a temporary file of {option} {output}, "
                    "which a run removes as left by a killed run: rename it"
                )


_Known = list[tuple[str, str, tuple[int, int], str]]
"""The regular inputs: (role, path, (device, inode), resolved path)."""


def _regular_inputs(inputs: PathsByRole) -> _Known:
    known = []
    for role, path in _paths_by_role(inputs):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            known.append((role, path, (st.st_dev, st.st_ino), os.path.realpath(path)))
    return known


def _same_input(path: str, known: _Known) -> tuple[str, str] | None:
    """(role, path) of the input that ``path`` is, links followed: the same device and inode
    (a symlink or a hard link of it) or the same resolved path (a file not made yet)."""
    resolved = os.path.realpath(path)
    try:
        st = os.stat(path)
        identity = (st.st_dev, st.st_ino)
    except OSError:
        identity = None
    for role, input_path, input_identity, input_resolved in known:
        if identity == input_identity or resolved == input_resolved:
            return role, input_path
    return None


def _is_temporary_of(path: str, output: str) -> bool:
    """Whether ``path`` (resolved) has the name of a temporary file beside ``output``
    (``.NAME.XXXXXXXX.tmp``, :func:`remove_stale_temporaries` removes them)."""
    directory, name = os.path.split(output)
    head, base = os.path.split(path)
    return head == directory and temporary_pattern(name).fullmatch(base) is not None


def check_work_folder(folder: str | None, inputs: PathsByRole, option: str = "--workdir") -> None:
    """Refuse, in one :class:`InputError` line before any work, a work (or plot) folder that
    cannot hold the files a command and the programs it runs make or remove there under their
    own names (``features.dat``, ``scores.dat``, ``weights.txt``, logs, ``NNNNNN.png``, a
    script's stale ``features.list``): an existing file that is not a folder
    (:func:`check_output_dir`), a folder that holds one of the ``inputs`` by path, and a folder
    with an entry that is an input once links are followed (:func:`refuse_outputs_onto_inputs`'
    rule: a symlink to it, a hard link of it, a symlinked folder that holds it). A work folder
    holds only files the command made: otherwise ``rerank-tune --workdir wd --reference
    wd/scores.dat``, or ``wd/scores.dat`` a link to the reference, would have the reference
    replaced by the extractor's statistics. A new folder, or one of an earlier run, passes."""
    if not folder:
        return
    check_output_dir(folder, option)
    if not os.path.isdir(folder):
        return
    root = os.path.realpath(folder)
    for role, path in _paths_by_role(inputs):
        if os.path.exists(path) and _is_under(os.path.realpath(path), root):
            _refuse_work_folder(option, folder, role, path)
    known = _regular_inputs(inputs)
    for directory, folders, names in os.walk(root):
        for name in names:
            same = _same_input(os.path.join(directory, name), known)
            if same is not None:
                _refuse_work_folder(option, folder, *same)
        for name in folders:  # os.walk does not enter a linked folder: look under its target
            linked = os.path.join(directory, name)
            if os.path.islink(linked):
                target = os.path.realpath(linked)
                for role, path, _, resolved in known:
                    if _is_under(resolved, target):
                        _refuse_work_folder(option, folder, role, path)


def _is_under(path: str, folder: str) -> bool:
    """Whether the resolved ``path`` is ``folder`` (resolved) or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


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
