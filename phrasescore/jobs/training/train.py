"""``phrasescore train``: check the arguments, configure the model and run the training loop
(:class:`phrasescore.training.trainer.Trainer`, which documents the files written beside the model).
"""

from __future__ import annotations

import logging
import math

from phrasescore.errors import InputError
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.inputs import check_files_exist
from phrasescore.files.kinds import is_pipe
from phrasescore.files.outputs import check_output_path
from phrasescore.hardware import set_threads
from phrasescore.model.config import (
    ARCH_PRESETS,
    ARCHITECTURES,
    DEFAULT_LEARNING_RATE,
    FUSED_ARCHITECTURES,
)
from phrasescore.model.config import preset as preset_configs
from phrasescore.runners import distributed
from phrasescore.training.trainer import (
    Trainer,
    TrainingData,
    TrainResult,
    apply_overrides,
    train_to_end,
    training_lock,
    training_outputs,
)

log = logging.getLogger(__name__)


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
    inverse: bool = False,
    progress: bool = True,
) -> TrainResult:
    """``phrasescore train``: check the arguments, configure, run :class:`Trainer`.

    ``arch`` picks the architecture and its presets; ``overrides`` set
    :class:`~phrasescore.model.config.TrainConfig` fields and ``model_overrides``
    :class:`~phrasescore.model.config.ModelConfig` fields (``layers``, ``reverse_source``,
    ``self_normalize``, ``recurrence``...), None
    meaning the preset's. On ``resume`` both come from the checkpoint instead.
    """
    _check_arguments(model_path, source, target, phrase_table, valid, preset, arch, inverse)
    with training_lock(model_path):
        set_threads(threads)
        launch, dev = distributed.start_job(device)
        mcfg, tcfg = _configure(
            preset, arch, overrides, model_overrides, resume, bool(phrase_table)
        )
        _check_graphs(tcfg, mcfg, dev, launch)
        data = TrainingData(
            src_path=source,
            tgt_path=target,
            phrase_table=phrase_table,
            inverse=inverse,
            valid_src=valid[0] if valid else None,
            valid_tgt=valid[1] if valid else None,
            src_lang=src_lang,
            tgt_lang=tgt_lang,
            tokenize=tokenize,
            lowercase=lowercase,
        )
        return train_to_end(
            Trainer,
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


def _check_arguments(
    model_path: str, source, target, phrase_table, valid, preset: str, arch: str, inverse: bool
) -> None:
    """Everything about the inputs, output and flags that can be refused before training."""
    if phrase_table and (source or target):
        raise InputError("give either SOURCE TARGET or --phrase-table, not both")
    if not phrase_table and not (source and target):
        raise InputError("give SOURCE TARGET files, or --phrase-table TABLE")
    if inverse and not phrase_table:
        raise InputError(
            "--inverse reverses the pairs of --phrase-table; for parallel files give them in "
            "the other order (TARGET SOURCE)"
        )
    if arch not in ARCHITECTURES:
        raise InputError(f"unknown architecture {arch!r} (one of {', '.join(ARCHITECTURES)})")
    if preset not in ARCH_PRESETS[arch]:
        presets = ", ".join(ARCH_PRESETS[arch])
        raise InputError(f"--arch {arch} has no preset {preset!r} (its presets: {presets})")
    check_files_exist([source, target, phrase_table, *(valid or [])])
    if distributed.from_env() is not None:
        for path in (source, target, phrase_table):
            if path and is_pipe(path):
                raise InputError(
                    "under torchrun every rank reads the corpus: give a file, not a pipe or "
                    "standard input",
                    path,
                )
    refuse_outputs_onto_inputs(
        {
            "source corpus": source,
            "target corpus": target,
            "--phrase-table": phrase_table,
            "validation source": valid[0] if valid else None,
            "validation target": valid[1] if valid else None,
        },
        training_outputs(model_path),
    )
    # and its .checkpoint, .log, .curve.png beside it: files, never a pipe or a device
    check_output_path(model_path, "model", stream=False)


def _check_recurrence(recurrence: str, preset: str, arch: str) -> None:
    """``--recurrence fused`` (the GRUs as cuDNN formulates them) exists for the GRU encoders of cho and attention, and
    not in the paper presets, which keep the papers' equations exactly (Cho et al. eq. 8: the
    reset gate before the recurrent product; cuDNN's acts after it: model/gru.py)."""
    if recurrence != "fused":
        return
    if arch not in FUSED_ARCHITECTURES:
        raise InputError(
            f"--recurrence fused is an option of --arch {' and '.join(FUSED_ARCHITECTURES)}: "
            + (
                "--arch lstm's recurrences are torch.nn.LSTM already"
                if arch == "lstm"
                else f"--arch {arch} has no recurrence"
            )
        )
    if preset == "paper":
        raise InputError(
            "--recurrence fused is refused with --preset paper: the paper presets keep Cho et "
            "al.'s GRU (eq. 8, the reset gate before the recurrent product; cuDNN's acts after it)"
        )


def _check_graphs(tcfg, mcfg, dev, launch) -> None:
    """``--graphs`` captures CUDA graphs of batch shapes that repeat: on CUDA, with ``--bucket``,
    in one process, not with ``--compile`` (two ways of cutting the same launches), and of the
    written recurrences: cuDNN's packed sequences (``--recurrence fused``, the LSTM) need their
    lengths on the host, which a graph cannot read."""
    if not tcfg.graphs:
        return
    if mcfg.arch == "lstm" or mcfg.recurrence == "fused":
        what = "--arch lstm" if mcfg.arch == "lstm" else "--recurrence fused"
        raise InputError(
            f"--graphs captures the written recurrences: {what} packs its rows for cuDNN, "
            "which reads their lengths on the host (train it without --graphs)"
        )
    if dev.type != "cuda":
        raise InputError(f"--graphs captures CUDA graphs: it needs --device cuda, not {dev.type}")
    if not tcfg.bucket:
        raise InputError(
            "--graphs needs --bucket N: batches padded to shapes that repeat, each captured once "
            "(e.g. --bucket 8)"
        )
    if launch is not None:
        raise InputError("--graphs is for one process: train without torchrun, or without --graphs")
    if tcfg.compile:
        raise InputError("--graphs and --compile: give one of them")


MODEL_OPTIONS_OF = {
    "layers": ("--layers", ("lstm", "transformer")),
    "reverse_source": ("--no-reverse", ("lstm",)),
    "heads": ("--heads", ("transformer",)),
    "feedforward_dim": ("--feedforward-dim", ("transformer",)),
    "maxout_units": ("--maxout-units", ("cho", "attention")),
    "embedding_dim": ("--embedding-dim", ("cho", "lstm", "attention")),
    "init": ("--init", ("cho", "lstm", "attention")),
}
"""The model options that some architectures have and others not: option -> (its flag, the
architectures that read it). The Transformer's embeddings are ``--hidden-dim`` wide and it
starts from its own initialisation (model/transformer.py); the LSTM has no maxout layer."""


def _check_model_option(arch: str, key: str) -> None:
    """Refuse a model option that ``arch`` does not read (:data:`MODEL_OPTIONS_OF`)."""
    if key not in MODEL_OPTIONS_OF:
        return
    flag, archs = MODEL_OPTIONS_OF[key]
    if arch not in archs:
        raise InputError(
            f"{flag} is an option of --arch {' and '.join(archs)}, not of --arch {arch}"
        )


def _check_output_rank(mcfg, rank_given: bool) -> None:
    """The output layer's rank R factors W = G_r G_l through the vector it reads (the LSTM's top
    state, the maxout units): an R above that vector's size adds parameters and no capacity."""
    projected, flag = (
        (mcfg.hidden_dim, "--hidden-dim")
        if mcfg.arch in ("lstm", "transformer")
        else (mcfg.maxout_units, "--maxout-units")
    )
    if mcfg.output_rank > projected:
        rank = "--output-rank" if rank_given else "the preset's output rank"
        raise InputError(
            f"{rank} {mcfg.output_rank} is larger than the {projected} units the output "
            f"layer reads ({flag}): give --output-rank {projected} or less"
        )


def _configure(
    preset: str, arch: str, overrides: dict, model_overrides, resume, phrase_pairs: bool = False
):
    """(ModelConfig, TrainConfig): the preset's (of phrase pairs: ``--phrase-table``), with the
    overrides."""
    mcfg, tcfg = preset_configs(preset, arch, phrase_pairs)
    preset_optimizer = tcfg.optimizer
    apply_overrides(tcfg, overrides)
    given = {key: value for key, value in (model_overrides or {}).items() if value is not None}
    for key, value in given.items():
        _check_model_option(arch, key)
        setattr(mcfg, key, value)
    if mcfg.layers < 1:
        raise InputError(f"--layers must be at least 1, got {mcfg.layers}")
    if arch == "transformer":
        mcfg.embedding_dim = mcfg.hidden_dim  # the embeddings are the layers' width (§3.4)
        if mcfg.hidden_dim % mcfg.heads:
            raise InputError(
                f"--heads {mcfg.heads} does not divide --hidden-dim {mcfg.hidden_dim}: each "
                "head has hidden-dim / heads units"
            )
    _check_output_rank(mcfg, "output_rank" in given)
    _check_recurrence(mcfg.recurrence, preset, arch)
    if not (mcfg.self_normalize >= 0 and math.isfinite(mcfg.self_normalize)):
        raise InputError(f"--self-normalize must be a finite 0 or more, got {mcfg.self_normalize}")
    if mcfg.self_normalize and not resume:
        log.info(
            "self-normalised output layer: objective NLL + %g (log Z)² per target token "
            "(Devlin et al. 2014)",
            mcfg.self_normalize,
        )
    if (  # another optimiser than the preset's, without --lr: that optimiser's own default
        tcfg.optimizer != preset_optimizer
        and tcfg.optimizer in DEFAULT_LEARNING_RATE
        and overrides.get("learning_rate") is None
    ):
        tcfg.learning_rate = DEFAULT_LEARNING_RATE[tcfg.optimizer]
    return mcfg, tcfg
