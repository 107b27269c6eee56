"""The ``info`` job: what a model file (or a CSLM file) is."""

from __future__ import annotations

from dataclasses import dataclass

from phrasescore.bundle import LM_FORMAT, load_lm, load_model, read_header


@dataclass
class Description:
    """Architecture, sizes, vocabularies and training of a model or LM file."""

    fields: dict[str, object]

    def lines(self) -> list[str]:
        """``key: value`` per field."""
        return [f"{key}: {value}" for key, value in self.fields.items()]


def describe_file(path: str) -> Description:
    """Architecture, sizes, vocabularies and training of the model or LM file ``path``."""
    if read_header(path).get("format") == LM_FORMAT:
        return Description(load_lm(path).describe())
    return Description(load_model(path).describe())
