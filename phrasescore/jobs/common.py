"""What the jobs share: the model a job was handed or loads from its file, and whether a model
reads a job's input the right way round (:func:`warn_if_reversed`, for ``rescore`` and
``nbest``).

Each command has its own job module in a product folder of this package
(:mod:`phrasescore.jobs`); the device and threads are :mod:`phrasescore.hardware`'s, the input
and output checks :mod:`phrasescore.files`'.
"""

from __future__ import annotations

import logging

import torch

from phrasescore.bundle import TrainedModel, load_model
from phrasescore.engine.scoring import phrase_tokens
from phrasescore.errors import InputError

log = logging.getLogger(__name__)


def model_for(
    model: TrainedModel | None, model_path: str | None, device: torch.device
) -> TrainedModel:
    """``model`` when a caller already holds one, else the model file ``model_path`` loaded."""
    if model is not None:
        return model
    if model_path is None:
        raise InputError("give a --model")
    return load_model(model_path, device)


DIRECTION_MARGIN = 0.2
"""How much better the model's vocabularies must know the table read backwards (fraction of
known tokens) before :func:`direction_evidence` calls it reversed."""


def direction_evidence(model, sources: list[str], targets: list[str]) -> tuple[float, float] | None:
    """(coverage as given, coverage swapped) when ``model`` looks trained target->source on
    these phrases, else None.

    Coverage is the mean over both sides of the fraction of tokens the model's vocabulary knows:
    as given, sources by its source vocabulary and targets by its target vocabulary; swapped,
    the other way round. Reversed means swapped is at least :data:`DIRECTION_MARGIN` higher and
    twice as high: words the languages share (numbers, names, punctuation) count on both sides,
    and a model of other languages altogether knows little either way.
    """
    if not sources or not targets:
        return None
    src_as_src = [phrase_tokens(model.src_text, p) for p in sources]
    tgt_as_tgt = [phrase_tokens(model.tgt_text, p) for p in targets]
    src_as_tgt = [phrase_tokens(model.tgt_text, p) for p in sources]
    tgt_as_src = [phrase_tokens(model.src_text, p) for p in targets]
    given = (model.src_vocab.coverage(src_as_src) + model.tgt_vocab.coverage(tgt_as_tgt)) / 2
    swapped = (model.tgt_vocab.coverage(src_as_tgt) + model.src_vocab.coverage(tgt_as_src)) / 2
    if swapped >= given + DIRECTION_MARGIN and swapped >= 2 * given:
        return given, swapped
    return None


def warn_if_reversed(model, path, sources, targets, whose: str, hint: str) -> bool:
    """Log a warning when ``model`` looks trained in the other direction on these phrases
    (:func:`direction_evidence`), ``whose`` naming the input (``the table's``) and ``hint``
    saying what to do; whether it warned. ``rescore`` and ``nbest`` share it."""
    evidence = direction_evidence(model, sources, targets)
    if evidence is None:
        return False
    given, swapped = evidence
    log.warning(
        "%s (%s->%s) looks trained in the other direction: its vocabularies know %.0f%% of %s "
        "words read the other way round, %.0f%% as given; %s",
        path or model.signature,
        model.src_text.lang,
        model.tgt_text.lang,
        100 * swapped,
        whose,
        100 * given,
        hint,
    )
    return True
