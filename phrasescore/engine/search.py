"""Generating target text from a trained model: batched beam search and ancestral sampling.

Both are written once against the architecture interface of :mod:`phrasescore.model.base`
(``encode``, ``start``, ``step``, ``logits``): they never look inside a network, so every
architecture behind that interface gets them. The decoder state is a dict of tensors with the
batch first; reordering hypotheses is ``index_select`` on dim 0 of every tensor of it
(:func:`~phrasescore.model.base.select_rows`).

Beam search (Sutskever et al. 2014, §3.2: "a simple left-to-right beam search decoder which
maintains a small number B of partial hypotheses ... as soon as the <EOS> symbol is appended to a
hypothesis, it is removed from the beam and is added to the set of complete hypotheses"):

* Each source keeps ``beam`` partial hypotheses. At each step every one is extended by every
  word; of the ``2 * beam`` best extensions (by log p), those that end in EOS *and rank among the
  first ``beam``* are complete hypotheses, and the first ``beam`` others are the new partial
  hypotheses. A source is done when ``beam`` hypotheses are complete (the usual rule, as in
  fairseq), or earlier when ``nbest`` are complete and the best partial one, ended now, would not
  be among them (a bound that is exact without length normalisation, since log p only falls as
  words are added). At its length limit only EOS may be chosen, so every partial hypothesis is
  completed. With ``beam=1`` this is exactly greedy (argmax) decoding, whatever the length
  normalisation.
* Complete hypotheses are ranked by ``log p / lp(n)``, the length normalisation of Wu et al.
  (2016, GNMT): ``lp(n) = ((5 + n) / 6) ** alpha``, n the number of target tokens including EOS.
  ``alpha = 0`` ranks by log p itself; ``alpha = 1`` is close to the per-token average for long
  sentences. Without normalisation a model without attention prefers short outputs.
* log p of a hypothesis is the model's own: the softmax is over the whole target vocabulary and
  PAD, BOS (and UNK with ``forbid_unk``) are removed *after* it, so the score returned equals the
  teacher-forced log p(y | x) of :class:`phrasescore.engine.scoring.CpuScorer` (EOS included).
* ``beam`` may not exceed the number of tokens the search can emit (the target vocabulary less
  PAD and BOS, less UNK with ``forbid_unk``): a larger beam is an :class:`InputError`, not capped
  silently. ``nbest`` may not exceed ``beam``.

Sampling (Cho et al. 2014, §4.3 and Table 3, where samples of the RNN Encoder-Decoder are listed
for source phrases): ancestral sampling, each word drawn from p(y_t | y_<t, x), ``n`` samples per
source, with a :class:`torch.Generator` seeded with ``seed`` for every source (so a phrase's
samples depend only on the phrase, the model and the seed). Samples that reach the length limit
without EOS are dropped; the others are deduplicated and the ``top`` best by log p are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from phrasescore.errors import InputError
from phrasescore.model.base import EncoderDecoder, EncoderOutput, select_rows
from phrasescore.text.corpus import pad_ids
from phrasescore.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Hypothesis:
    """A complete target sequence for one source."""

    ids: tuple[int, ...]
    """Target token ids, EOS not included."""
    logprob: float
    """log p(y | x), the end-of-sequence symbol included."""
    score: float
    """The ranking score: ``logprob / lp(len(ids) + 1)`` (equal to ``logprob`` with alpha 0)."""


@dataclass
class SearchOptions:
    """How :func:`beam_search` searches (see the module docstring)."""

    beam: int = 5
    nbest: int = 1
    max_length: int | None = None
    """Most target tokens (EOS not counted); None: ``2 * source length + 10``."""
    length_penalty: float = 1.0
    """GNMT alpha; 0 ranks by log p."""
    forbid_unk: bool = False


def length_penalty(n_tokens: int, alpha: float) -> float:
    """GNMT's lp(n) = ((5 + n) / 6) ** alpha (Wu et al. 2016, §7)."""
    return ((5.0 + n_tokens) / 6.0) ** alpha


