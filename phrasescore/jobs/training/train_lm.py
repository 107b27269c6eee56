"""Training the CSLM target language model (Schwenk 2007): ``phrasescore train-lm``.

The job checks the arguments and configures the run; the loop is
:class:`~phrasescore.training.lm_trainer.LMTrainer`, the encoder-decoder's trainer with the
CSLM's data, network and model file (its module says what differs).
"""

from __future__ import annotations

from phrasescore.errors import InputError
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.inputs import check_files_exist
from phrasescore.files.kinds import is_pipe
from phrasescore.files.outputs import check_output_path
from phrasescore.hardware import set_threads
from phrasescore.model.config import LM_PRESETS
from phrasescore.model.cslm import lm_preset
from phrasescore.runners import distributed
from phrasescore.training.lm_trainer import LMData, LMTrainer
from phrasescore.training.trainer import (
    TrainResult,
    apply_overrides,
    train_to_end,
    training_lock,
    training_outputs,
)


def run_lm_training(
    model_path: str,
    corpus: str,
    valid: str | None = None,
    preset: str = "default",
    order: int | None = None,
    lang: str = "fr",
    tokenize: bool = False,
    lowercase: bool = False,
    device: str = "auto",
    amp: bool | None = None,
    threads: int | None = None,
    resume: bool = False,
    progress: bool = True,
    overrides: dict | None = None,
) -> TrainResult:
    """``phrasescore train-lm``: check the arguments, configure, run
    :class:`~phrasescore.training.lm_trainer.LMTrainer`.

    ``overrides`` sets :class:`~phrasescore.model.config.TrainConfig` fields (None: the preset's).
    """
    if preset not in LM_PRESETS:
        raise InputError(f"unknown preset {preset!r} (one of {', '.join(LM_PRESETS)})")
    for path in [corpus] + ([valid] if valid else []):
        check_files_exist([path])
        if is_pipe(path):
            raise InputError(
                "train-lm reads its files twice: give a file, not a pipe or standard input", path
            )
    refuse_outputs_onto_inputs({"corpus": corpus, "--valid": valid}, training_outputs(model_path))
    # and its .checkpoint, .log beside it: files, never a pipe or a device
    check_output_path(model_path, "LM", stream=False)
    with training_lock(model_path):
        set_threads(threads)
        launch, dev = distributed.start_job(device)
        mcfg, tcfg = lm_preset(preset)
        if order is not None:
            if order < 2:
                raise InputError(f"--order must be at least 2, got {order}")
            mcfg.order = order
        apply_overrides(tcfg, overrides)
        data = LMData(
            tgt_path=corpus, valid_tgt=valid, tgt_lang=lang, tokenize=tokenize, lowercase=lowercase
        )
        return train_to_end(
            LMTrainer,
            model_path,
            data,
            mcfg,
            tcfg,
            dev,
            preset=preset,
            amp=amp,
            progress=progress,
            launch=launch,
            resume=resume,
        )
