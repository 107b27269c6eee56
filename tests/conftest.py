"""Shared pytest fixtures: the small real files in tests/data and a tiny trained model."""

from __future__ import annotations

import collections
import gzip
import subprocess
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .forked_cli import run_phrasescore

DATA = Path(__file__).parent / "data"
TEXT = DATA / "text"

READS_BACK = {
    "aten._local_scalar_dense.default",  # .item(), float(t)
    "aten.is_nonzero.default",  # bool(t) in inference mode
    "aten.item.default",
    "aten.nonzero.default",  # what a boolean selection runs
    "aten.nonzero_numpy.default",  # nonzero(as_tuple=True)
    "aten.masked_select.default",
}


class OperatorCounts(TorchDispatchMode):
    """Counts the aten operators dispatched inside it, by name (``aten.addmm``)."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


class HostReads(TorchDispatchMode):
    """Records the operators that need a value of the device on the host (on a GPU the host
    waits there): scalar reads and boolean selections, with where they were called."""

    def __init__(self):
        super().__init__()
        self.seen: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        boolean_index = name in ("aten.index.Tensor", "aten.index_put_.default") and any(
            i is not None and i.dtype == torch.bool for i in args[1]
        )
        if name in READS_BACK or boolean_index:
            frames = [f for f in traceback.extract_stack() if "phrasescore" in f.filename]
            where = " <- ".join(
                f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}({f.name})" for f in frames[-3:]
            )
            self.seen[f"{name} at {where}"] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """PyTorch's thread count as each test found it: a job run in the test process with
    ``threads=1`` (or ``--threads``) sets it for the whole process, so the tests that ran after
    it in the same pytest process scored with another thread count than the CLI processes they
    start (float32 sums in another order: log p moved by ~5e-7, in some runs and not others)."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture
def data_dir() -> Path:
    return DATA


def run_cli(*args, **kwargs) -> subprocess.CompletedProcess:
    """``python -m phrasescore ARGS`` in a process of its own, output captured as text
    (tests/forked_cli.py: forked from one that has imported PyTorch)."""
    return run_phrasescore([str(arg) for arg in args], **kwargs)


def write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def sample_pairs(n: int | None = None) -> tuple[list[str], list[str]]:
    """Real tokenised, lowercased Multi30k pairs (tests/data/text)."""
    src = gzip.open(TEXT / "multi30k-sample.tok.lc.en.gz", "rt", encoding="utf-8").read()
    tgt = gzip.open(TEXT / "multi30k-sample.tok.lc.fr.gz", "rt", encoding="utf-8").read()
    src_lines, tgt_lines = src.splitlines(), tgt.splitlines()
    return src_lines[:n], tgt_lines[:n]


def untrained_model(src, tgt, arch: str, recurrence: str = "written", seed: int = 3, **config):
    """A freshly initialised tiny network of ``arch`` (``config``: other values of its
    configuration) with the word vocabularies of the phrases ``src`` and ``tgt``."""
    from phrasescore.bundle import TrainedModel
    from phrasescore.model.builders import build_network
    from phrasescore.model.config import preset
    from phrasescore.text.tokenize import TextNormalizer
    from phrasescore.text.vocab import WordVocabulary

    model_config, _ = preset("tiny", arch)
    model_config.recurrence = recurrence
    for key, value in config.items():
        setattr(model_config, key, value)
    src_vocab = WordVocabulary.build((s.split() for s in src), 1000)
    tgt_vocab = WordVocabulary.build((t.split() for t in tgt), 1000)
    model_config.src_vocab_size, model_config.tgt_vocab_size = len(src_vocab), len(tgt_vocab)
    torch.manual_seed(seed)
    network = build_network(model_config).eval()
    return TrainedModel(network, src_vocab, tgt_vocab, TextNormalizer("en"), TextNormalizer("fr"))


