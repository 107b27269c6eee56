"""The ``info`` job: what a model file (or a CSLM file) is."""

from __future__ import annotations

from phrasescore.bundle import LM_FORMAT, load_lm, load_model, read_header


def describe_file(path: str) -> dict[str, object]:
    """Architecture, sizes, vocabularies and training of the model or LM file ``path``."""
    if read_header(path).get("format") == LM_FORMAT:
        return load_lm(path).describe()
    return load_model(path).describe()
