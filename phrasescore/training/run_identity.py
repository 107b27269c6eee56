"""A training run's identity: what the run is made of, recorded in its checkpoint (under the key
``recipe``, as every checkpoint since the first has it) so that ``--resume`` continues only the
same run, never a run of other data or flags.

The identity is JSON: the data files by role (``SOURCE``, ``TARGET``, ``--phrase-table``,
``--valid SRC``, ``CORPUS``...) with their content's size and SHA-256
(:func:`phrasescore.files.content_digest`: a copy or a renamed file is the same data, an edited
or swapped one is not), the flags that shape the run (languages, text settings, ``--inverse``,
``--preset``, ``--arch``, model flags, learning rate and its schedule, vocabulary sizes, batch
size, ``--seed``...) and every other setting of the model and training configurations (the
preset's). The budgets (``--epochs``, ``--max-steps``, ``--max-minutes``, ``--patience``) are
left out: a resume may change them. :func:`identity_difference` names the first difference in one
line: ``--resume: en-fr.safetensors.checkpoint was trained with --seed 1, this run has --seed 2``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from phrasescore.files.inputs import content_digest

log = logging.getLogger(__name__)

BUDGETS = ("epochs", "max_steps", "max_minutes", "patience", "compile", "chunked_output", "graphs")
"""TrainConfig fields a resumed run may change: the budgets, ``--compile``, ``--chunked-output``
and ``--graphs`` (the same equations; values differ by float rounding only)."""

TRAIN_FLAGS = {
    "optimizer": "--optimizer",
    "learning_rate": "--lr",
    "lr_plateau_factor": "--lr-plateau-factor",
    "lr_halve_after_epochs": "--lr-halve-after",
    "lr_halve_every_epochs": "--lr-halve-every",
    "batch_tokens": "--batch-tokens",
    "max_length": "--max-length",
    "vocab_size": "--vocab-size",
    "subwords": "--subwords",
    "valid_every": "--valid-every",
    "seed": "--seed",
    "bucket": "--bucket",
}
"""TrainConfig fields set by a flag of ``train``/``train-lm``, and the flag."""

MODEL_FLAGS = {
    "arch": "--arch",
    "layers": "--layers",
    "reverse_source": "--no-reverse",  # the flag says the opposite of the field
    "reverse_target": "--reverse-target",
    "self_normalize": "--self-normalize",
    "dropout": "--dropout",
    "init": "--init",
    "recurrence": "--recurrence",
    "order": "--order",
}
"""ModelConfig (and LMConfig) fields set by a flag, and the flag."""

SIZE_FLAGS = {
    "embedding_dim": "--embedding-dim",
    "hidden_dim": "--hidden-dim",
    "maxout_units": "--maxout-units",
    "output_rank": "--output-rank",
}
"""ModelConfig sizes that a flag of ``train`` may set in place of the preset's. They stay
settings of the identity (a checkpoint records the preset's sizes as settings, not as flags), but
a difference names the flag."""

FLAG_DEFAULTS = {"--recurrence": "written", "--bucket": 0}
"""Flags newer than some checkpoints, and the value a run without them was trained with."""

DERIVED = ("src_vocab_size", "tgt_vocab_size", "vocab_size")
"""ModelConfig fields the data decides (the vocabularies' sizes), not the identity."""


def make_run_identity(
    files: list[tuple[str, str | None]],
    data_flags: dict[str, Any],
    preset: str,
    model_config: dict[str, Any],
    train_config: dict[str, Any],
) -> dict[str, Any]:
    """The identity of a run: ``files`` are (role, path) pairs (None: not given), ``data_flags``
    the flags of the data (``--src-lang`` ...), the configurations as ``to_dict`` gives them."""
    flags: dict[str, Any] = dict(data_flags)
    flags["--preset"] = preset
    settings: dict[str, Any] = {}
    for field, value in model_config.items():
        if field in MODEL_FLAGS:
            flag = MODEL_FLAGS[field]
            flags[flag] = (not value) if field == "reverse_source" else value
        elif field not in DERIVED:
            settings[f"model {field}"] = value
    for field, value in train_config.items():
        if field in BUDGETS or field == "extra":
            continue
        if field in TRAIN_FLAGS:
            flags[TRAIN_FLAGS[field]] = value
        else:
            settings[f"training {field}"] = value
    identity = {
        "files": {
            role: {"name": str(path), **content_digest(str(path))} for role, path in files if path
        },
        "flags": flags,
        "settings": settings,
    }
    return json.loads(json.dumps(identity))  # as the checkpoint gives it back (lists, not tuples)


def _flag_text(flag: str, value: Any) -> str:
    if value is True:
        return flag
    if value is False or value is None:
        return f"no {flag}"
    if isinstance(value, float):
        return f"{flag} {value:g}"
    return f"{flag} {value}"


def _file_text(role: str, entry: dict[str, Any]) -> str:
    return f"{role} {entry['name']} ({entry['bytes']:,} bytes, sha256 {entry['sha256'][:12]})"


def _roles_text(files: dict[str, Any]) -> str:
    return " and ".join(f"{role} {entry['name']}" for role, entry in files.items()) or "nothing"


def identity_difference(saved: dict[str, Any], current: dict[str, Any], name: str) -> str | None:
    """One line naming the first way ``current`` differs from the ``saved`` identity of the
    checkpoint ``name``, or None when they are the same run. Files read from pipes cannot be
    compared: a warning says so."""
    head = f"--resume: {name} was trained"
    old_files, new_files = saved.get("files", {}), current.get("files", {})
    if list(old_files) != list(new_files):
        return f"{head} on {_roles_text(old_files)}, this run on {_roles_text(new_files)}"
    for role, old in old_files.items():
        new = new_files[role]
        if new.get("pipe"):
            log.warning(
                "%s %s is a pipe: cannot check that it is the data resumed", role, new["name"]
            )
            continue
        if old.get("pipe"):  # the file is not a pipe: the checkpoint's run read one
            log.warning(
                "%s: the checkpoint's run read %s, a pipe: cannot check that %s is the data "
                "resumed",
                role,
                old["name"],
                new["name"],
            )
            continue
        if (old["bytes"], old["sha256"]) != (new["bytes"], new["sha256"]):
            return f"{head} on {_file_text(role, old)}, this run's is other data: {_file_text(role, new)}"
    old_flags, new_flags = saved.get("flags", {}), current.get("flags", {})
    for flag in list(old_flags) + [f for f in new_flags if f not in old_flags]:
        old = old_flags.get(flag, FLAG_DEFAULTS.get(flag))
        new = new_flags.get(flag, FLAG_DEFAULTS.get(flag))
        if old != new:
            return f"{head} with {_flag_text(flag, old)}, this run has {_flag_text(flag, new)}"
    old_settings, new_settings = saved.get("settings", {}), current.get("settings", {})
    for key in list(old_settings) + [k for k in new_settings if k not in old_settings]:
        old, new = old_settings.get(key), new_settings.get(key)
        if old != new:
            flag = SIZE_FLAGS.get(key.removeprefix("model "))
            if flag and old is not None and new is not None:
                return f"{head} with {flag} {old}, this run has {flag} {new}"
            return (
                f"{head} with {key} {old}, this run has {key} {new} (another preset or "
                "phrasescore version)"
            )
    return None
