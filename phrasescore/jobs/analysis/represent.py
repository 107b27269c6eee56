"""``phrasescore represent``: the encoder's phrase representations and the word embeddings.

Cho et al. (2014, §4.3, Fig. 4-5) show what the RNN Encoder-Decoder learnt by drawing its
representations in two dimensions: word embeddings (Fig. 4) and the fixed-length summary vector c
of phrases (Fig. 5), where phrases of similar meaning and syntax lie together. This module
computes the same quantities for a trained model:

* **Phrase vectors**: :meth:`~phrasescore.model.base.EncoderDecoder.summary_vector` of each phrase
  read as a source by the model's encoder. For the Cho architecture that is ``c = tanh(V h_T)``
  (Cho et al. 2014, appendix A; ``model/encdec.py``), the vector the decoder is conditioned on,
  of ``hidden_dim`` entries. The encoder reads the model's *source* language: phrases are
  encoded with the end-of-sequence symbol appended, exactly as in training and scoring.
* **Word vectors** (``words``): rows of the source and target embedding matrices for the N most
  frequent words of each vocabulary (word vocabularies are in frequency order).

Every matrix is written as ``PREFIX.npy`` (float32, one row per item) plus ``PREFIX.tsv`` (one
label per line, no header): the layout the TensorBoard projector (projector.tensorflow.org)
loads as "vectors" and "metadata" (after ``numpy.savetxt(PREFIX.vectors.tsv, ..., delimiter='\\t')``
if it wants text vectors). Word matrices go to ``PREFIX.src-words.*`` and ``PREFIX.tgt-words.*``.

Phrases come from a file (one per line, ``-`` for standard input) or from a Moses phrase table:
the ``limit`` most frequent phrases of one side, by the table's counts field
``count(target) count(source) count(pair)`` (docs/moses.md "The Moses files phrasescore reads";
e.g. a line with φ(e|f) = 0.5 and counts ``1 2 1`` has count(source) = 2 = count(pair) /
φ(e|f)). Each distinct phrase is
encoded once, so a phrase given twice gets the identical vector twice.

Maps (``map_path``, ``word_map_path``): t-SNE (van der Maaten & Hinton 2008; cosine distances)
from scikit-learn when it is installed (``pip install 'phrasescore[analysis]'``), as Cho et al.
used; otherwise PCA by SVD, with a logged message. A readable subset of points is labelled: in
priority order (most frequent first), a label is drawn only where it overlaps no earlier label.

Neighbours (``neighbours``): the K nearest phrases of each query phrase by cosine similarity;
the phrase itself is always first (similarity 1).
"""

from __future__ import annotations

import html
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from phrasescore.bundle import TrainedModel
from phrasescore.errors import InputError
from phrasescore.figures import new_figure, save_figure
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.kinds import display_name
from phrasescore.files.outputs import AtomicOutput, check_output_path
from phrasescore.files.reading import iter_lines
from phrasescore.hardware import resolve_device
from phrasescore.jobs.common import model_for
from phrasescore.text.vocab import EOS_ID, SPECIAL_TOKENS

log = logging.getLogger(__name__)

SIDES = ("source", "target")


@dataclass
class RepresentOptions:
    """Flags of ``phrasescore represent``."""

    phrase_table: str | None = None
    side: str = "source"
    limit: int = 1000
    min_words: int = 1
    """Only table phrases of at least this many words."""
    words: int = 0
    """Also write the embeddings of the N most frequent words of each side (0: none)."""
    map_path: str | None = None
    word_map_path: str | None = None
    neighbours: int = 0
    queries: list[str] = field(default_factory=list)
    """Phrases to list neighbours for (default: every phrase); added to the set if missing."""
    labels: int = 150
    """At most this many labels on a map."""
    method: str = "auto"
    """auto (t-SNE if scikit-learn is installed, else PCA), tsne or pca."""
    batch_size: int = 256
    seed: int = 1


@dataclass
class Neighbour:
    phrase: str
    similarity: float