def default_max_length(src_len: int) -> int:
    """Length limit when none is given: twice the source plus 10 tokens."""
    return 2 * src_len + 10


def emittable_tokens(vocab_size: int, forbid_unk: bool) -> int:
    """How many different tokens a search can emit (EOS included)."""
    return vocab_size - 2 - (1 if forbid_unk else 0)


def check_beam(beam: int, nbest: int, vocab_size: int, forbid_unk: bool) -> None:
    """Refuse a beam the vocabulary cannot fill, or an n-best list longer than the beam."""
    if beam < 1:
        raise InputError(f"the beam must be at least 1, got {beam}")
    if nbest < 1:
        raise InputError(f"the n-best size must be at least 1, got {nbest}")
    if nbest > beam:
        raise InputError(f"--nbest {nbest} is larger than the beam ({beam}): use --beam {nbest}")
    limit = emittable_tokens(vocab_size, forbid_unk)
    if beam > limit:
        raise InputError(
            f"beam {beam} is larger than the target vocabulary: the model can emit only "
            f"{limit} different tokens"
        )


def _banned_tokens(forbid_unk: bool) -> list[int]:
    return [PAD_ID, BOS_ID] + ([UNK_ID] if forbid_unk else [])


def encode_sources(
    network: EncoderDecoder, src_ids: Sequence[Sequence[int]], device: torch.device
) -> EncoderOutput:
    """Encode id lists (EOS appended here), padded to the longest with their lengths given."""
    lengths = [len(ids) + 1 for ids in src_ids]
    src = torch.from_numpy(pad_ids(src_ids, last=EOS_ID)).to(device)
    return network.encode(src, torch.tensor(lengths, dtype=torch.long, device=device))


def _next_logprobs(network: EncoderDecoder, state: dict[str, Tensor], prev: Tensor):
    features, state = network.step(state, prev)
    return torch.log_softmax(network.logits(features).float(), dim=-1), state


class _Completed:
    """The complete hypotheses of every source, on the device, in the order they were completed:
    log p, tokens, length, count. A source completes at most 2 * beam - 1 (fewer than ``beam``
    before its last step, ``beam`` in it); slot 2 * beam takes the writes of candidates that
    are not complete, so a step stores without looking at which ones are."""

    def __init__(self, n_src: int, beam: int, longest: int, device: torch.device):
        self.beam, self.slots = beam, 2 * beam
        self.lp = torch.full((n_src, self.slots + 1), NEG_INF, device=device)
        self.tokens = torch.zeros((n_src, self.slots + 1, longest), dtype=torch.long, device=device)
        self.length = torch.zeros((n_src, self.slots + 1), dtype=torch.long, device=device)
        self.count = torch.zeros(n_src, dtype=torch.long, device=device)

    def add(self, active: Tensor, top_lp: Tensor, ended: Tensor, ended_beam: Tensor,
            tokens: Tensor, step: int) -> None:  # fmt: skip
        """Store the candidates ``ended`` (EOS among the first ``beam``, in rank order) of the
        ``active`` sources: their log p, and the tokens of the beam rows they end."""
        counts = self.count[active]
        slot = torch.where(ended, counts[:, None] + ended.long().cumsum(1) - 1, self.slots)
        rows = active[:, None].expand(-1, self.beam)
        self.lp[rows, slot] = torch.where(ended, top_lp, NEG_INF)
        self.length[rows, slot] = step
        if step:
            ended_tokens = tokens.gather(1, ended_beam[:, :, None].expand(-1, -1, step))
            self.tokens[rows, slot, :step] = ended_tokens
        self.count[active] = counts + ended.sum(1)

    def settled(self, active: Tensor, best_alive: Tensor, n: int, options) -> Tensor:
        """:func:`_settled_rows` of the ``active`` sources."""
        return _settled_rows(self.lp[active, : self.slots], self.length[active, : self.slots],
                             self.count[active], best_alive, n, options)  # fmt: skip

    def lists(self) -> list[list[tuple[tuple[int, ...], float]]]:
        """Per source, its complete hypotheses (tokens, log p) in the order they were completed."""
        counts, lps, lens = self.count.tolist(), self.lp.tolist(), self.length.tolist()
        all_tokens = self.tokens.tolist()
        return [
            [(tuple(all_tokens[b][k][: lens[b][k]]), lps[b][k]) for k in range(counts[b])]
            for b in range(len(counts))
        ]


