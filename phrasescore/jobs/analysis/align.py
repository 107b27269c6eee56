"""``phrasescore align``: the soft alignment α of an attention model, as hard alignments and plots.

For every pair (source line, target line) the target is decoded teacher-forced by an
``--arch attention`` model (Bahdanau et al. 2015) and the attention weights α_ij -- how much the
annotation of source position j contributes to target position i (§3.1) -- are read out
(:meth:`~phrasescore.model.attention.AttentionEncoderDecoder.attention_weights`).

Hard alignments (stdout, one line per pair, in the Moses/GIZA ``i-j`` format, i the source word
and j the target word, both 0-based, sorted by i then j): every target word j is aligned to
``argmax_i α_ji`` over the source *words*. The end-of-sequence symbol is excluded on both sides:
the row of α predicting the target EOS is dropped, and the source EOS column is left out of the
argmax (a target word attending mostly to EOS is aligned to its best real source word). A pair
with an empty target (or an empty source) gives an empty line.

Words are the tokens of each line as the model reads them (``TextNormalizer`` of the model: a
model trained with ``--tokenize`` tokenises the lines first). With a subword vocabulary each word
is encoded on its own and α is brought back to words: summed over the pieces of a source word
and averaged over the pieces of a target word (so each target word's row still sums to 1).

With ``--plot DIR``, one PNG per pair, ``DIR/NNNNNN.png`` named by the 1-based line number: a
grey-scale heat map of α (0 black, 1 white) with the source words along the x axis and the target
words along the y axis, EOS included on both, as in Bahdanau et al. Figure 3.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import zip_longest

import numpy as np
import torch

from phrasescore.bundle import TrainedModel
from phrasescore.errors import InputError
from phrasescore.figures import new_figure, save_figure
from phrasescore.files.guards import check_work_folder, refuse_outputs_onto_inputs
from phrasescore.files.inputs import check_files_exist
from phrasescore.files.outputs import AtomicOutput, check_output_path
from phrasescore.files.reading import iter_lines
from phrasescore.hardware import resolve_device
from phrasescore.jobs.common import model_for
from phrasescore.text.corpus import pad_ids
from phrasescore.text.vocab import BOS_ID, EOS_ID, EOS_TOKEN

log = logging.getLogger(__name__)


@dataclass
class AlignResult:
    pairs: int
    seconds: float
    plots: int
    output: str
    plot_dir: str | None = None

    def lines(self) -> list[str]:
        """The summary ``align`` prints on standard error."""
        plots = f", {self.plots} plots in {self.plot_dir}" if self.plot_dir else ""
        return [
            f"phrasescore: {self.pairs} pairs aligned in {self.seconds:.1f} s{plots} "
            f"-> {self.output}"
        ]


def word_pieces(vocab, words: Sequence[str]) -> tuple[list[int], list[int]]:
    """The ids of ``words`` (each word encoded on its own) and the word index of each id."""
    ids: list[int] = []
    owner: list[int] = []
    if not words:
        return ids, owner
    for k, pieces in enumerate(vocab.encode_batch([[w] for w in words])):
        ids.extend(pieces)
        owner.extend([k] * len(pieces))
    return ids, owner


def word_matrix(
    alpha: np.ndarray, src_owner: Sequence[int], tgt_owner: Sequence[int], n_src: int, n_tgt: int
) -> np.ndarray:
    """α over words, EOS last on both axes: [n_tgt + 1, n_src + 1] from the piece-level α
    [len(tgt_owner) + 1, len(src_owner) + 1] (summed over a source word's pieces, averaged over
    a target word's pieces)."""
    cols = np.zeros((alpha.shape[0], n_src + 1), dtype=np.float64)
    np.add.at(cols.T, np.append(np.asarray(src_owner, dtype=np.int64), n_src), alpha.T)
    rows = np.zeros((n_tgt + 1, n_src + 1), dtype=np.float64)
    owner = np.append(np.asarray(tgt_owner, dtype=np.int64), n_tgt)
    np.add.at(rows, owner, cols)
    counts = np.bincount(owner, minlength=n_tgt + 1).astype(np.float64)
    return rows / np.maximum(counts, 1.0)[:, None]


def hard_alignment(matrix: np.ndarray) -> list[tuple[int, int]]:
    """(source word, target word) pairs: each target word to its argmax source word, EOS
    excluded on both sides (``matrix`` as :func:`word_matrix` returns it)."""
    n_tgt, n_src = matrix.shape[0] - 1, matrix.shape[1] - 1
    if n_tgt == 0 or n_src == 0:
        return []
    best = matrix[:n_tgt, :n_src].argmax(axis=1)
    return sorted((int(i), j) for j, i in enumerate(best))


def format_alignment(links: Sequence[tuple[int, int]]) -> str:
    """Moses' ``i-j`` format."""
    return " ".join(f"{i}-{j}" for i, j in links)


def plot_alignment(path: str, matrix: np.ndarray, src_words, tgt_words) -> None:
    """A heat map of ``matrix`` (rows: target words + EOS; columns: source words + EOS)."""
    xs = list(src_words) + [EOS_TOKEN]
    ys = list(tgt_words) + [EOS_TOKEN]
    width = min(4.0 + 0.35 * len(xs), 40.0)
    height = min(3.0 + 0.35 * len(ys), 40.0)
    fig, ax = new_figure(width, height)
    ax.imshow(matrix, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels(xs, rotation=90)
    ax.set_yticks(range(len(ys)))
    ax.set_yticklabels(ys)
    ax.xaxis.tick_top()
    ax.set_xlabel("source")
    ax.xaxis.set_label_position("top")
    ax.set_ylabel("target")
    fig.tight_layout()
    save_figure(fig, path, dpi=80)


def _pairs(src_path: str, tgt_path: str) -> Iterator[tuple[str, str]]:
    for lineno, (src, tgt) in enumerate(zip_longest(iter_lines(src_path), iter_lines(tgt_path)), 1):
        if src is None or tgt is None:
            shorter = src_path if src is None else tgt_path
            raise InputError(f"ends at line {lineno - 1}, before the other file", shorter)
        yield src, tgt


def _blocks(pairs: Iterator[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    block: list[tuple[str, str]] = []
    for pair in pairs:
        block.append(pair)
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


@torch.inference_mode()
def align_block(model: TrainedModel, block: list[tuple[str, str]], device):
    """(source words, target words, word-level α) of each pair of ``block``."""
    network = model.network
    src_words = [model.src_text(s) for s, _ in block]
    tgt_words = [model.tgt_text(t) for _, t in block]
    src = [word_pieces(model.src_vocab, w) for w in src_words]
    tgt = [word_pieces(model.tgt_vocab, w) for w in tgt_words]
    src_ids = torch.from_numpy(pad_ids([ids for ids, _ in src], last=EOS_ID)).to(device)
    src_len = torch.tensor([len(ids) + 1 for ids, _ in src], device=device)
    tgt_in = torch.from_numpy(pad_ids([ids for ids, _ in tgt], first=BOS_ID)).to(device)
    alpha = network.attention_weights(network.encode(src_ids, src_len), tgt_in).float().cpu()
    out = []
    for b in range(len(block)):
        n_s, n_t = len(src[b][0]) + 1, len(tgt[b][0]) + 1
        pieces = alpha[b, :n_t, :n_s].numpy().astype(np.float64)
        matrix = word_matrix(pieces, src[b][1], tgt[b][1], len(src_words[b]), len(tgt_words[b]))
        out.append((src_words[b], tgt_words[b], matrix))
    return out


def align_files(
    src_path: str,
    tgt_path: str,
    model_path: str | None = None,
    output: str = "-",
    plot_dir: str | None = None,
    device: str = "cpu",
    batch_size: int = 32,
    model: TrainedModel | None = None,
) -> AlignResult:
    """Write the hard alignment of every pair to ``output`` (and PNGs to ``plot_dir``)."""
    inputs = {"source": src_path, "target": tgt_path, "model": model_path}
    refuse_outputs_onto_inputs(inputs, {"-o": output})
    check_output_path(output)
    check_work_folder(plot_dir, inputs, "--plot")  # its NNNNNN.png would replace an input
    dev = resolve_device(device)
    model = model_for(model, model_path, dev)
    arch = model.config.arch
    if arch != "attention" or not hasattr(model.network, "attention_weights"):
        raise InputError(
            f"align needs an attention model (train --arch attention); this is a {arch!r} model",
            model_path,
        )
    if model.config.reverse_target:
        raise InputError(
            "align needs a left-to-right model; this one predicts the target right to left "
            "(train --reverse-target)",
            model_path,
        )
    check_files_exist([src_path, tgt_path])
    if src_path == "-" and tgt_path == "-":
        raise InputError("the source and the target cannot both be standard input")
    if plot_dir is not None:
        os.makedirs(plot_dir, exist_ok=True)
    started = time.monotonic()
    pairs = plots = 0
    with AtomicOutput(output) as out:
        for block in _blocks(_pairs(src_path, tgt_path), batch_size):
            for src_words, tgt_words, matrix in align_block(model, block, dev):
                pairs += 1
                out.write(format_alignment(hard_alignment(matrix)) + "\n")
                if plot_dir is not None:
                    png = os.path.join(plot_dir, f"{pairs:06d}.png")
                    plot_alignment(png, matrix, src_words, tgt_words)
                    plots += 1
    seconds = time.monotonic() - started
    log.debug(
        "aligned %d pairs in %.1f s (%d plots), model %s", pairs, seconds, plots, model.signature
    )
    return AlignResult(pairs, seconds, plots, "<stdout>" if output == "-" else output, plot_dir)