@dataclass
class RepresentResult:
    phrases: list[str]
    vectors: np.ndarray
    files: list[str]
    neighbours: list[tuple[str, list[Neighbour]]]
    method: str | None = None
    """How the maps were made (t-SNE or PCA), None without a map."""

    def lines(self) -> list[str]:
        """With ``--neighbours``: query, rank, cosine, phrase per neighbour (tab-separated)."""
        return [
            f"{query}\t{rank}\t{neighbour.similarity:.4f}\t{neighbour.phrase}"
            for query, found in self.neighbours
            for rank, neighbour in enumerate(found)
        ]


# ---------------------------------------------------------------------------- phrases
def read_phrase_file(path: str) -> list[str]:
    """The non-empty lines of ``path`` (``-``: standard input), spaces around them stripped."""
    phrases = [line.strip() for line in iter_lines(path) if line.strip()]
    if not phrases:
        raise InputError("no phrases (the file has no non-empty line)", display_name(path))
    return phrases


def frequent_table_phrases(
    table: str, side: str, limit: int, min_words: int = 1
) -> list[tuple[str, float]]:
    """The ``limit`` most frequent phrases of one side of a Moses table (of ``min_words`` words
    or more), with their counts.

    count(target) is the 1st count, count(source) the 2nd
    (docs/moses.md "The Moses files phrasescore reads"). A table without a counts
    field ranks phrases by the number of lines they occur on, with a warning. Ties are broken
    by the phrase (code-point order), so the result is deterministic.
    """
    from phrasescore.moses.phrase_table import read_phrase_table

    if side not in SIDES:
        raise InputError(f"--side must be source or target, not {side!r}")
    if limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
    index = 1 if side == "source" else 0
    counts: dict[str, float] = {}
    missing = 0
    for entry in read_phrase_table(table, validate=False):
        phrase = entry.source if side == "source" else entry.target
        if min_words > 1 and len(phrase.split()) < min_words:
            continue
        values = entry.counts()
        if values is None:
            missing += 1
            counts[phrase] = counts.get(phrase, 0.0) + 1.0
        else:
            counts[phrase] = max(counts.get(phrase, 0.0), values[index])
    if missing:
        log.warning(
            "%s: %d lines have no counts field: those phrases are ranked by the number of "
            "lines they occur on",
            display_name(table),
            missing,
        )
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]
    log.info(
        "%s: %d distinct %s phrases, the %d most frequent kept",
        display_name(table),
        len(counts),
        side,
        len(ranked),
    )
    return ranked


# ---------------------------------------------------------------------------- vectors
@torch.inference_mode()
def phrase_vectors(
    model: TrainedModel,
    token_lists: Sequence[list[str]],
    device: torch.device | str = "cpu",
    batch_size: int = 256,
) -> np.ndarray:
    """The summary vector of each token list [N, D] float32; each distinct phrase encoded once,
    in batches of phrases of equal length (no padding)."""
    network = model.network.to(device).eval()
    ids = model.src_vocab.encode_batch(list(token_lists))
    index: dict[tuple[int, ...], int] = {}
    row_of = np.fromiter(
        (index.setdefault(tuple(i), len(index)) for i in ids), dtype=np.int64, count=len(ids)
    )
    distinct = list(index)
    if not distinct:
        return np.zeros((0, 0), dtype=np.float32)
    by_length: dict[int, list[int]] = {}
    for k, seq in enumerate(distinct):
        by_length.setdefault(len(seq), []).append(k)
    vectors: np.ndarray | None = None
    for length in sorted(by_length):
        members = by_length[length]
        for begin in range(0, len(members), batch_size):
            rows = members[begin : begin + batch_size]
            src = torch.full((len(rows), length + 1), EOS_ID, dtype=torch.long)
            if length:
                src[:, :length] = torch.tensor([distinct[r] for r in rows], dtype=torch.long)
            lengths = torch.full((len(rows),), length + 1, dtype=torch.long)
            enc = network.encode(src.to(device), lengths.to(device))
            c = network.summary_vector(enc).float().cpu().numpy()
            if vectors is None:
                vectors = np.zeros((len(distinct), c.shape[1]), dtype=np.float32)
            vectors[rows] = c
    assert vectors is not None
    return vectors[row_of]