def _next_beam(top_lp: Tensor, top_beam: Tensor, top_tok: Tensor, is_eos: Tensor,
               tokens: Tensor, beam: int, step: int):  # fmt: skip
    """The new partial hypotheses: the first ``beam`` finite candidates that are not EOS, as
    (their log p, the beam row each extends, its new token, the token lists)."""
    usable = ~is_eos & torch.isfinite(top_lp)
    order = torch.argsort((~usable).to(torch.int8), dim=1, stable=True)[:, :beam]
    new_lp = top_lp.gather(1, order).masked_fill(~usable.gather(1, order), NEG_INF)
    new_beam = top_beam.gather(1, order)
    new_tok = top_tok.gather(1, order).masked_fill(~usable.gather(1, order), EOS_ID)
    tokens = torch.cat([tokens.gather(1, new_beam.unsqueeze(2).expand(-1, -1, step)),
                        new_tok.unsqueeze(2)], dim=2)  # fmt: skip
    return new_lp, new_beam, new_tok, tokens


def _only_eos_at_limit(logp: Tensor, limits: Tensor, step: int, beam: int) -> Tensor:
    """``logp`` with every word but EOS masked in the rows at their length limit (a select over
    all rows, not a look at whether any row is there: no wait for the device)."""
    at_limit = (limits <= step).repeat_interleave(beam)
    only_eos = torch.full_like(logp, NEG_INF)
    only_eos[:, EOS_ID] = logp[:, EOS_ID]
    return torch.where(at_limit[:, None], only_eos, logp)


@torch.inference_mode()
def beam_search(
    network: EncoderDecoder,
    src_ids: Sequence[Sequence[int]],
    options: SearchOptions,
    device: str | torch.device = "cpu",
) -> list[list[Hypothesis]]:
    """The ``options.nbest`` best hypotheses of each source (a batch, searched together).

    ``src_ids``: source id lists without EOS. Returns, per source, hypotheses best first by
    :attr:`Hypothesis.score`.
    """
    device = torch.device(device)
    vocab = network.config.tgt_vocab_size
    check_beam(options.beam, options.nbest, vocab, options.forbid_unk)
    if not src_ids:
        return []
    n_src, beam = len(src_ids), options.beam
    limits = torch.tensor(
        [
            options.max_length if options.max_length is not None else default_max_length(len(s))
            for s in src_ids
        ],
        dtype=torch.long,
        device=device,
    )
    enc = encode_sources(network, src_ids, device)
    enc.update(network.source_terms(enc))  # once per source, not per beam row
    # beam rows per source: row b * beam + k
    rows = torch.arange(n_src, device=device).repeat_interleave(beam)
    state = network.start(select_rows(enc, rows))
    prev = torch.full((n_src * beam,), BOS_ID, dtype=torch.long, device=device)
    # at the start only the first row of each source is alive
    alive_lp = torch.full((n_src, beam), NEG_INF, device=device)
    alive_lp[:, 0] = 0.0
    tokens = torch.empty((n_src, beam, 0), dtype=torch.long, device=device)
    banned = _banned_tokens(options.forbid_unk)
    active = torch.arange(n_src, device=device)  # the sources still searched
    completed = _Completed(n_src, beam, int(limits.max()) + 1, device)
    step = 0
    while True:
        logp, state = _next_logprobs(network, state, prev)
        logp[:, banned] = NEG_INF
        logp = _only_eos_at_limit(logp, limits, step, beam)
        n_act = active.shape[0]
        cand = (alive_lp.unsqueeze(2) + logp.view(n_act, beam, vocab)).view(n_act, beam * vocab)
        top_lp, top_idx = cand.topk(min(2 * beam, beam * vocab), dim=1)
        top_beam, top_tok = top_idx // vocab, top_idx % vocab
        is_eos = (top_tok == EOS_ID) & torch.isfinite(top_lp)
        ended = is_eos[:, :beam]
        completed.add(active, top_lp[:, :beam], ended, top_beam[:, :beam], tokens, step)
        alive_lp, new_beam, prev, tokens = _next_beam(
            top_lp, top_beam, top_tok, is_eos, tokens, beam, step
        )
        source_rows = torch.arange(n_act, device=device).unsqueeze(1) * beam
        keep_rows = (source_rows + new_beam).view(-1)
        prev = prev.view(-1)
        # sources that are done leave the batch: at their limit, nothing alive, `beam`
        # complete, or settled (_settled, for all sources in one tensor expression)
        best_alive = alive_lp.max(dim=1).values
        done = (limits <= step) | ~torch.isfinite(best_alive) | (completed.count[active] >= beam)
        done |= completed.settled(active, best_alive, step + 2, options)
        stay_t = (~done).nonzero(as_tuple=True)[0]  # the step's one wait for the device
        if stay_t.shape[0] == 0:
            break
        if stay_t.shape[0] < n_act:
            active = active[stay_t]
            stay_rows = (stay_t.unsqueeze(1) * beam + torch.arange(beam, device=device)).view(-1)
            keep_rows = keep_rows[stay_rows]
            prev = prev[stay_rows]
            alive_lp, tokens, limits = alive_lp[stay_t], tokens[stay_t], limits[stay_t]
        state = select_rows(state, keep_rows)
        step += 1
    alpha = options.length_penalty
    return [_best(complete, options.nbest, alpha) for complete in completed.lists()]


