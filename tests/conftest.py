"""Shared pytest fixtures: the small real files in tests/data and a tiny trained model."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DATA = Path(__file__).parent / "data"
TEXT = DATA / "text"


@pytest.fixture
def data_dir() -> Path:
    return DATA


def write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def sample_pairs(n: int | None = None) -> tuple[list[str], list[str]]:
    """Real tokenised, lowercased Multi30k pairs (tests/data/text)."""
    src = gzip.open(TEXT / "multi30k-sample.tok.lc.en.gz", "rt", encoding="utf-8").read()
    tgt = gzip.open(TEXT / "multi30k-sample.tok.lc.fr.gz", "rt", encoding="utf-8").read()
    src_lines, tgt_lines = src.splitlines(), tgt.splitlines()
    return src_lines[:n], tgt_lines[:n]


@pytest.fixture(scope="session")
def corpus_files(tmp_path_factory) -> tuple[str, str]:
    """171 real sentence pairs as plain files."""
    folder = tmp_path_factory.mktemp("corpus")
    src, tgt = sample_pairs()
    return write_lines(folder / "train.en", src), write_lines(folder / "train.fr", tgt)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, corpus_files) -> str:
    """A tiny model trained for a few seconds on the 171 sample pairs (shared by many tests)."""
    from phrasescore.jobs import run_training

    folder = tmp_path_factory.mktemp("model")
    path = str(folder / "tiny.safetensors")
    run_training(
        model_path=path,
        source=corpus_files[0],
        target=corpus_files[1],
        phrase_table=None,
        valid=None,
        preset="tiny",
        src_lang="en",
        tgt_lang="fr",
        tokenize=False,
        lowercase=False,
        device="cpu",
        amp=False,
        threads=None,
        resume=False,
        overrides=dict(max_steps=60, valid_every=30, learning_rate=3e-3, seed=3),
    )
    return path