def word_embeddings(model: TrainedModel, side: str, n: int) -> tuple[np.ndarray, list[str]]:
    """Rows of the ``side`` embedding matrix for the first ``n`` words of its vocabulary (the
    most frequent for word vocabularies), with the words."""
    name = "src_embed" if side == "source" else "tgt_embed"
    embedding = getattr(model.network, name, None)
    if not isinstance(embedding, torch.nn.Embedding):
        raise InputError(f"the {model.config.arch} architecture has no {side} embedding matrix")
    vocab = model.src_vocab if side == "source" else model.tgt_vocab
    first = len(SPECIAL_TOKENS)
    last = min(len(vocab), first + n)
    if hasattr(vocab, "words"):
        labels = list(vocab.words[: last - first])
    else:
        labels = list(vocab.pieces[first:last])
    matrix = embedding.weight[first:last].detach().float().cpu().numpy()
    return matrix.astype(np.float32), labels


# ---------------------------------------------------------------------------- files
def _tsv_label(text: str) -> str:
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def write_projector_files(prefix: str, matrix: np.ndarray, labels: Sequence[str]) -> list[str]:
    """``prefix.npy`` (float32 rows) and ``prefix.tsv`` (one label per line); both atomic."""
    if len(matrix) != len(labels):
        raise ValueError("one label per row is needed")
    directory = os.path.dirname(os.path.abspath(prefix))
    os.makedirs(directory, exist_ok=True)
    npy = prefix + ".npy"
    tmp = npy + ".tmp.npy"
    np.save(tmp, np.ascontiguousarray(matrix, dtype=np.float32))
    os.replace(tmp, npy)
    tsv = prefix + ".tsv"
    with AtomicOutput(tsv, compress=False) as out:
        out.writelines(_tsv_label(label) + "\n" for label in labels)
    return [npy, tsv]


# ---------------------------------------------------------------------------- neighbours
def normalize_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


def nearest_neighbours(matrix: np.ndarray, query_rows: Sequence[int], k: int) -> list[list[int]]:
    """For each query row, the ``k`` rows of highest cosine similarity, the query row first
    (then by decreasing similarity, ties by row number)."""
    unit = normalize_rows(matrix.astype(np.float64))
    result = []
    for q in query_rows:
        sims = unit @ unit[q]
        sims[q] = np.inf  # the phrase itself first, whatever rounding gives
        order = np.lexsort((np.arange(len(sims)), -sims))
        result.append([int(i) for i in order[:k]])
    return result


# ---------------------------------------------------------------------------- maps
def sklearn_available() -> bool:
    try:
        import sklearn.manifold  # noqa: F401
    except ImportError:
        return False
    return True


def pca_2d(matrix: np.ndarray) -> np.ndarray:
    """The first two principal components (numpy SVD), zero-padded for 1-D data."""
    centred = matrix.astype(np.float64) - matrix.mean(axis=0, keepdims=True)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    coords = u[:, :2] * s[:2]
    if coords.shape[1] < 2:
        coords = np.hstack([coords, np.zeros((len(coords), 2 - coords.shape[1]))])
    return coords


def project_2d(matrix: np.ndarray, method: str = "auto", seed: int = 1) -> tuple[np.ndarray, str]:
    """2-D coordinates of the rows and the name of the method used (``t-SNE`` or ``PCA``)."""
    if method not in ("auto", "tsne", "pca"):
        raise InputError(f"unknown map method {method!r} (auto, tsne or pca)")
    if method == "tsne" and not sklearn_available():
        raise InputError(
            "t-SNE needs scikit-learn: pip install 'phrasescore[analysis]' (or scikit-learn)"
        )
    if method == "auto" and not sklearn_available():
        log.warning(
            "scikit-learn is not installed: drawing the map with PCA instead of t-SNE "
            "(pip install 'phrasescore[analysis]' for t-SNE)"
        )
        method = "pca"
    if method == "pca" or len(matrix) < 5:
        return pca_2d(matrix), "PCA"
    from sklearn.manifold import TSNE

    perplexity = float(min(30.0, (len(matrix) - 1) / 3.0))
    tsne = TSNE(
        n_components=2,
        perplexity=perplexity,
        metric="cosine",
        init="pca",
        random_state=seed,
    )
    return tsne.fit_transform(matrix.astype(np.float32)).astype(np.float64), "t-SNE"


