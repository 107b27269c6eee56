"""The model file (phrasescore.bundle): one loader for both kinds, refusing crafted files."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from phrasescore import bundle
from phrasescore.errors import ModelFileError
from phrasescore.model.checkpoint import compute_signature, read_tensors
from phrasescore.model.constants import SPECIAL_IDS
from phrasescore.text import vocab


def _rewrite(src: str, dst: str, change) -> None:
    """Copy a model file with its ``config`` changed and a matching signature."""
    with safe_open(src, framework="pt") as handle:
        metadata = dict(handle.metadata())
    config = json.loads(metadata["config"])
    change(config)
    metadata["config"] = json.dumps(config, sort_keys=True)
    tensors = read_tensors(src)
    core = {k: metadata[k] for k in bundle.TrainedModel.CORE_KEYS}
    metadata["signature"] = compute_signature(tensors, core)
    save_file(tensors, dst, metadata=metadata)


def test_vocabularies_and_networks_agree_on_special_ids():
    assert (vocab.PAD_ID, vocab.UNK_ID, vocab.BOS_ID, vocab.EOS_ID) == SPECIAL_IDS


def test_insane_sizes_are_refused_before_a_network_is_built(tmp_path, tiny_model_path):
    crafted = str(tmp_path / "huge.safetensors")
    _rewrite(tiny_model_path, crafted, lambda c: c.update(hidden_dim=300_000))
    with pytest.raises(ModelFileError, match="hidden_dim 300000") as caught:
        bundle.load_model(crafted)
    assert "\n" not in str(caught.value)


def test_tensors_that_do_not_fit_the_configuration_are_refused(tmp_path, tiny_model_path):
    crafted = str(tmp_path / "wide.safetensors")
    _rewrite(tiny_model_path, crafted, lambda c: c.update(hidden_dim=c["hidden_dim"] * 2))
    with pytest.raises(ModelFileError, match="do not fit the configuration"):
        bundle.load_model(crafted)


def test_save_and_load_round_trip(tmp_path, tiny_model_path):
    model = bundle.load_model(tiny_model_path)
    copy = str(tmp_path / "sub" / "copy.safetensors")
    assert bundle.save_model(copy, model) == model.signature
    again = bundle.load_model(copy)
    assert again.signature == model.signature and again.src_vocab == model.src_vocab
    with pytest.raises(ModelFileError, match="not a CSLM language model"):
        bundle.load_lm(copy)
