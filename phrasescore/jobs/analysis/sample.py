"""The ``sample`` job: the best target phrases of each source phrase (Cho et al. 2014, Table 3).

For each source phrase it lists the best distinct targets found by ancestral sampling (and/or
beam search), with their log p and whether the pair is in a Moses phrase table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from phrasescore.bundle import TrainedModel
from phrasescore.engine.search import (
    SearchOptions,
    beam_search,
    check_beam,
    merge_candidates,
    sample,
)
from phrasescore.errors import InputError
from phrasescore.files.reading import iter_lines
from phrasescore.hardware import resolve_device
from phrasescore.jobs.common import model_for
from phrasescore.moses.phrase_table import read_phrase_table

log = logging.getLogger(__name__)


@dataclass
class SampledTarget:
    text: str
    logprob: float
    in_table: bool | None
    """Whether (source, target) is a pair of the phrase table; None without a table."""


@dataclass
class SampleOptions:
    """Flags of ``phrasescore sample``."""

    samples: int = 100
    top: int = 10
    beam: bool = False
    """Add the beam-search n-best (beam = ``top``, ranked by log p) to the candidates."""
    seed: int = 1
    max_length: int | None = None
    forbid_unk: bool = False


def _key(normalizer, phrase: str) -> str:
    return " ".join(normalizer.normalize_tokenized(phrase))


def phrase_table_targets(table: str, sources: set[str], model: TrainedModel) -> dict[str, set[str]]:
    """The targets of each of ``sources`` in a Moses phrase table (one streaming pass).

    Phrases are compared after the model's normalisation of tokenised text (lowercasing if the
    model lowercases), so a lowercasing model finds the targets of a cased table.
    """
    found: dict[str, set[str]] = {s: set() for s in sources}
    first_words = {s.split(" ", 1)[0] for s in sources}
    lowercase = model.src_text.lowercase
    for entry in read_phrase_table(table, validate=False):
        head = entry.source.split(None, 1)[0]
        if (head.lower() if lowercase else head) not in first_words:
            continue  # cheap filter: most lines have another first word
        source = _key(model.src_text, entry.source)
        if source in found:
            found[source].add(_key(model.tgt_text, entry.target))
    return found


@dataclass
class SampleResult:
    """The best targets of each source phrase, in the order of the phrases."""

    phrases: list[tuple[str, list[SampledTarget]]]

    def lines(self) -> list[str]:
        """One line per target: source, log p, target and, with a phrase table, ``in-table`` or
        ``new``, tab-separated."""
        lines = []
        for phrase, targets in self.phrases:
            for target in targets:
                fields = [phrase, f"{target.logprob:.4f}", target.text]
                if target.in_table is not None:
                    fields.append("in-table" if target.in_table else "new")
                lines.append("\t".join(fields))
        return lines


def run_sample(
    arguments: Sequence[str],
    model_path: str | None,
    options: SampleOptions,
    phrase_table: str | None = None,
    device: str = "cpu",
) -> SampleResult:
    """``phrasescore sample``: the phrases of the command line (:func:`read_phrases`) sampled
    (:func:`sample_phrases`)."""
    phrases = read_phrases(arguments)
    return SampleResult(
        sample_phrases(phrases, model_path, options, phrase_table=phrase_table, device=device)
    )


def read_phrases(arguments: Sequence[str]) -> list[str]:
    """The phrases of the command line; ``-`` stands for the non-empty lines of standard input."""
    phrases: list[str] = []
    for argument in arguments:
        if argument == "-":
            phrases.extend(line for line in iter_lines("-") if line.strip())
        else:
            phrases.append(argument)
    if not phrases:
        raise InputError("no source phrase given")
    return phrases


def sample_phrases(
    phrases: Sequence[str],
    model_path: str | None = None,
    options: SampleOptions | None = None,
    phrase_table: str | None = None,
    device: str = "cpu",
    model: TrainedModel | None = None,
) -> list[tuple[str, list[SampledTarget]]]:
    """For each phrase, the best distinct targets by log p (Cho et al. 2014, Table 3)."""
    options = options or SampleOptions()
    if options.samples < 0 or options.top < 1:
        raise InputError("-n must be >= 0 and --top >= 1")
    if options.samples == 0 and not options.beam:
        raise InputError("nothing to do: -n 0 without --beam")
    dev = resolve_device(device)
    model = model_for(model, model_path, dev)
    network = model.network.to(dev).eval()
    search = SearchOptions(
        beam=options.top,
        nbest=options.top,
        max_length=options.max_length,
        length_penalty=0.0,
        forbid_unk=options.forbid_unk,
    )
    if options.beam:
        check_beam(search.beam, search.nbest, model.config.tgt_vocab_size, options.forbid_unk)
    token_lists = [model.src_text(p) for p in phrases]
    for phrase, tokens in zip(phrases, token_lists, strict=True):
        if not tokens:
            raise InputError(f"empty source phrase {phrase!r}")
    keys = [" ".join(t) for t in token_lists]
    table = phrase_table_targets(phrase_table, set(keys), model) if phrase_table else None
    results = []
    for phrase, tokens, key in zip(phrases, token_lists, keys, strict=True):
        ids = model.src_vocab.encode(tokens)
        lists = []
        drawn = None
        if options.samples:
            drawn = sample(
                network,
                ids,
                options.samples,
                options.top,
                seed=options.seed,
                max_length=options.max_length,
                forbid_unk=options.forbid_unk,
                device=dev,
            )
            lists.append(drawn)
        if options.beam:
            lists.append(beam_search(network, [ids], search, dev)[0])
        targets = []
        for hyp in merge_candidates(*lists, top=options.top):
            text = " ".join(model.target_words(hyp.ids))
            in_table = None if table is None else text in table[key]
            targets.append(SampledTarget(text, hyp.logprob, in_table))
        if drawn is not None and len(targets) < options.top and drawn.ended < drawn.drawn:
            _warn_cut_off(phrase, drawn, len(targets))
        results.append((phrase, targets))
    return results


def _warn_cut_off(phrase: str, drawn, shown: int) -> None:
    """Say why fewer targets than asked are shown: samples that had not drawn the end of the
    phrase by the length limit are not targets (a barely trained model rarely ends one), so
    ``sample 'a man' -n 5`` would print nothing and exit 0 without it."""
    log.warning(
        "%r: %d of %d samples ended within the length limit (%d tokens; the others were cut "
        "off there and are not targets), %d distinct shown: draw more (-n), raise "
        "--max-length, or add --beam",
        phrase,
        drawn.ended,
        drawn.drawn,
        drawn.limit,
        shown,
    )