def readable_subset(
    coords: np.ndarray, labels: Sequence[str], max_labels: int, columns: int = 60, rows: int = 80
) -> list[int]:
    """Indices of points to label: in order of ``labels`` (priority), a label is kept when the
    grid cells its text would cover are free. The grid approximates a 12-inch map with 7-point
    text (about 3.5 characters per column, one line per row)."""
    if len(coords) == 0 or max_labels <= 0:
        return []
    low = coords.min(axis=0)
    span = np.maximum(coords.max(axis=0) - low, 1e-12)
    unit = (coords - low) / span
    taken = np.zeros((rows, columns), dtype=bool)
    chosen: list[int] = []
    for i, label in enumerate(labels):
        col = min(int(unit[i, 0] * (columns - 1)), columns - 1)
        row = min(int(unit[i, 1] * (rows - 1)), rows - 1)
        # the text starts at the point and rises above it: its cells, one column of margin
        width = max(1, math.ceil(len(label) / 3.5)) + 1
        cells = taken[row : row + 2, col : col + width]
        if cells.any() or col + width > columns + 4:
            continue
        taken[row : row + 2, col : col + width] = True
        chosen.append(i)
        if len(chosen) >= max_labels:
            break
    return chosen


def draw_map(
    path: str, coords: np.ndarray, labels: Sequence[str], title: str, max_labels: int = 150
) -> int:
    """A labelled scatter of 2-D ``coords`` (as Cho et al. Fig. 4-5); returns labels drawn."""
    fig, ax = new_figure(12, 12)
    ax.scatter(coords[:, 0], coords[:, 1], s=4, c="tab:blue", alpha=0.35, linewidths=0)
    shown = readable_subset(coords, labels, max_labels)
    for i in shown:
        ax.annotate(
            html.unescape(labels[i]),  # Moses escapes (&apos; &amp; ...) read as characters
            (coords[i, 0], coords[i, 1]),
            fontsize=7,
            xytext=(2, 1),
            textcoords="offset points",
        )
    ax.set_title(f"{title} ({len(shown)} of {len(labels)} labelled)")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    save_figure(fig, path)
    return len(shown)


# ---------------------------------------------------------------------------- the job
def represent(
    phrases_path: str | None,
    model_path: str,
    output_prefix: str,
    options: RepresentOptions | None = None,
    device: str = "cpu",
    model: TrainedModel | None = None,
) -> RepresentResult:
    """``phrasescore represent`` (see the module docstring)."""
    options = options or RepresentOptions()
    if phrases_path and options.phrase_table:
        raise InputError("give either PHRASES or --phrase-table, not both")
    if not phrases_path and not options.phrase_table and not options.words:
        raise InputError("give PHRASES (a file, - for stdin), --phrase-table TABLE or --words N")
    if options.neighbours < 0 or options.words < 0:
        raise InputError("--neighbours and --words must not be negative")
    refuse_outputs_onto_inputs(
        {"phrase file": phrases_path, "model": model_path, "--phrase-table": options.phrase_table},
        {
            **{
                f"-o's {suffix}": output_prefix + suffix
                for suffix in (
                    ".npy",
                    ".tsv",
                    *(f".{t}-words.{e}" for t in ("src", "tgt") for e in ("npy", "tsv")),
                )
            },
            "--map": options.map_path,
            "--word-map": options.word_map_path,
        },
    )
    check_output_path(output_prefix + ".npy", "output", create_dirs=True)
    check_output_path(options.map_path, "--map", create_dirs=True)
    check_output_path(options.word_map_path, "--word-map", create_dirs=True)
    dev = resolve_device(device)
    model = model_for(model, model_path, dev)
    log.info(
        "phrase vectors: the summary vector of the %s encoder (%s), %d dimensions",
        model.config.arch,
        "c = tanh(V h_T)" if model.config.arch == "cho" else "summary_vector",
        model.config.hidden_dim,
    )
    files: list[str] = []
    method = None
    phrases, token_lists = _choose_phrases(phrases_path, model, options)
    vectors = np.zeros((0, model.config.hidden_dim), dtype=np.float32)
    neighbours: list[tuple[str, list[Neighbour]]] = []
    if phrases:
        vectors = phrase_vectors(model, token_lists, dev, options.batch_size)
        files += write_projector_files(output_prefix, vectors, phrases)
        if options.neighbours:
            neighbours = _neighbours(phrases, vectors, options)
        if options.map_path:
            coords, method = project_2d(vectors, options.method, options.seed)
            draw_map(
                options.map_path,
                coords,
                phrases,
                f"Phrase representations c ({method}, {model.config.arch} encoder)",
                options.labels,
            )
            files.append(options.map_path)
    if options.words:
        word_files, word_method = _write_word_vectors(model, output_prefix, options)
        files += word_files
        method = word_method or method
    elif options.word_map_path:
        raise InputError("--word-map needs --words N")
    log.info("wrote %s", ", ".join(files))
    return RepresentResult(phrases, vectors, files, neighbours, method)


