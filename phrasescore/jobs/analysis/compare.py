"""``phrasescore compare``: the model's scores beside the phrase table's (Cho et al. 2014, §4.2).

Three analyses of the paper, for any model and table:

* **Top targets** (Table 2): for chosen source phrases, the ``top`` target phrases of the table
  ranked by the table's direct phrase probability φ(e|f) (the 3rd score: docs/moses.md "The
  Moses files phrasescore reads"; the model scores p(target | source), so this is the column to
  compare it with; ``column`` picks another) and ranked by the model's log p(target | source),
  side by side. Sources are given (``sources_path``) or sampled from the table: ``sample``
  sources with at least ``min_targets`` targets and ``min_words`` words, drawn uniformly
  (reservoir sampling, seeded).
* **Proposals** (Table 3): ``proposals`` ancestral samples of the model for each chosen source
  (:func:`phrasescore.engine.search.sample`), the ``top`` best distinct non-empty ones by log p, each
  marked as in the table or not.
* **Scatter and correlations** (Fig. 3): model log p against the table's log φ for the pairs
  of the table, or a uniform sample of ``max_pairs`` lines (reservoir sampling; default
  20,000); more than 5,000 pairs are drawn as a density (hexagonal bins, log colour scale)
  rather than as points. The Spearman rank correlation of log p with every score column, and
  with the target length, is reported: a correlation well below 1 shows that the new feature
  carries information the table's columns lack, which is what lets it add to them in the
  log-linear model.

The table is read once, as a stream.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from phrasescore.bundle import TrainedModel
from phrasescore.engine.protocol import build_scorer
from phrasescore.errors import InputError
from phrasescore.figures import new_figure, save_figure
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.kinds import display_name
from phrasescore.files.outputs import check_output_path
from phrasescore.hardware import resolve_device
from phrasescore.jobs.common import model_for
from phrasescore.moses.phrase_table import iter_source_groups, read_phrase_table

log = logging.getLogger(__name__)

COLUMN_NAMES_4 = ["φ(f|e)", "lex(f|e)", "φ(e|f)", "lex(e|f)"]
HEXBIN_ABOVE = 5000
"""A scatter of more pairs is drawn as a hexagonal density plot (log colour scale)."""


def column_names(n_scores: int) -> list[str]:
    """Names of the score columns of a table with ``n_scores`` scores
    (docs/moses.md "The Moses files phrasescore reads")."""
    names = [f"column {i + 1}" for i in range(n_scores)]
    if n_scores >= 4:
        names[:4] = COLUMN_NAMES_4
    if n_scores == 5:
        names[4] = "phrase penalty"
    return names


@dataclass
class CompareOptions:
    """Flags of ``phrasescore compare``."""

    sources_path: str | None = None
    sample: int = 10
    min_targets: int = 5
    min_words: int = 1
    top: int = 5
    column: int = 3
    """1-based score column to rank and plot against (3: φ(e|f))."""
    proposals: int = 0
    """Model samples drawn per source (0: no proposals)."""
    scatter_path: str | None = None
    max_pairs: int = 20_000
    """Pairs for the scatter plot and correlations: a uniform sample of the table's lines
    (0: every line)."""
    seed: int = 1
    batch_tokens: int = 8192


@dataclass
class Candidate:
    target: str
    table_score: float
    """The value of the compared column (a probability)."""
    logprob: float
    """The model's log p(target | source)."""


@dataclass
class Proposal:
    target: str
    logprob: float
    in_table: bool


@dataclass
class SourceComparison:
    source: str
    n_targets: int
    by_table: list[Candidate]
    by_model: list[Candidate]
    proposals: list[Proposal] = field(default_factory=list)


@dataclass
class Correlation:
    column: int
    name: str
    spearman: float
    """nan for a constant column."""


@dataclass
class CompareResult:
    column_name: str
    comparisons: list[SourceComparison]
    correlations: list[Correlation]
    pairs: int
    """Pairs behind the correlations and the scatter plot."""
    table_lines: int
    scatter_path: str | None = None
    length_spearman: float = float("nan")
    """Spearman's rho of log p with the target length in words (log p falls with length)."""

    def lines(self) -> list[str]:
        """The markdown report ``compare`` prints (:func:`format_comparison`)."""
        return format_comparison(self)