def _settled_rows(
    fin_lp: Tensor, fin_len: Tensor, count: Tensor, best_alive: Tensor, n: int, options
) -> Tensor:
    """:func:`_settled` of every source at once: True where ``nbest`` hypotheses are complete
    and the best partial one, ended now (``n`` tokens), would not beat the ``nbest``-th best
    complete one (scores in float64, as :func:`_settled` computes them)."""
    alpha = options.length_penalty
    scores = fin_lp.double() / ((5.0 + (fin_len + 1).double()) / 6.0) ** alpha
    kth = scores.topk(options.nbest, dim=1).values[:, -1]
    return (count >= options.nbest) & (kth >= best_alive.double() / length_penalty(n, alpha))


def _settled(
    complete: list[tuple[tuple[int, ...], float]], alive_logprob: float, n: int, options
) -> bool:
    """True when no partial hypothesis can enter the n-best any more: ``nbest`` hypotheses are
    complete and the best partial one, ended now (``n`` tokens), would not beat the last of them.
    Exact for alpha = 0 (log p only falls as words are added); for alpha > 0 it assumes that a
    partial hypothesis does not gain by growing longer (as Hugging Face's beam search does)."""
    if len(complete) < options.nbest:
        return False
    alpha = options.length_penalty
    scores = sorted(
        (lp / length_penalty(len(ids) + 1, alpha) for ids, lp in complete), reverse=True
    )
    return scores[options.nbest - 1] >= alive_logprob / length_penalty(n, alpha)


def _best(
    complete: list[tuple[tuple[int, ...], float]], nbest: int, alpha: float
) -> list[Hypothesis]:
    hyps = [Hypothesis(ids, lp, lp / length_penalty(len(ids) + 1, alpha)) for ids, lp in complete]
    hyps.sort(key=lambda h: -h.score)  # stable: ties keep the order they were completed in
    return hyps[:nbest]


