"""Scoring the targets of one source by their shared prefixes: a trie per group of sources.

The decoder's state after y_<t and the term log p(y_t | y_<t, x) depend on the source x and
the prefix y_<t alone (Cho et al. 2014, eq. 4: p(y | x) = Π_t p(y_t | y_<t, x)). The hypotheses
of an n-best list share one source and mostly begin alike (a right-to-left model reads them
reversed, so there they share endings): on Multi30k's 100-best lists about half of the target
positions repeat a prefix another hypothesis of the same sentence has already. The pair plan
(:mod:`phrasescore.engine.scoring`) computes every position of every pair; this plan computes
each distinct (source, prefix, next word) once.

For a block of pairs (ids as :class:`~phrasescore.engine.batching.IdPairs`, each distinct
source encoded once by the engine) it

1. groups the pairs by source, each group within the engine's token budget (its pairs' target
   positions, EOS included, plus their source positions where the decoder attends to them: what
   a batch of the pair plan holds);
2. builds each group's trie level by level with numpy (:func:`build_trie`): the nodes of depth d
   are the distinct (node of depth d - 1, word d) of its pairs, EOS last; a node whose word is
   EOS is a leaf;
3. runs the decoder one level at a time with the architecture's own step
   (:meth:`~phrasescore.model.base.EncoderDecoder.step`, what beam search runs): a level's
   rows are its open nodes' states, each gathered from its parent's; every node's term is
   log p(word | its parent's features), the output layer's kernels as in the pair plan
   (:meth:`~phrasescore.model.base.EncoderDecoder.gold_logprobs`);
4. sums each pair's terms along its path in float64, in the order of its words.

The values are those of the pair plan computed over other batch shapes: equal within the
engine's tolerance (< 1e-4 in log p, tests/test_prefix_scoring.py). The plan depends only on
the pairs and the budget, so the same input gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from phrasescore.engine.batching import IdPairs
from phrasescore.model.base import EncoderDecoder, EncoderOutput, select_rows
from phrasescore.special_ids import BOS_ID, EOS_ID


@dataclass
class TrieLevel:
    """The nodes of one depth of a trie: node ``k``'s ``parent`` (its row among the previous
    level's open nodes; at depth 0, its source's row in the group) and ``word``; ``open`` the
    nodes whose word is not EOS (in node order): the rows of this level's decoder step."""

    parent: np.ndarray
    word: np.ndarray
    open: np.ndarray


@dataclass
class PrefixTrie:
    """The trie of a group of pairs: ``levels`` by depth, and ``paths`` [pairs, depth] the
    pair's node at each depth as an index into all the levels' nodes laid end to end (-1 past
    its EOS)."""

    levels: list[TrieLevel]
    paths: np.ndarray

    @property
    def nodes(self) -> int:
        """Distinct (source, prefix, word): the output layer's rows."""
        return sum(len(level.word) for level in self.levels)


def build_trie(roots: np.ndarray, pairs: IdPairs, index: np.ndarray) -> PrefixTrie:
    """The trie of the pairs ``index`` of ``pairs``, whose sources are the rows ``roots``
    (one per pair, 0 .. sources - 1): each target read in its order, then EOS."""
    starts = pairs.tgt_offsets[index]
    lengths = pairs.tgt_offsets[index + 1] - starts + 1  # the group's alone, with EOS
    depth = int(lengths.max(initial=0))
    paths = np.full((len(index), depth), -1, dtype=np.int64)
    levels: list[TrieLevel] = []
    parent_rows = roots.astype(np.int64)  # each live pair's parent row (depth 0: its source)
    live = np.arange(len(index))
    base = 0
    for d in range(depth):
        at = lengths[live] > d
        live, parent_rows = live[at], parent_rows[at]
        inside = d < lengths[live] - 1
        word = np.full(len(live), EOS_ID, dtype=np.int64)
        word[inside] = pairs.tgt_ids[starts[live[inside]] + d]
        keys, node = np.unique(parent_rows * (int(word.max()) + 1) + word, return_inverse=True)
        node = node.reshape(-1)
        node_word = np.empty(len(keys), dtype=np.int64)
        node_parent = np.empty(len(keys), dtype=np.int64)
        node_word[node] = word
        node_parent[node] = parent_rows
        open_nodes = np.flatnonzero(node_word != EOS_ID)
        levels.append(TrieLevel(node_parent, node_word, open_nodes))
        paths[live, d] = base + node
        base += len(keys)
        row_of = np.full(len(keys), -1, dtype=np.int64)
        row_of[open_nodes] = np.arange(len(open_nodes))
        parent_rows = row_of[node]  # -1 for a pair that ended here (dropped next level)
    return PrefixTrie(levels, paths)


def source_groups(pair_source: np.ndarray, cost: np.ndarray, budget: int) -> Iterator[np.ndarray]:
    """The pairs grouped by source (in order of the sources' first pair), each group's ``cost``
    within ``budget``: whole sources while they fit; a source whose pairs alone exceed it is cut
    into groups of its own, in list order."""
    order = np.argsort(pair_source, kind="stable")
    costs = cost[order].tolist()
    cut = np.flatnonzero(np.diff(pair_source[order])) + 1
    bounds = [0, *cut.tolist(), len(order)]
    start, held = 0, 0
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        whole = sum(costs[lo:hi])
        units = [(lo, whole)] if whole <= budget else [(i, costs[i]) for i in range(lo, hi)]
        if whole > budget and held:  # a cut source starts a group of its own
            yield order[start:lo]
            start, held = lo, 0
        for a, c in units:
            if held and held + c > budget:
                yield order[start:a]
                start, held = a, 0
            held += c
        if whole > budget:  # and ends it
            yield order[start:hi]
            start, held = hi, 0
    if start < len(order):
        yield order[start:]


@torch.inference_mode()
def trie_logprobs(
    network: EncoderDecoder,
    enc: EncoderOutput,
    trie: PrefixTrie,
    to_device,
    chunk_rows: int | None,
    self_normalized: bool,
) -> torch.Tensor:
    """Every node's log p(word | prefix, x) [nodes] float32, the levels end to end: ``enc`` the
    group's source encodings (one row per root, source terms included), ``to_device`` the
    engine's host-to-device copy."""
    device = next(iter(enc.values())).device
    state = network.start(enc)
    rows = len(next(iter(enc.values())))
    bos = torch.full((rows,), BOS_ID, dtype=torch.long, device=device)
    features, state = network.step(state, bos)
    values = []
    for level in trie.levels:
        parent = to_device(level.parent)
        word = to_device(level.word)
        values.append(
            network.gold_logprobs(
                features.index_select(0, parent), word, chunk_rows, self_normalized
            )
        )
        if not len(level.open):
            break
        opened = to_device(level.open)
        state = select_rows(state, parent.index_select(0, opened))
        features, state = network.step(state, word.index_select(0, opened))
    return torch.cat(values)


def path_sums(
    values: np.ndarray, paths: np.ndarray, include_eos: bool, per_token: bool
) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """Each pair's Σ_t log p(y_t | y_<t, x) in float64 along its path (without the EOS term
    unless ``include_eos``), and with ``per_token`` its terms [length + 1] (EOS last)."""
    lengths = (paths >= 0).sum(axis=1)
    terms = np.where(paths >= 0, values[np.maximum(paths, 0)], 0.0)
    sums = terms.sum(axis=1)
    if not include_eos:
        sums -= terms[np.arange(len(paths)), lengths - 1]
    if not per_token:
        return sums, None
    return sums, [terms[i, : lengths[i]] for i in range(len(paths))]