# ---------------------------------------------------------------------------- statistics
def rank_average(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their average rank (as Spearman's rho needs)."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    ranks = np.empty(len(values), dtype=np.float64)
    boundaries = np.flatnonzero(np.diff(sorted_values)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(values)]])
    for a, b in zip(starts, ends, strict=True):
        ranks[order[a:b]] = (a + b + 1) / 2.0
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (scipy's when installed, else ranks + Pearson in numpy);
    nan when either side is constant."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    try:
        from scipy.stats import spearmanr
    except ImportError:
        rx, ry = rank_average(x), rank_average(y)
        return float(np.corrcoef(rx, ry)[0, 1])
    return float(spearmanr(x, y).statistic)


# ---------------------------------------------------------------------------- reading
class _Reservoir:
    """A uniform sample of at most ``size`` items of a stream (Algorithm R), seeded;
    ``size`` 0 keeps every item."""

    def __init__(self, size: int, seed: int):
        self.size = size
        self.items: list = []
        self.seen = 0
        self.rng = np.random.default_rng(seed)

    def offer(self, item) -> None:
        self.seen += 1
        if self.size == 0 or len(self.items) < self.size:
            self.items.append(item)
            return
        j = int(self.rng.integers(0, self.seen))
        if j < self.size:
            self.items[j] = item


def _read_sources_file(path: str) -> list[str]:
    from phrasescore.files.reading import iter_lines

    sources = [" ".join(line.split()) for line in iter_lines(path) if line.strip()]
    if not sources:
        raise InputError("no source phrases in the file", display_name(path))
    return sources


def _scan_table(table: str, options: CompareOptions, wanted: list[str] | None):
    """One pass: the chosen source groups, a sample of pairs, the line and score counts."""
    groups: dict[str, list[tuple[str, list[float]]]] = {}
    chooser = _Reservoir(options.sample, options.seed)
    pairs = _Reservoir(options.max_pairs, options.seed + 1)
    wanted_set = set(wanted or [])
    lines = 0
    n_scores = 0
    for group in iter_source_groups(read_phrase_table(table)):
        rows = [(e.target, [float(s) for s in e.scores]) for e in group]
        n_scores = len(rows[0][1])
        lines += len(rows)
        source = group[0].source
        if wanted is not None:
            key = " ".join(source.split())
            if key in wanted_set:
                groups.setdefault(key, []).extend(rows)
        elif (
            options.sample
            and len(rows) >= options.min_targets
            and len(source.split()) >= options.min_words
        ):
            chooser.offer((source, rows))
        for target, scores in rows:
            pairs.offer((source, target, scores))
    if wanted is None:
        groups = dict(sorted(chooser.items))
    return groups, pairs.items, lines, n_scores


# ---------------------------------------------------------------------------- the job
def compare(
    table: str,
    model_path: str | None,
    options: CompareOptions | None = None,
    device: str = "cpu",
    model: TrainedModel | None = None,
) -> CompareResult:
    """``phrasescore compare`` (see the module docstring)."""
    options = options or CompareOptions()
    if options.top < 1 or options.sample < 0 or options.max_pairs < 0 or options.proposals < 0:
        raise InputError("--top must be >= 1; --sample, --max-pairs, --proposals >= 0")
    refuse_outputs_onto_inputs(
        {"phrase table": table, "model": model_path, "--sources": options.sources_path},
        {"--scatter": options.scatter_path},
    )
    check_output_path(options.scatter_path, "--scatter", create_dirs=True)
    dev = resolve_device(device)
    model = model_for(model, model_path, dev)
    wanted = _read_sources_file(options.sources_path) if options.sources_path else None
    groups, pair_sample, lines, n_scores = _scan_table(table, options, wanted)
    log.info("%s: %d lines; %d pairs kept for the correlations", table, lines, len(pair_sample))
    if lines == 0:
        raise InputError("the phrase table is empty", display_name(table))
    if not 1 <= options.column <= n_scores:
        raise InputError(f"--column must be between 1 and {n_scores} (the table's scores)")
    names = column_names(n_scores)
    column = options.column - 1
    scorer = build_scorer(model, device=dev, batch_tokens=options.batch_tokens)
    comparisons = [
        _compare_source(scorer, source, rows, column, options, dev)
        for source, rows in _ordered_groups(groups, wanted, options)
    ]
    correlations: list[Correlation] = []
    length_rho = float("nan")
    if pair_sample:
        logp = scorer.score_phrases([p[0] for p in pair_sample], [p[1] for p in pair_sample])
        logp = logp.logprob
        scores = np.array([p[2] for p in pair_sample], dtype=np.float64)
        for j in range(n_scores):
            correlations.append(Correlation(j + 1, names[j], spearman(logp, scores[:, j])))
        lengths = np.array([len(p[1].split()) for p in pair_sample], dtype=np.float64)
        length_rho = spearman(logp, lengths)
        if options.scatter_path:
            draw_scatter(
                options.scatter_path,
                np.log(scores[:, column]),
                logp,
                names[column],
                correlations[column].spearman,
                len(pair_sample) < lines,
            )
    return CompareResult(
        names[column],
        comparisons,
        correlations,
        len(pair_sample),
        lines,
        options.scatter_path,
        length_rho,
    )


def _ordered_groups(groups, wanted: list[str] | None, options: CompareOptions):
    """The (source, rows) to compare: the wanted sources in their order, or the sample."""
    if wanted is not None:
        missing = [s for s in wanted if s not in groups]
        if missing:
            log.warning("not in the table: %s", "; ".join(missing))
        return [(s, groups[s]) for s in wanted if s in groups]
    ordered = list(groups.items())
    if not ordered and options.sample:
        log.warning(
            "no source phrase has %d targets or more and %d words or more",
            options.min_targets,
            options.min_words,
        )
    return ordered


def _compare_source(scorer, source: str, rows, column: int, options: CompareOptions, device):
    """The table's and the model's top targets of one source (and the model's proposals)."""
    model = scorer.model
    logprob = scorer.score_phrases([source] * len(rows), [t for t, _ in rows]).logprob
    candidates = [
        Candidate(t, scores[column], float(lp))
        for (t, scores), lp in zip(rows, logprob, strict=True)
    ]
    by_table = sorted(candidates, key=lambda c: (-c.table_score, c.target))[: options.top]
    by_model = sorted(candidates, key=lambda c: (-c.logprob, c.target))[: options.top]
    comparison = SourceComparison(source, len(rows), by_table, by_model)
    if options.proposals:
        known = {" ".join(model.tgt_text.normalize_tokenized(t)) for t, _ in rows}
        comparison.proposals = propose(model, source, known, options, device)
    return comparison


def propose(
    model: TrainedModel, source: str, known: set[str], options: CompareOptions, device
) -> list[Proposal]:
    """The model's best distinct samples for ``source`` (Cho et al. Table 3), marked in-table."""
    from phrasescore.engine.search import sample

    ids = model.src_vocab.encode(model.src_text.normalize_tokenized(source))
    hyps = sample(
        model.network,
        ids,
        options.proposals,
        options.top,
        seed=options.seed,
        device=device,
    )
    out = []
    for hyp in hyps:
        text = " ".join(model.target_words(hyp.ids))
        if text:  # an empty sample (EOS first) is no phrase
            out.append(Proposal(text, hyp.logprob, text in known))
    return out


def draw_scatter(
    path: str, table_log: np.ndarray, model_log: np.ndarray, name: str, rho: float, sampled: bool
) -> None:
    """Model log p against the table's log score, one point per pair (Cho et al. Fig. 3)."""
    fig, ax = new_figure(7, 6)
    if len(model_log) > HEXBIN_ABOVE:  # too many points to see: their density instead
        cells = ax.hexbin(table_log, model_log, gridsize=60, bins="log", cmap="viridis", mincnt=1)
        fig.colorbar(cells, ax=ax, label="phrase pairs per cell")
    else:
        ax.scatter(table_log, model_log, s=4, alpha=0.3, linewidths=0, rasterized=True)
    ax.set_xlabel(f"log {name} (phrase table)")
    ax.set_ylabel("log p(target | source) (RNN Encoder-Decoder)")
    what = "a uniform sample of" if sampled else "all"
    ax.set_title(f"{what} {len(model_log)} phrase pairs; Spearman ρ = {rho:.3f}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


# ---------------------------------------------------------------------------- text output
def _cell(text: str) -> str:
    """Text for a markdown table cell (a ``|`` escaped with a backslash)."""
    return text.replace("|", "\\|")


def format_comparison(result: CompareResult) -> list[str]:
    """Markdown lines: per source, the top targets by the table and by the model side by side
    (and the model's proposals); then the rank correlations."""
    out: list[str] = []
    for comp in result.comparisons:
        out.append(f"### {comp.source}  ({comp.n_targets} targets in the table)")
        out.append("")
        name = _cell(result.column_name)
        out.append(f"| # | by table {name} | {name} | by model | log p |")
        out.append("|---|---|---|---|---|")
        for i in range(max(len(comp.by_table), len(comp.by_model))):
            t = comp.by_table[i] if i < len(comp.by_table) else None
            m = comp.by_model[i] if i < len(comp.by_model) else None
            out.append(
                f"| {i + 1} | {_cell(t.target) if t else ''} | "
                f"{f'{t.table_score:.3g}' if t else ''} | {_cell(m.target) if m else ''} | "
                f"{f'{m.logprob:.2f}' if m else ''} |"
            )
        if comp.proposals:
            out.append("")
            out.append("| model sample | log p | in table |")
            out.append("|---|---|---|")
            for p in comp.proposals:
                out.append(
                    f"| {_cell(p.target)} | {p.logprob:.2f} | {'yes' if p.in_table else 'no'} |"
                )
        out.append("")
    if result.correlations:
        out.append(
            f"Spearman rank correlation of the model's log p with each column "
            f"({result.pairs} of {result.table_lines} pairs):"
        )
        for c in result.correlations:
            value = "n/a (constant column)" if math.isnan(c.spearman) else f"{c.spearman:+.3f}"
            out.append(f"  column {c.column} {c.name}: {value}")
        if not math.isnan(result.length_spearman):
            out.append(f"  (target length in words: {result.length_spearman:+.3f})")
    return out