def greedy_decode(
    network: EncoderDecoder,
    src_ids: Sequence[Sequence[int]],
    max_length: int | None = None,
    device: str | torch.device = "cpu",
) -> list[Hypothesis]:
    """Argmax decoding, one source at a time, written independently of :func:`beam_search`
    (a reference for it: beam 1 must give the same)."""
    device = torch.device(device)
    out = []
    with torch.inference_mode():
        for ids in src_ids:
            enc = encode_sources(network, [ids], device)
            state = network.start(enc)
            prev = torch.tensor([BOS_ID], device=device)
            limit = max_length if max_length is not None else default_max_length(len(ids))
            seq: list[int] = []
            total = 0.0
            while True:
                logp, state = _next_logprobs(network, state, prev)
                logp[:, [PAD_ID, BOS_ID]] = NEG_INF
                token = EOS_ID if len(seq) >= limit else int(logp[0].argmax())
                total += float(logp[0, token])
                if token == EOS_ID:
                    break
                seq.append(token)
                prev = torch.tensor([token], device=device)
            out.append(Hypothesis(tuple(seq), total, total))
    return out


class Samples(list):
    """The hypotheses :func:`sample` returns, and how many of its draws ended (drew EOS within
    the length limit ``limit``): only those are hypotheses; the others were cut off."""

    def __init__(self, hypotheses=(), drawn: int = 0, ended: int = 0, limit: int = 0):
        super().__init__(hypotheses)
        self.drawn = drawn
        self.ended = ended
        self.limit = limit


@torch.inference_mode()
def sample(
    network: EncoderDecoder,
    src_ids: Sequence[int],
    n: int,
    top: int,
    seed: int = 1,
    max_length: int | None = None,
    forbid_unk: bool = False,
    device: str | torch.device = "cpu",
) -> list[Hypothesis]:
    """Ancestral sampling: ``n`` samples for one source, the ``top`` best distinct by log p
    (:class:`Samples`: a draw that has not ended by the length limit is no hypothesis).

    Words are drawn from the model's distribution (PAD, BOS and, with ``forbid_unk``, UNK
    removed and the rest renormalised); the log p reported is the model's own, unrenormalised.
    """
    device = torch.device(device)
    if n < 1:
        return Samples()
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    limit = max_length if max_length is not None else default_max_length(len(src_ids))
    enc = encode_sources(network, [src_ids], device)
    state = network.start(select_rows(enc, torch.zeros(n, dtype=torch.long, device=device)))
    prev = torch.full((n,), BOS_ID, dtype=torch.long, device=device)
    total = torch.zeros(n, dtype=torch.float64, device=device)
    running = torch.ones(n, dtype=torch.bool, device=device)
    ended = torch.zeros(n, dtype=torch.bool, device=device)
    seqs = torch.full((n, limit + 1), PAD_ID, dtype=torch.long, device=device)
    banned = _banned_tokens(forbid_unk)
    for t in range(limit + 1):
        logp, state = _next_logprobs(network, state, prev)
        weights = logp.exp()
        weights[:, banned] = 0.0
        drawn = torch.multinomial(weights, 1, generator=generator).squeeze(1)
        total += torch.where(running, logp.gather(1, drawn.unsqueeze(1)).squeeze(1), 0.0).double()
        seqs[:, t] = torch.where(running, drawn, PAD_ID)
        ended |= running & (drawn == EOS_ID)
        running &= drawn != EOS_ID
        prev = drawn
        if not bool(running.any()):
            break
    best: dict[tuple[int, ...], float] = {}
    for row in ended.nonzero(as_tuple=True)[0].tolist():
        ids = tuple(i for i in seqs[row].tolist() if i not in (PAD_ID, EOS_ID))
        best[ids] = float(total[row])
    ranked = sorted(best.items(), key=lambda item: -item[1])[:top]
    hypotheses = [Hypothesis(ids, lp, lp) for ids, lp in ranked]
    return Samples(hypotheses, drawn=n, ended=int(ended.sum()), limit=limit)


def merge_candidates(*lists: Sequence[Hypothesis], top: int) -> list[Hypothesis]:
    """Distinct hypotheses of several lists, the ``top`` best by log p."""
    best: dict[tuple[int, ...], Hypothesis] = {}
    for hyps in lists:
        for hyp in hyps:
            if hyp.ids not in best:
                best[hyp.ids] = Hypothesis(hyp.ids, hyp.logprob, hyp.logprob)
    return sorted(best.values(), key=lambda h: -h.logprob)[:top]
