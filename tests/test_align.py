"""phrasescore align: hard alignments and heat maps from an attention model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from phrasescore.cli import cli
from phrasescore.jobs.analysis.align import hard_alignment, word_matrix

from .conftest import sample_pairs, write_lines
from .test_model_lstm import train_arch

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("align")
    src, tgt = sample_pairs(12)
    src[3] = ""  # an empty source line
    return folder, write_lines(folder / "a.en", src), write_lines(folder / "a.fr", tgt), src, tgt


@pytest.fixture(scope="module")
def attention_model(pairs):
    folder, s, t, _, _ = pairs
    path = folder / "attention.safetensors"
    train_arch(path, s, t, "attention", max_steps=10, valid_every=10, seed=2)
    return str(path)


def invoke(*args):
    return CliRunner().invoke(cli, ["-q", "align", *map(str, args)])


def test_one_line_per_pair_with_indices_within_both_lengths(pairs, attention_model):
    _, s, t, src, tgt = pairs
    result = invoke(s, t, "-m", attention_model)
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(src)
    for line, source, target in zip(lines, src, tgt, strict=False):
        n_src, n_tgt = len(source.split()), len(target.split())
        links = [tuple(map(int, link.split("-"))) for link in line.split()]
        if n_src == 0:
            assert links == []
            continue
        assert all(0 <= i < n_src and 0 <= j < n_tgt for i, j in links)
        assert sorted(j for _, j in links) == list(range(n_tgt))  # each target word once
        assert links == sorted(links)


def test_plots_are_one_valid_png_per_pair(pairs, attention_model, tmp_path):
    _, s, t, src, _ = pairs
    out = tmp_path / "alignments.txt"
    result = invoke(s, t, "-m", attention_model, "-o", out, "--plot", tmp_path / "plots")
    assert result.exit_code == 0, result.output
    pngs = sorted((tmp_path / "plots").iterdir())
    assert [p.name for p in pngs] == [f"{k:06d}.png" for k in range(1, len(src) + 1)]
    for png in pngs:
        assert png.read_bytes()[:8] == PNG_MAGIC
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(src)


@pytest.mark.parametrize("held", ["the model itself", "a link to the source"])
def test_a_plot_folder_that_holds_an_input_is_refused_before_any_work(
    pairs, attention_model, tmp_path, held
):
    """The plots are named 000001.png, 000002.png, ...: an input of such a name in the plot
    folder (the model given as plots/000002.png, or a link there to the source) would be
    replaced by a picture."""
    _, s, t, _, _ = pairs
    plots = tmp_path / "plots"
    plots.mkdir()
    model = attention_model
    if held == "the model itself":
        model = plots / "000002.png"
        model.write_bytes(Path(attention_model).read_bytes())
        role, path = "model", model
    else:
        (plots / "000001.png").symlink_to(s)
        role, path = "source", s
    before = {p.name: p.read_bytes() for p in plots.iterdir()}
    result = invoke(s, t, "-m", model, "-o", tmp_path / "out.txt", "--plot", plots)
    assert result.exit_code == 1, result.output
    assert result.output == (
        f"phrasescore: error: --plot {plots} holds the {role} ({path}): the tools write their "
        "files there under their own names and would overwrite it; give a folder of its own\n"
    )
    assert {p.name: p.read_bytes() for p in plots.iterdir()} == before
    assert not (tmp_path / "out.txt").exists()


def test_a_model_without_attention_is_refused_in_one_line(pairs, tiny_model_path):
    _, s, t, _, _ = pairs
    result = CliRunner().invoke(cli, ["align", s, t, "-m", tiny_model_path])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "attention model" in result.output and "'cho'" in result.output


def test_files_of_different_lengths_are_an_error(pairs, attention_model, tmp_path):
    _, s, _, src, tgt = pairs
    short = write_lines(tmp_path / "short.fr", tgt[:5])
    result = invoke(s, short, "-m", attention_model)
    assert result.exit_code == 1 and "before the other file" in result.output


def test_word_matrix_sums_source_pieces_and_averages_target_pieces():
    # source: word 0 = 2 pieces, word 1 = 1 piece, EOS; target: word 0 = 1 piece, word 1 = 2
    alpha = np.array(
        [
            [0.1, 0.2, 0.6, 0.1],
            [0.5, 0.3, 0.1, 0.1],
            [0.3, 0.3, 0.2, 0.2],
            [0.0, 0.0, 0.0, 1.0],
        ]
    )
    matrix = word_matrix(alpha, [0, 0, 1], [0, 1, 1], n_src=2, n_tgt=2)
    assert matrix.shape == (3, 3)
    assert matrix[0].tolist() == pytest.approx([0.3, 0.6, 0.1])
    assert matrix[1].tolist() == pytest.approx([0.7, 0.15, 0.15])
    assert matrix.sum(axis=1) == pytest.approx([1.0, 1.0, 1.0])
    assert hard_alignment(matrix) == [(0, 1), (1, 0)]


def test_hard_alignment_leaves_eos_out_on_both_sides():
    matrix = np.array([[0.2, 0.1, 0.7], [0.1, 0.5, 0.4], [0.0, 0.0, 1.0]])
    assert hard_alignment(matrix) == [(0, 0), (1, 1)]
    assert hard_alignment(np.ones((1, 3)) / 3) == []  # empty target
    assert hard_alignment(np.ones((3, 1))) == []  # empty source
