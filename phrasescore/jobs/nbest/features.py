"""The model features of an n-best list: which models give which feature, loaded and scored.

One feature is one :class:`~phrasescore.jobs.feature_specs.FeatureModel` (a Moses feature name,
one model file or the ensemble of several, a direction), read from the ``NAME=MODEL`` specs of
``nbest -m``/``--inverse-model`` (:mod:`phrasescore.jobs.feature_specs`, which ``ab --rerank``
shares). ``nbest`` keeps its older form too (:func:`nbest_feature_models`): plain ``-m FILE``
(several: one ensemble) named by ``--name``, target->source with ``--inverse``.

:class:`ModelFeatures` loads every feature's models (all in every ``--workers`` process, which
inherit them by fork) and scores a chunk of ``(sources, hypotheses)`` with each, in order; it
warns once per model when the list looks reversed for it (:meth:`ModelFeatures.warn_direction`,
the check ``rescore`` makes on a phrase table: :func:`~phrasescore.jobs.common.direction_evidence`).

:func:`load_features` loads every feature of a run (the CSLM's too) and :class:`ChunkFeatures`
is what scores one chunk with them, in this process or a ``--workers`` one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from phrasescore.bundle import load_lm, load_model
from phrasescore.engine.lm_scoring import LMScorer
from phrasescore.engine.protocol import Scorer, build_ensemble, build_scorer
from phrasescore.engine.scoring import check_ensemble
from phrasescore.errors import InputError
from phrasescore.jobs.common import warn_if_reversed
from phrasescore.jobs.feature_specs import FeatureModel, is_named_spec, parse_feature_models

log = logging.getLogger(__name__)

DEFAULT_NAME = "RNNEncDec0"
"""The feature name of a plain ``nbest -m MODEL`` without ``--name``."""


def nbest_feature_models(
    model_specs: Sequence[str],
    inverse_specs: Sequence[str] = (),
    name: str | None = None,
    inverse: bool = False,
) -> tuple[FeatureModel, ...]:
    """The features of ``nbest -m ... --inverse-model ...``: every ``-m`` ``NAME=MODEL`` (one
    feature each, :func:`parse_feature_models`), or every ``-m`` a plain file (the older form:
    one feature, their ensemble, named ``name``, target->source with ``inverse``). The two forms
    do not mix; ``--name`` and ``--inverse`` belong to the older one."""
    named = [spec for spec in model_specs if is_named_spec(spec)]
    if not named and not inverse_specs:
        if not model_specs:
            return ()
        return (FeatureModel(name or DEFAULT_NAME, tuple(model_specs), inverse),)
    if len(named) != len(model_specs):
        plain = next(spec for spec in model_specs if not is_named_spec(spec))
        raise InputError(
            f"-m {plain}: give every -m as NAME=MODEL (one feature each) or every -m as a plain "
            "MODEL file (one feature, named by --name), not both"
        )
    if name is not None or inverse:
        flag = "--name" if name is not None else "--inverse"
        raise InputError(
            f"{flag} is for plain -m MODEL: with NAME=MODEL the name is in the spec, and a "
            "target->source model goes in --inverse-model NAME=MODEL"
        )
    return parse_feature_models(model_specs, inverse_specs)


class ModelFeatures:
    """The models of every feature, loaded on ``device``, and their scorers: one
    scorer per model (:func:`~phrasescore.engine.protocol.build_scorer`), their ensemble per
    feature of several (:func:`~phrasescore.engine.protocol.build_ensemble`). ``shared_prefixes``
    (None: on the CPU): each scorer scores a chunk's distinct (source, prefix, word) once
    (:mod:`phrasescore.engine.prefix_scoring`)."""

    def __init__(
        self,
        features: Sequence[FeatureModel],
        device,
        batch_tokens: int,
        scoring: str,
        shared_prefixes: bool | None = None,
    ) -> None:
        self.features = tuple(features)
        if shared_prefixes is None:
            shared_prefixes = torch.device(device).type == "cpu"
        self.shared_prefixes = shared_prefixes
        """Whether the scorers score by shared prefixes (resolved for the device)."""
        self.models = []
        """The loaded models of each feature, in order."""
        self.scorers: list[Scorer] = []
        for feature in self.features:
            models = [load_model(path, device) for path in feature.paths]
            if len(models) > 1:
                check_ensemble(models, list(feature.paths))
            scorers = [
                build_scorer(
                    model,
                    device=device,
                    batch_tokens=batch_tokens,
                    scoring=scoring,
                    model_path=path,
                    shared_prefixes=shared_prefixes,
                )
                for model, path in zip(models, feature.paths, strict=True)
            ]
            self.models.append(models)
            self.scorers.append(build_ensemble(scorers))
            log.info(
                "n-best rescoring with %s %s, feature %s = log p(%s), %s scoring%s",
                "model" if len(models) == 1 else f"the ensemble of {len(models)} models",
                ", ".join(model.signature for model in models),
                feature.name,
                "source | hypothesis" if feature.inverse else "hypothesis | source",
                scoring,
                " by shared prefixes" if shared_prefixes else "",
            )

    @property
    def signatures(self) -> list[str]:
        """Every model's signature, feature after feature (a shard manifest's ``models``)."""
        return [model.signature for models in self.models for model in models]

    @property
    def clamped(self) -> int:
        """Self-normalized scoring: the model scores clamped at log p = 0 so far."""
        return sum(scorer.clamped for scorer in self.scorers)

    def warm_up(self) -> None:
        for scorer in self.scorers:
            scorer.warm_up()

    def scorer_features(self, normalize: bool) -> list[tuple[str, ModelFeature]]:
        """``(name, feature)`` of each feature, in order (:class:`ModelFeature`)."""
        return [
            (feature.name, ModelFeature(scorer, normalize, feature.inverse))
            for feature, scorer in zip(self.features, self.scorers, strict=True)
        ]

    def warn_direction(self, sources: list[str], hypotheses: list[str]) -> None:
        """Warn for each model the list looks reversed for: its vocabularies know the list's
        words better read the other way round
        (:func:`~phrasescore.jobs.common.direction_evidence`). ``nbest`` calls it on
        the first chunk it scores."""
        sources = list(dict.fromkeys(sources))
        hypotheses = list(dict.fromkeys(hypotheses))
        for feature, models in zip(self.features, self.models, strict=True):
            src, tgt = (hypotheses, sources) if feature.inverse else (sources, hypotheses)
            hint = (
                f"if it translates the source language into the hypotheses' language, give "
                f"feature {feature.name} as -m {feature.name}=MODEL (without --inverse)"
                if feature.inverse
                else f"if it translates the hypotheses' language into the source language, give "
                f"feature {feature.name} as --inverse-model {feature.name}=MODEL (or --inverse)"
            )
            for model, path in zip(models, feature.paths, strict=True):
                warn_if_reversed(model, path, src, tgt, "the n-best list's", hint)


@dataclass
class ModelFeature:
    """One feature's values: log p(hypothesis | source), or per token with ``normalize``; with
    ``inverse`` (a target->source model) log p(source | hypothesis). :meth:`encode` is the
    text half (vocabularies), :meth:`score` the network half: an ``--io-workers`` process runs
    the first and asks the process that owns the networks for the second."""

    scorer: Scorer
    normalize: bool
    inverse: bool = False

    def encode(self, srcs: list[str], hyps: list[str]):
        """The ids of the chunk's pairs (a list of them for an ensemble, one per model)."""
        if self.inverse:
            return self.scorer.encode_arrays(hyps, srcs)
        return self.scorer.encode_arrays(srcs, hyps)

    def score(self, ids) -> np.ndarray:
        """The values of :meth:`encode`'s ids."""
        scored = self.scorer.score_encoded(ids)
        return scored.logprob / scored.n_tokens if self.normalize else scored.logprob


