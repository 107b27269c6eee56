"""The model file (phrasescore.bundle): one loader for both kinds, refusing crafted files."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from phrasescore import bundle
from phrasescore.engine.scoring import PairScorer
from phrasescore.errors import ModelFileError
from phrasescore.model.checkpoint import (
    TENSOR_ALIGNMENT,
    compute_signature,
    read_tensors,
    save_network_file,
)
from phrasescore.special_ids import SPECIAL_IDS
from phrasescore.text import vocab

from .conftest import sample_pairs


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


def test_a_vocabulary_gives_its_special_symbols_the_networks_special_ids():
    """Words take the ids after the four special ones (PAD, UNK, BOS, EOS), an unknown word the
    networks' UNK, and decoding skips the networks' PAD, BOS and EOS."""
    words = vocab.WordVocabulary.build([["a", "b"], ["b"]])
    assert words.encode(["b", "a", "never-seen"]) == [len(SPECIAL_IDS), len(SPECIAL_IDS) + 1, 1]
    assert SPECIAL_IDS[1] == vocab.UNK_ID == 1
    assert words.decode([*SPECIAL_IDS, len(SPECIAL_IDS)]) == ["<unk>", "b"]


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


# ---------------------------------------------------------------------------- same bytes
def test_two_identical_trainings_write_byte_identical_model_files(tmp_path, corpus_files):
    """The metadata is written in sorted order: safetensors' own writer uses hash-map order, a
    new order each time, so the files would differ in bytes and ``ab``'s cache, keyed on a model
    file's hash, would miss."""
    import hashlib

    from .conftest import train_tiny

    paths = []
    for folder in ("first", "second-run"):  # different directories, same data, seed, threads
        (tmp_path / folder).mkdir()
        path = tmp_path / folder / "model.safetensors"
        train_tiny(path, *corpus_files, max_steps=4, valid_every=2, seed=7)
        paths.append(path)
    first, second = (p.read_bytes() for p in paths)
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(second).hexdigest()
    model = bundle.load_model(str(paths[0]))
    with safe_open(str(paths[0]), framework="pt") as handle:
        metadata = handle.metadata()
    assert metadata["signature"] == model.signature and metadata["format"] == bundle.FORMAT
    header_size = int.from_bytes(first[:8], "little")
    header = json.loads(first[8 : 8 + header_size])
    assert list(header["__metadata__"]) == sorted(metadata)  # sorted, not hash-map order


def test_a_model_file_written_by_safetensors_itself_still_loads(tmp_path, tiny_model_path):
    """A file written by safetensors' own writer (metadata in hash-map order) loads, with the
    same signature."""
    model = bundle.load_model(tiny_model_path)
    with safe_open(tiny_model_path, framework="pt") as handle:
        metadata = dict(handle.metadata())
    old = str(tmp_path / "old.safetensors")
    save_file(read_tensors(tiny_model_path), old, metadata=metadata)
    again = bundle.load_model(old)
    assert again.signature == model.signature
    for (name, a), (_, b) in zip(
        model.network.state_dict().items(), again.network.state_dict().items(), strict=True
    ):
        assert a.equal(b), name


def test_the_same_weights_give_the_same_bytes_whatever_the_header_length(tmp_path, tiny_model_path):
    """safetensors maps a file's tensors at 8 + header size + offset bytes from a page, so the
    metadata's length (a longer path in ``info``) moves every tensor's alignment, and the
    float32 matrix products take other code paths for other alignments (log p moved by ~1e-6 in
    the 7th digit). Loading aligns the tensors: one model's weights, one set of scores."""
    model = bundle.load_model(tiny_model_path)
    pairs = sample_pairs(30)
    expected = PairScorer(model).score_phrases(*pairs).logprob
    in_file = set()
    for pad in range(0, 64, 8):  # the header grows by 8 bytes a step: every alignment mod 64
        path = str(tmp_path / f"pad{pad}.safetensors")
        info = {**model.info, "padding": "x" * pad}
        save_network_file(
            path, model.network, model.core(), info, bundle.FORMAT, bundle.FORMAT_VERSION
        )
        with safe_open(path, framework="pt") as handle:
            in_file |= {handle.get_tensor(k).data_ptr() % TENSOR_ALIGNMENT for k in handle.keys()}
        copy = bundle.load_model(path)
        assert all(p.data_ptr() % TENSOR_ALIGNMENT == 0 for p in copy.network.parameters())
        np.testing.assert_array_equal(PairScorer(copy).score_phrases(*pairs).logprob, expected)
    assert len(in_file) >= 8  # the condition was there: tensors mapped at many alignments


def test_loading_a_model_and_scoring_text_imports_neither_dynamo_nor_the_tokenizer(tiny_model_path):
    """What a scoring command's start-up pays for: a model loads by building its network on the
    meta device without its random initialisation (``normal_`` there imports torch._dynamo, a
    third of the start-up), and text that is tokenised already never imports sacremoses."""
    code = (
        "import sys\n"
        "from phrasescore.bundle import load_model\n"
        f"model = load_model({tiny_model_path!r})\n"
        "print(model.src_text('a man .'))\n"
        "print(sorted(m for m in ('torch._dynamo', 'sacremoses') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["['a', 'man', '.']", "[]"]