@pytest.fixture(scope="session")
def corpus_files(tmp_path_factory) -> tuple[str, str]:
    """171 real sentence pairs as plain files."""
    folder = tmp_path_factory.mktemp("corpus")
    src, tgt = sample_pairs()
    return write_lines(folder / "train.en", src), write_lines(folder / "train.fr", tgt)


def train_tiny(
    path,
    source,
    target,
    valid=None,
    src_lang="en",
    tgt_lang="fr",
    resume=False,
    arch="cho",
    model_overrides=None,
    device="cpu",
    amp=False,
    **kw,
):
    """Train a ``tiny``-preset model with ``phrasescore train``'s job function; ``kw`` are the
    training overrides (max_steps, learning_rate, seed, ...). Returns the TrainResult."""
    from phrasescore.jobs.training.train import run_training

    return run_training(
        model_path=str(path),
        source=source,
        target=target,
        phrase_table=None,
        valid=valid,
        preset="tiny",
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        tokenize=False,
        lowercase=False,
        device=device,
        amp=amp,
        threads=None,
        resume=resume,
        overrides=kw,
        arch=arch,
        model_overrides=model_overrides,
    )


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, corpus_files) -> str:
    """A tiny model trained for a few seconds on the 171 sample pairs (shared by many tests)."""
    path = tmp_path_factory.mktemp("model") / "tiny.safetensors"
    train_tiny(path, *corpus_files, max_steps=60, valid_every=30, learning_rate=3e-3, seed=3)
    return str(path)


def interrupt_at_call(monkeypatch, owner, name: str, call: int) -> None:
    """``owner.name`` (a method) raises KeyboardInterrupt (Ctrl-C) at its ``call``-th call and
    runs as before otherwise (``monkeypatch.undo()`` puts it back)."""
    original = getattr(owner, name)
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory) -> str:
    """A tiny CSLM (4-gram) trained for 20 steps on the sample's French side."""
    from phrasescore.jobs.training.train_lm import run_lm_training

    _, french = sample_pairs(20)
    folder = tmp_path_factory.mktemp("lm")
    corpus = write_lines(folder / "corpus.fr", french)
    path = str(folder / "lm.safetensors")
    settings = dict(learning_rate=1e-2, epochs=1000, batch_tokens=2000, seed=3, max_steps=20)
    run_lm_training(path, corpus, valid=corpus, preset="tiny", order=4, device="cpu",
                    progress=False, overrides=settings)  # fmt: skip
    return path


@pytest.fixture(scope="session")
def tiny_second_seed_model_path(tmp_path_factory, corpus_files) -> str:
    """The tiny model's recipe with another seed: the same vocabularies, other weights (a
    member of an ensemble with the tiny model)."""
    path = tmp_path_factory.mktemp("seed4") / "seed4.safetensors"
    train_tiny(path, *corpus_files, max_steps=60, valid_every=30, learning_rate=3e-3, seed=4)
    return str(path)


@pytest.fixture(scope="session")
def tiny_r2l_model_path(tmp_path_factory, corpus_files) -> str:
    """The tiny model's recipe, right to left (``train --reverse-target``)."""
    path = tmp_path_factory.mktemp("r2l") / "r2l.safetensors"
    train_tiny(
        path,
        *corpus_files,
        model_overrides=dict(reverse_target=True),
        max_steps=60,
        valid_every=30,
        learning_rate=3e-3,
        seed=3,
    )
    return str(path)


@pytest.fixture(scope="session")
def tiny_inverse_model_path(tmp_path_factory, corpus_files) -> str:
    """A tiny French->English model (the sample pairs with their sides swapped): the
    target->source model of ``nbest --inverse`` and ``ab --rerank-inverse``."""
    path = tmp_path_factory.mktemp("inverse") / "fr-en.safetensors"
    src, tgt = corpus_files
    train_tiny(path, tgt, src, src_lang="fr", tgt_lang="en", max_steps=60, learning_rate=3e-3)
    return str(path)
