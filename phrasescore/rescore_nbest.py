"""The n-best rescoring job: add log p(hypothesis | source) to every hypothesis of a Moses list.

This is the last step of the pipeline of SPEC §1 (and how Sutskever et al. 2014, §3.2, used their
LSTM: rescoring the n-best lists of an SMT baseline). For every line of a Moses n-best list
``id ||| hypothesis ||| features ||| total [||| ...]`` it writes the same line with
``Name= value`` added after the last feature (:func:`phrasescore.moses.nbest.add_feature`): every
other byte, the total included, is unchanged. ``value`` is log p(hypothesis | source sentence id)
under the model (end-of-sequence included), or with ``normalize`` the per-token average
log p / n (n target tokens including EOS). It is a log score, used by MERT as it is.

Text: the hypotheses of a Moses n-best list are tokenised text, and the source is the decoder's
input (for a Moses system, tokenised and lowercased or truecased): both are treated as already
tokenised (:meth:`TextNormalizer.normalize_tokenized`: split on spaces, lowercased if the model
lowercases; never tokenised again).

Streaming: the list is read once, the hypotheses of consecutive ids are gathered into blocks of
about ``block_hypotheses`` lines and scored with :class:`~phrasescore.scoring.PairScorer`, which
encodes each distinct source once per block, so the hypotheses of one id share one encoder pass.
The source file is read into memory first (one line per sentence, 100x smaller than the list).

Checks (each an :class:`~phrasescore.errors.InputError` naming file and line; a file output is
then not written at all): an id beyond the last source line; an id whose source line is empty;
a list whose last id is not the last source line (the list and the source do not match: give the
source lines that were decoded); the malformed lines :func:`read_nbest` refuses.

CSLM: with ``lm`` (``--lm``), the feature ``CSLM0= log p(hypothesis </s> | <s>)`` of a target
language model (:mod:`phrasescore.lm_scoring`, SPEC §3.6) is added too, before the model's
feature; re-ranking then needs a weight for it as well.

Re-ranking: with ``weights`` (a moses.ini ``[weight]`` section or a file of ``Name= w ...``
lines, as written by MERT), which must give a weight to the new feature as well, each id's
hypotheses are ordered by the new total ``Σ weight · feature`` (ties keep the list's order) and
the total field holds that new total. With ``one_best`` only the best hypothesis text of each id is
written, one line per source line (an empty line for a sentence without hypotheses), which is
what ``multi-bleu.perl`` or ``phrasescore evaluate`` reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tqdm import tqdm

from phrasescore.errors import InputError
from phrasescore.files import AtomicOutput, display_name, iter_lines
from phrasescore.model.checkpoint import TrainedModel, load_model
from phrasescore.moses.nbest import (
    NBestEntry,
    add_feature,
    check_feature_name,
    format_feature_value,
    iter_nbest_groups,
    parse_features,
    read_nbest,
    read_weights,
    total_score,
)
from phrasescore.scoring import PairScorer, resolve_device

log = logging.getLogger(__name__)


@dataclass
class NBestOptions:
    """Flags of ``phrasescore nbest``."""

    name: str = "RNNEncDec0"
    normalize: bool = False
    weights: str | None = None
    one_best: bool = False
    block_hypotheses: int = 4000
    batch_tokens: int = 8192
    lm: str | None = None
    """A CSLM file (``phrasescore train-lm``): also add ``lm_name= log p(hypothesis)``."""
    lm_name: str = "CSLM0"


@dataclass
class NBestResult:
    output: str
    sentences: int
    hypotheses: int
    seconds: float
    changed: int | None = None
    """With weights: ids whose best hypothesis is not the one with the best original total."""

    @property
    def hypotheses_per_second(self) -> float:
        return self.hypotheses / max(self.seconds, 1e-9)


def read_source(path: str) -> list[str]:
    """The source sentences, one per line."""
    return list(iter_lines(path))


def _blocks(groups: Iterable[list[NBestEntry]], size: int) -> Iterator[list[list[NBestEntry]]]:
    block: list[list[NBestEntry]] = []
    count = 0
    for group in groups:
        block.append(group)
        count += len(group)
        if count >= size:
            yield block
            block, count = [], 0
    if block:
        yield block


def _source_of(entry: NBestEntry, sources: list[str], source_path: str) -> str:
    if entry.id >= len(sources):
        raise InputError(
            f"sentence id {entry.id} is out of range: the source {display_name(source_path)} has "
            f"{len(sources)} lines (ids 0-{len(sources) - 1}); the list and the source do not match",
            entry.path,
            entry.lineno,
        )
    text = sources[entry.id]
    if not text.strip():
        raise InputError(
            f"the source sentence of id {entry.id} (line {entry.id + 1} of "
            f"{display_name(source_path)}) is empty; the list and the source do not match",
            entry.path,
            entry.lineno,
        )
    return text


def _total_field(entry: NBestEntry, total: float) -> str:
    """The raw total field of ``entry`` with another number, its spaces kept."""
    raw = entry.total
    lead = raw[: len(raw) - len(raw.lstrip())] or " "
    trail = raw[len(raw.rstrip()) :]
    return f"{lead}{format_feature_value(total)}{trail}"


def rescore_nbest(
    nbest: str,
    source: str,
    model_path: str | None = None,
    output: str = "-",
    options: NBestOptions | None = None,
    device: str = "cpu",
    progress: bool = True,
    model: TrainedModel | None = None,
) -> NBestResult:
    """Add the model's feature to every hypothesis of ``nbest`` (see the module docstring)."""
    options = options or NBestOptions()
    check_feature_name(options.name)
    if nbest == "-" and source == "-":
        raise InputError("the n-best list and --source cannot both be standard input")
    if options.one_best and not options.weights:
        raise InputError("--one-best needs --weights (the weights that pick the best hypothesis)")
    new_names = [options.name] + ([options.lm_name] if options.lm else [])
    if options.lm:
        check_feature_name(options.lm_name)
        if options.lm_name == options.name:
            raise InputError(f"the model and the LM feature are both named {options.name}")
    weights = None
    if options.weights:
        weights = read_weights(options.weights)
        for name in new_names:
            if name not in weights:
                raise InputError(
                    f"gives no weight for the new feature {name}: add a line "
                    f"'{name}= 1.0' (or the weight MERT found) to its [weight] section",
                    display_name(options.weights),
                )
            if len(weights[name]) != 1:
                raise InputError(
                    f"{name} has one value but {len(weights[name])} weights",
                    display_name(options.weights),
                )
    sources = read_source(source)
    dev = resolve_device(device)
    if model is None:
        if model_path is None:
            raise InputError("give a --model")
        model = load_model(model_path, dev)
    scorer = PairScorer(model, device=dev, batch_tokens=options.batch_tokens)
    log.info("n-best rescoring with model %s, feature %s", model.signature, options.name)
    lm_scorer = None
    if options.lm:
        from phrasescore.lm_scoring import LMScorer
        from phrasescore.model.cslm import load_lm

        lm = load_lm(options.lm, dev)
        lm_scorer = LMScorer(lm, dev)
        log.info("and with language model %s, feature %s", lm.signature, options.lm_name)
    best_texts: list[str] | None = [""] * len(sources) if options.one_best else None
    sentences = hypotheses = changed = 0
    last_id = -1
    started = time.monotonic()
    bar = tqdm(disable=not progress, unit=" hyps", unit_scale=True, dynamic_ncols=True)
    try:
        with AtomicOutput(output) as out:
            groups = iter_nbest_groups(read_nbest(nbest))
            for block in _blocks(groups, options.block_hypotheses):
                if lm_scorer is not None:  # the LM feature first, in each entry's features
                    from phrasescore.lm_scoring import with_lm_feature

                    block = with_lm_feature(block, lm_scorer, options.lm_name)
                entries = [e for group in block for e in group]
                srcs = [_source_of(e, sources, source) for e in entries]
                scored = scorer.score_phrases(srcs, [e.hypothesis for e in entries])
                values = scored.logprob / scored.n_tokens if options.normalize else scored.logprob
                position = 0
                for group in block:
                    group_values = [float(v) for v in values[position : position + len(group)]]
                    position += len(group)
                    last_id = max(last_id, group[0].id)
                    if weights is None:
                        out.writelines(
                            add_feature(e, options.name, v)
                            for e, v in zip(group, group_values, strict=True)
                        )
                        continue
                    lines, best, was_best = _rerank(group, group_values, weights, options)
                    changed += best.hypothesis != was_best.hypothesis
                    if best_texts is not None:
                        best_texts[group[0].id] = best.hypothesis
                    else:
                        out.writelines(lines)
                sentences += len(block)
                hypotheses += len(entries)
                bar.update(len(entries))
            if last_id + 1 != len(sources):
                raise InputError(
                    f"the n-best list ends with sentence id {last_id} but the source has "
                    f"{len(sources)} lines: the list and the source do not match (give exactly "
                    "the source lines that were decoded)",
                    display_name(nbest),
                )
            if best_texts is not None:
                out.writelines(text + "\n" for text in best_texts)
    finally:
        bar.close()
    seconds = time.monotonic() - started
    result = NBestResult(
        "<stdout>" if output == "-" else output,
        sentences,
        hypotheses,
        seconds,
        changed if weights else None,
    )
    log.info(
        "%d hypotheses of %d sentences scored in %.1f s (%.0f hypotheses/s)%s",
        hypotheses,
        sentences,
        seconds,
        result.hypotheses_per_second,
        f"; re-ranking changed the best hypothesis of {changed} sentences" if weights else "",
    )
    return result


def _rerank(
    group: list[NBestEntry], values: list[float], weights: dict, options: NBestOptions
) -> tuple[list[str], NBestEntry, NBestEntry]:
    """The lines of one id ordered by their new totals (written in the total field), the new
    best entry and the old one (best original total).

    The new feature enters the total with the value as written (6 significant digits), so the
    totals can be recomputed from the output.
    """
    totals = []
    for entry, value in zip(group, values, strict=True):
        features = parse_features(entry.features, entry.path, entry.lineno)
        features.append((options.name, [float(format_feature_value(value))]))
        try:
            totals.append(total_score(features, weights))
        except InputError as exc:
            raise InputError(
                f"{exc.message} in {display_name(options.weights)}", entry.path, entry.lineno
            ) from None
    old_best = max(range(len(group)), key=lambda i: (float(group[i].total), -i))
    order = sorted(range(len(group)), key=lambda i: (-totals[i], i))
    lines = [
        add_feature(
            group[i]._replace(total=_total_field(group[i], totals[i])), options.name, values[i]
        )
        for i in order
    ]
    return lines, group[order[0]], group[old_best]
