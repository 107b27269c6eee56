"""The networks (ids in, scores out: no file, text or vocabulary here) and their plumbing.

* :mod:`~phrasescore.special_ids` -- the special ids PAD/UNK/BOS/EOS (shared with text/);
* :mod:`~phrasescore.model.config` -- sizes, training settings, presets, learning rates;
* :mod:`~phrasescore.model.builders` -- the architecture registry and :func:`build_network`;
* :mod:`~phrasescore.model.initialization` -- each paper's initial weights;
* :mod:`~phrasescore.model.base` -- the interface of every encoder-decoder;
* :mod:`~phrasescore.model.output_layer` -- the softmax's loss and scoring kernels, maxout;
* :mod:`~phrasescore.model.encdec`, :mod:`~phrasescore.model.lstm`,
  :mod:`~phrasescore.model.attention`, :mod:`~phrasescore.model.transformer`,
  :mod:`~phrasescore.model.cslm` -- the networks (one class per network: the written and the
  fused recurrence are two);
* :mod:`~phrasescore.model.checkpoint` -- weights files (safetensors + JSON metadata).

The model file as a whole (network + vocabularies + text settings) is
:mod:`phrasescore.bundle`.
"""

from __future__ import annotations

from phrasescore.model.config import ARCHITECTURES

__all__ = ["ARCHITECTURES", "NETWORKS", "build_network"]


def __getattr__(name: str):
    """The networks on first use: ``phrasescore.model.config`` (the presets a command's
    ``--help`` lists) is plain Python, and importing it should not import PyTorch."""
    if name in ("NETWORKS", "build_network"):
        from phrasescore.model import builders

        return getattr(builders, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