def _choose_phrases(phrases_path: str | None, model: TrainedModel, options: RepresentOptions):
    """(phrases, their token lists): of the table, the file or the queries."""
    text = model.src_text
    if options.phrase_table:
        if options.side == "target":
            log.warning(
                "--side target: the target phrases are read by the model's encoder, which "
                "reads the model's source language (%s); this is meaningful for a model "
                "trained in the table's reverse direction",
                model.src_text.lang,
            )
        ranked = frequent_table_phrases(
            options.phrase_table, options.side, options.limit, options.min_words
        )
        phrases = [phrase for phrase, _ in ranked]
        token_lists = [text.normalize_tokenized(p) for p in phrases]
    elif phrases_path:
        phrases = read_phrase_file(phrases_path)
        token_lists = [text(p) for p in phrases]
    else:
        phrases, token_lists = [], []
    for query in options.queries:
        if query not in phrases:
            phrases.append(query)
            token_lists.append(text(query))
    for phrase, tokens in zip(phrases, token_lists, strict=True):
        if not tokens:
            raise InputError(f"phrase {phrase!r} has no tokens")
    return phrases, token_lists


def _neighbours(phrases: list[str], vectors: np.ndarray, options: RepresentOptions):
    """(query, its nearest neighbours) of each query (every distinct phrase by default)."""
    first_row: dict[str, int] = {}
    for row, phrase in enumerate(phrases):
        first_row.setdefault(phrase, row)
    distinct = list(first_row.values())  # a phrase given twice is listed once
    queries = options.queries or list(first_row)
    rows = [distinct.index(first_row[q]) for q in dict.fromkeys(queries)]
    matrix = vectors[distinct]
    unit = normalize_rows(matrix.astype(np.float64))
    return [
        (
            phrases[distinct[q]],
            [Neighbour(phrases[distinct[i]], float(unit[i] @ unit[q])) for i in found],
        )
        for q, found in zip(rows, nearest_neighbours(matrix, rows, options.neighbours), strict=True)
    ]


def _write_word_vectors(model: TrainedModel, output_prefix: str, options: RepresentOptions):
    """The word embeddings of both sides (and the source words' map): (files, map method)."""
    files: list[str] = []
    method = None
    for side, tag in (("source", "src"), ("target", "tgt")):
        matrix, words = word_embeddings(model, side, options.words)
        files += write_projector_files(f"{output_prefix}.{tag}-words", matrix, words)
        if side == "source" and options.word_map_path:
            coords, method = project_2d(matrix, options.method, options.seed)
            draw_map(
                options.word_map_path,
                coords,
                words,
                f"Source word embeddings ({method}, {len(words)} most frequent words)",
                options.labels,
            )
            files.append(options.word_map_path)
    return files, method