def load_features(
    features: Sequence[FeatureModel],
    lm_path: str | None,
    lm_name: str,
    device,
    batch_tokens: int,
    scoring: str,
    normalize: bool,
    shared_prefixes: bool | None = None,
) -> tuple[list, dict[str, list[str]], ModelFeatures | None]:
    """(name, feature) of each feature to add, in line order (each feature's ``encode`` and
    ``score``, :class:`ChunkFeatures`):
    the CSLM's first (``lm_path``, feature ``lm_name``), then the models' (:class:`ModelFeatures`,
    one feature per :class:`FeatureModel`); the signatures of the LM and models; and the models'
    scorers (None without a model)."""
    scored = []
    signatures: dict[str, list[str]] = {"lms": [], "models": []}
    scorer = None
    if lm_path:
        lm = load_lm(lm_path, device)
        signatures["lms"].append(lm.signature)
        log.info("n-best rescoring with language model %s, feature %s", lm.signature, lm_name)
        scored.append((lm_name, LMFeature(LMScorer(lm, device))))
    if features:
        scorer = ModelFeatures(features, device, batch_tokens, scoring, shared_prefixes)
        signatures["models"].extend(scorer.signatures)
        scored.extend(scorer.scorer_features(normalize))
    return scored, signatures, scorer


@dataclass
class LMFeature:
    """The CSLM feature: log p(hypothesis </s> | <s>) of each hypothesis (Schwenk 2007); its
    text half and network half as :class:`ModelFeature`'s."""

    scorer: LMScorer

    def encode(self, srcs: list[str], hyps: list[str]) -> list[list[int]]:
        return self.scorer.sentence_ids(hyps)

    def score(self, ids: list[list[int]]) -> np.ndarray:
        return self.scorer.score_ids(ids, True)[0]


@dataclass
class ChunkFeatures:
    """Each feature's values for one chunk's ``(sources, hypotheses)``, in order, and the model
    scores it clamped: :meth:`request` (the ids: the text half, where the chunk is parsed) then
    :meth:`serve` (the networks), in this process, or :meth:`serve` in the process that owns
    the networks when an ``--io-workers`` process asks it. The same functions either way: the
    same bytes."""

    features: list
    scorer: ModelFeatures | None

    def request(self, srcs: list[str], hyps: list[str]) -> list:
        """The ids each feature scores."""
        return [feature.encode(srcs, hyps) for _, feature in self.features]

    def serve(self, request: list) -> tuple[list[np.ndarray], int]:
        """The values of a :meth:`request` and the model scores clamped meanwhile."""
        before = self.scorer.clamped if self.scorer is not None else 0
        values = [
            np.asarray(feature.score(ids), dtype=np.float64)
            for (_, feature), ids in zip(self.features, request, strict=True)
        ]
        return values, (self.scorer.clamped - before if self.scorer is not None else 0)

    def __call__(self, srcs: list[str], hyps: list[str], ask=None) -> tuple[list, int]:
        """The values of the chunk's pairs: ``ask`` (an ``--io-workers`` process's line to the
        networks' process) or :meth:`serve` here."""
        return (ask or self.serve)(self.request(srcs, hyps))
