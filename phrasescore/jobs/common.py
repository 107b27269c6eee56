"""What the jobs share: the model a job was handed or loads from its file.

Each command has its own job module in this package (``train``, ``train_lm``, ``rescore``,
``nbest``, ``ab``, ``merge_shards``, ``translate``, ``evaluate``, ``sample``, ``compare``,
``represent``, ``align``, ``info``, ``tables``); the device and threads are
:mod:`phrasescore.hardware`'s, the input and output checks :mod:`phrasescore.files`'.
"""

from __future__ import annotations

import torch

from phrasescore.bundle import TrainedModel, load_model
from phrasescore.errors import InputError


def model_for(
    model: TrainedModel | None, model_path: str | None, device: torch.device
) -> TrainedModel:
    """``model`` when a caller already holds one, else the model file ``model_path`` loaded."""
    if model is not None:
        return model
    if model_path is None:
        raise InputError("give a --model")
    return load_model(model_path, device)
