"""Jobs the CLI starts: each wires the format, text, model and engine layers for one command."""

from __future__ import annotations

import logging
import os

import torch

from phrasescore.errors import InputError
from phrasescore.model.config import ARCH_PRESETS, ARCHITECTURES
from phrasescore.model.config import preset as preset_configs
from phrasescore.scoring import resolve_device

log = logging.getLogger(__name__)


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


def run_training(
    model_path: str,
    source: str | None,
    target: str | None,
    phrase_table: str | None,
    valid,
    preset: str,
    src_lang: str,
    tgt_lang: str,
    tokenize: bool,
    lowercase: bool,
    device: str,
    amp: bool | None,
    threads: int | None,
    resume: bool,
    overrides: dict,
    arch: str = "cho",
    model_overrides: dict | None = None,
):
    """``phrasescore train``: check the arguments, configure, run :class:`Trainer`.

    ``arch`` picks the architecture and its presets; ``overrides`` set
    :class:`~phrasescore.model.config.TrainConfig` fields and ``model_overrides``
    :class:`~phrasescore.model.config.ModelConfig` fields (``layers``, ``reverse_source``), None
    meaning the preset's. On ``resume`` both come from the checkpoint instead.
    """
    from phrasescore.train import Trainer, TrainingData

    if phrase_table and (source or target):
        raise InputError("give either SOURCE TARGET or --phrase-table, not both")
    if not phrase_table and not (source and target):
        raise InputError("give SOURCE TARGET files, or --phrase-table TABLE")
    if arch not in ARCHITECTURES:
        raise InputError(f"unknown architecture {arch!r} (one of {', '.join(ARCHITECTURES)})")
    if preset not in ARCH_PRESETS[arch]:
        raise InputError(f"unknown preset {preset!r}")
    for path in [p for p in (source, target, phrase_table) if p] + list(valid or []):
        if path != "-" and not os.path.isfile(path):
            raise InputError("no such file", path)
    set_threads(threads)
    dev = resolve_device(device)
    mcfg, tcfg = preset_configs(preset, arch)
    for key, value in overrides.items():
        if value is not None:
            setattr(tcfg, key, value)
    for key, value in (model_overrides or {}).items():
        if value is not None:
            if arch != "lstm" and key in ("layers", "reverse_source"):
                flag = "--layers" if key == "layers" else "--no-reverse"
                raise InputError(f"{flag} is an option of --arch lstm, not of --arch {arch}")
            setattr(mcfg, key, value)
    if mcfg.layers < 1:
        raise InputError(f"--layers must be at least 1, got {mcfg.layers}")
    if overrides.get("optimizer") == "sgd" and overrides.get("learning_rate") is None:
        tcfg.learning_rate = 0.7
    if overrides.get("optimizer") == "adadelta" and overrides.get("learning_rate") is None:
        tcfg.learning_rate = 1.0
    if overrides.get("optimizer") == "adam" and overrides.get("learning_rate") is None:
        tcfg.learning_rate = 1e-3
    data = TrainingData(
        src_path=source,
        tgt_path=target,
        phrase_table=phrase_table,
        valid_src=valid[0] if valid else None,
        valid_tgt=valid[1] if valid else None,
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        tokenize=tokenize,
        lowercase=lowercase,
    )
    use_amp = dev.type == "cuda" if amp is None else amp
    trainer = Trainer(model_path, data, mcfg, tcfg, dev, preset=preset, amp=use_amp)
    return trainer.run(resume=resume)
