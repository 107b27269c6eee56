"""A model feature as the jobs name it: ``NAME=MODEL`` or ``NAME=MODEL,MODEL`` specs, what ``nbest
-m``/``--inverse-model`` and ``ab --rerank``/``--rerank-inverse`` take.

One feature is one :class:`FeatureModel`: a Moses feature name, one model file or several (their
token-level ensemble, :class:`~phrasescore.engine.scoring.EnsembleScorer`, Sutskever et al. 2014
§3.6) and a direction (``inverse``: a target->source model whose feature is log p(source |
hypothesis), the inverse-direction re-ranking feature of Sennrich et al. 2016). ``ab`` also names
an unnamed ``MODEL`` ``RNNEncDec<i>`` (``RNNEncDecInv<i>``). A spec is ``NAME=MODEL`` when it
holds ``=`` and is not itself a file (a model file whose name holds ``=`` is still given as it
is). The direct features come first, in the order given, then the target->source ones.

Shared by the products that score n-best lists (:mod:`phrasescore.jobs.nbest`) and that tune on
them (:mod:`phrasescore.jobs.tuning`); the models are loaded and scored by
:mod:`phrasescore.jobs.nbest.features`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from phrasescore.errors import InputError
from phrasescore.files.inputs import check_input_file
from phrasescore.moses.nbest import check_feature_name


class FeatureModel(NamedTuple):
    """One feature: its name, its model files (several: their ensemble) and its direction."""

    name: str
    paths: tuple[str, ...]
    inverse: bool = False
    """A target->source model: the feature is log p(source | hypothesis)."""


def is_named_spec(spec: str) -> bool:
    """Whether ``spec`` is ``NAME=MODEL`` (it holds ``=`` and is not a file itself)."""
    return "=" in spec and not Path(spec).is_file()


def parse_feature_models(
    specs: Sequence[str],
    inverse_specs: Sequence[str] = (),
    options: tuple[str, str] = ("-m", "--inverse-model"),
    default_names: tuple[str, str] | None = None,
    resolve: bool = False,
) -> tuple[FeatureModel, ...]:
    """``NAME=MODEL[,MODEL...]`` specs as features, the direct ones (``specs``) first, then the
    target->source ones; each name a valid Moses dense feature name
    (:func:`~phrasescore.moses.nbest.check_feature_name`) given once. ``options`` names the two
    options in messages; with ``default_names`` (``ab``'s ``RNNEncDec``, ``RNNEncDecInv``) an
    unnamed ``MODEL`` is named ``<default><i>``, without them it is refused. With ``resolve``,
    each file is checked and its path resolved (:func:`~phrasescore.files.check_input_file`)."""
    models: list[FeatureModel] = []
    for inverse, option, default, given in (
        (False, options[0], default_names and default_names[0], specs),
        (True, options[1], default_names and default_names[1], inverse_specs),
    ):
        for index, spec in enumerate(given):
            name, sep, path = spec.partition("=") if is_named_spec(spec) else ("", "", spec)
            if not sep:
                if default is None:
                    raise InputError(f"{option} {spec}: give NAME=MODEL (the feature's name)")
                name = f"{default}{index}"
            try:
                check_feature_name(name)
            except InputError as exc:
                raise InputError(f"{option} {spec}: {exc.message}") from None
            if name in {known.name for known in models}:
                raise InputError(f"{option} {spec}: feature name {name} given twice")
            paths = path.split(",")
            if not all(paths):
                raise InputError(f"{option} {spec}: a model file name is empty")
            if resolve:
                paths = [
                    str(check_input_file(Path(one), f"{option} {name} model")) for one in paths
                ]
            models.append(FeatureModel(name, tuple(paths), inverse))
    return tuple(models)
