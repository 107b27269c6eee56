"""The bin/ scripts' own-file check: before any work, every file a script writes (and, for a
model that ``train`` writes, the files it writes beside it) is compared with every input, and
every work folder is checked to hold no input, by the same functions as every command's ``-o``
(:func:`~phrasescore.files.refuse_outputs_onto_inputs`,
:func:`~phrasescore.files.check_work_folder`). ``phrasescore check-outputs`` calls it."""

from __future__ import annotations

from phrasescore.files.guards import check_work_folder, refuse_outputs_onto_inputs, with_locks
from phrasescore.files.locks import lock_path
from phrasescore.training.trainer import training_outputs


def check_script_outputs(
    inputs: list[tuple[str, str]],
    outputs: list[tuple[str, str]],
    models: list[tuple[str, str]],
    workdirs: list[tuple[str, str]],
) -> None:
    """Raise :class:`~phrasescore.errors.InputError` (one line) when a written file is an
    input or a work folder holds one. Each entry is ``(ROLE, PATH)``: ``outputs`` are files a
    script writes (with the lock a phrasescore command takes beside them), ``models`` models a
    training writes (with its best model, checkpoint, log, curve and lock)."""
    read: dict[str, list[str]] = {}
    for role, path in inputs:
        read.setdefault(role, []).append(path)
    written: dict[str, list[str]] = {}
    for role, path in outputs:
        written.setdefault(role, []).append(path)
        written.setdefault(f"{role}'s lock", []).append(lock_path(path))
    for role, path in models:
        for what, beside in with_locks(training_outputs(path)).items():
            written.setdefault(what.replace("-o", role, 1), []).append(beside)
    refuse_outputs_onto_inputs(read, written)
    for role, folder in workdirs:
        check_work_folder(folder, read, role)
