"""The ``translate``, ``evaluate`` and ``sample`` jobs: generate target text with a trained model.

``translate`` reads sentences (a file or ``-``), one per line, and writes one line per input line:
the best hypothesis of a batched beam search (:func:`phrasescore.search.beam_search`), or with
``nbest`` the K best as a Moses n-best list::

    id ||| hypothesis ||| RNNEncDec0= log p(hypothesis | source) ||| score

where ``score`` is the ranking score (log p divided by the GNMT length penalty; equal to log p with
``length_penalty=0``), ids are 0-based input line numbers, and the list reads with
:mod:`phrasescore.moses.nbest`. A source line goes through the model's source normaliser, as in
training (it tokenises only if the model was trained with ``--tokenize``). An empty input line
gives an empty output line (in an n-best list one entry with the empty hypothesis and log p 0,
which is how Moses answers an empty line). ``detokenize`` joins the output tokens with sacremoses'
``MosesDetokenizer`` (Moses escapes such as ``&apos;`` are undone).

``evaluate`` computes corpus BLEU (Papineni et al. 2002) and chrF (Popović 2015) with sacrebleu
and returns sacrebleu's signatures, which say exactly how the figures were computed.

``sample`` lists, for each source phrase, the best distinct targets found by ancestral sampling
(and/or beam search), with their log p and whether the pair is in a Moses phrase table, as in
Cho et al. (2014), Table 3.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

import torch
from tqdm import tqdm

from phrasescore.errors import InputError
from phrasescore.files import AtomicOutput, display_name, iter_lines
from phrasescore.model.checkpoint import TrainedModel, load_model
from phrasescore.moses.nbest import check_feature_name, format_feature_value
from phrasescore.scoring import resolve_device
from phrasescore.search import (
    Hypothesis,
    SearchOptions,
    beam_search,
    check_beam,
    merge_candidates,
    sample,
)

log = logging.getLogger(__name__)

DEFAULT_FEATURE = "RNNEncDec0"


# ---------------------------------------------------------------------------- evaluate
@dataclass
class Evaluation:
    """Corpus BLEU and chrF of hypotheses against one reference, with sacrebleu's signatures."""

    sentences: int
    bleu: float
    chrf: float
    bleu_text: str
    chrf_text: str
    bleu_signature: str
    chrf_signature: str

    def lines(self) -> list[str]:
        """What the commands print: the scores, then the signatures."""
        return [self.bleu_text, self.chrf_text, self.bleu_signature, self.chrf_signature]


def _sacrebleu():
    try:
        import sacrebleu
    except ImportError:
        raise InputError(
            "evaluation needs sacrebleu, which is not installed: pip install 'phrasescore[eval]' "
            "(or pip install sacrebleu)"
        ) from None
    return sacrebleu


def evaluate(
    hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a", lowercase=False
) -> Evaluation:
    """BLEU and chrF of ``hypotheses`` against ``references`` (one reference per sentence)."""
    sacrebleu = _sacrebleu()
    if len(hypotheses) != len(references):
        raise InputError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "they must be line-aligned"
        )
    try:
        bleu = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
    except Exception as exc:  # sacrebleu raises various types for an unknown tokenizer
        raise InputError(f"sacrebleu refuses --tokenize {tokenize!r}: {exc}") from None
    chrf = sacrebleu.metrics.CHRF(lowercase=lowercase)
    refs = [list(references)]
    bleu_score = bleu.corpus_score(list(hypotheses), refs)
    chrf_score = chrf.corpus_score(list(hypotheses), refs)
    return Evaluation(
        sentences=len(hypotheses),
        bleu=float(bleu_score.score),
        chrf=float(chrf_score.score),
        bleu_text=str(bleu_score),
        chrf_text=str(chrf_score),
        bleu_signature=f"BLEU signature: {bleu.get_signature()}",
        chrf_signature=f"chrF signature: {chrf.get_signature()}",
    )


def evaluate_files(
    hypothesis_path: str, reference_path: str, tokenize: str = "13a", lowercase: bool = False
) -> Evaluation:
    """:func:`evaluate` of two line-aligned files (plain or gzip; one may be ``-``)."""
    if hypothesis_path == "-" and reference_path == "-":
        raise InputError("only one of HYPOTHESES and REFERENCE can be standard input")
    _sacrebleu()
    hyps = list(iter_lines(hypothesis_path))
    refs = list(iter_lines(reference_path))
    if len(hyps) != len(refs):
        raise InputError(
            f"{display_name(hypothesis_path)} has {len(hyps)} lines but "
            f"{display_name(reference_path)} has {len(refs)}: they must be line-aligned"
        )
    return evaluate(hyps, refs, tokenize=tokenize, lowercase=lowercase)


# ---------------------------------------------------------------------------- translate
@dataclass
class TranslateOptions:
    """Flags of ``phrasescore translate``."""

    search: SearchOptions = field(default_factory=SearchOptions)
    nbest_output: bool = False
    """Write a Moses n-best list (``search.nbest`` entries per line) instead of 1-best text."""
    detokenize: bool = False
    feature_name: str = DEFAULT_FEATURE
    batch_size: int = 32
    """Sentences searched together (times the beam: rows of one decoder step)."""
    block_lines: int = 1024
    """Input lines read, sorted by length and written at a time."""


@dataclass
class TranslateResult:
    output: str
    sentences: int
    empty: int
    seconds: float
    tokens: int
    evaluation: Evaluation | None = None

    @property
    def sentences_per_second(self) -> float:
        return self.sentences / max(self.seconds, 1e-9)


def format_nbest_entry(index: int, text: str, name: str, logprob: float, score: float) -> str:
    """``id ||| text ||| Name= logp ||| score`` with Moses' number format."""
    lp, total = format_feature_value(logprob), format_feature_value(score)
    return f"{index} ||| {text} ||| {name}= {lp} ||| {total}\n"


class Translator:
    """Searches blocks of sentences and renders the results as text."""

    def __init__(self, model: TrainedModel, options: TranslateOptions, device: torch.device):
        self.model = model
        self.options = options
        self.device = device
        self.network = model.network.to(device).eval()
        self._detok = None
        if options.detokenize:
            from sacremoses import MosesDetokenizer

            self._detok = MosesDetokenizer(lang=model.tgt_text.lang)

    def text(self, hyp: Hypothesis) -> str:
        """The words of a hypothesis, joined by spaces or detokenised."""
        words = self.model.tgt_vocab.decode(hyp.ids)
        if self._detok is not None:
            return self._detok.detokenize(words, unescape=True)
        return " ".join(words)

    def search(self, token_lists: list[list[str]]) -> list[list[Hypothesis]]:
        """Hypotheses for each token list (empty lists get none), in the input order."""
        results: list[list[Hypothesis]] = [[] for _ in token_lists]
        ids = self.model.src_vocab.encode_batch(token_lists)
        order = sorted((i for i, t in enumerate(token_lists) if t), key=lambda i: len(ids[i]))
        size = self.options.batch_size
        for begin in range(0, len(order), size):
            batch = order[begin : begin + size]
            found = beam_search(
                self.network, [ids[i] for i in batch], self.options.search, self.device
            )
            for i, hyps in zip(batch, found, strict=True):
                results[i] = hyps
        return results


def _blocks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    while True:
        block = list(islice(lines, size))
        if not block:
            return
        yield block


def translate_file(
    input_path: str,
    model_path: str | None = None,
    output: str = "-",
    options: TranslateOptions | None = None,
    reference: str | None = None,
    device: str = "cpu",
    progress: bool = True,
    model: TrainedModel | None = None,
) -> TranslateResult:
    """Translate every line of ``input_path`` into ``output`` (see the module docstring)."""
    options = options or TranslateOptions()
    check_feature_name(options.feature_name)
    if options.detokenize and options.nbest_output:
        raise InputError("--detokenize is for 1-best output: n-best lists hold tokenised text")
    if options.search.nbest > 1 and not options.nbest_output:
        raise InputError("an n-best size above 1 needs n-best output")
    if reference is not None:
        _sacrebleu()
        if reference == "-" and input_path == "-":
            raise InputError("the input and --reference cannot both be standard input")
    dev = resolve_device(device)
    if model is None:
        if model_path is None:
            raise InputError("give a --model")
        model = load_model(model_path, dev)
    check_beam(
        options.search.beam,
        options.search.nbest,
        model.config.tgt_vocab_size,
        options.search.forbid_unk,
    )
    translator = Translator(model, options, dev)
    refs = list(iter_lines(reference)) if reference is not None else None
    firsts: list[str] = []
    sentences = empty = tokens = 0
    started = time.monotonic()
    bar = tqdm(disable=not progress, unit=" sentences", dynamic_ncols=True)
    try:
        with AtomicOutput(output) as out:
            for block in _blocks(iter_lines(input_path), options.block_lines):
                token_lists = [model.src_text(line) if line.strip() else [] for line in block]
                found = translator.search(token_lists)
                for offset, hyps in enumerate(found):
                    index = sentences + offset
                    texts = [translator.text(h) for h in hyps]
                    if not hyps:
                        empty += 1
                    tokens += sum(len(h.ids) for h in hyps[:1])
                    firsts.append(texts[0] if texts else "")
                    if not options.nbest_output:
                        out.write(firsts[-1] + "\n")
                    elif not hyps:
                        out.write(format_nbest_entry(index, "", options.feature_name, 0.0, 0.0))
                    else:
                        for hyp, text in zip(hyps, texts, strict=True):
                            out.write(
                                format_nbest_entry(
                                    index, text, options.feature_name, hyp.logprob, hyp.score
                                )
                            )
                sentences += len(block)
                bar.update(len(block))
            if refs is not None and len(refs) != sentences:
                raise InputError(
                    f"the reference has {len(refs)} lines but the input {sentences}", reference
                )
    finally:
        bar.close()
    seconds = time.monotonic() - started
    result = TranslateResult(
        "<stdout>" if output == "-" else output, sentences, empty, seconds, tokens
    )
    log.info(
        "translated %d sentences (%d empty) in %.1f s: %.2f sentences/s, beam %d, model %s",
        sentences,
        empty,
        seconds,
        result.sentences_per_second,
        options.search.beam,
        model.signature,
    )
    if refs is not None:
        result.evaluation = evaluate(firsts, refs)
    return result


# ---------------------------------------------------------------------------- sample
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
    name = display_name(table)
    for lineno, line in enumerate(iter_lines(table), 1):
        head = line.split(None, 1)[0] if line else ""
        if (head.lower() if lowercase else head) not in first_words:
            continue  # cheap filter: most lines have another first word
        parts = line.split("|||", 2)
        if len(parts) < 3:
            raise InputError("expected 'source ||| target ||| scores'", name, lineno)
        source = _key(model.src_text, parts[0])
        if source in found:
            found[source].add(_key(model.tgt_text, parts[1]))
    return found


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
    if model is None:
        if model_path is None:
            raise InputError("give a --model")
        model = load_model(model_path, dev)
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
        if options.samples:
            lists.append(
                sample(
                    network,
                    ids,
                    options.samples,
                    options.top,
                    seed=options.seed,
                    max_length=options.max_length,
                    forbid_unk=options.forbid_unk,
                    device=dev,
                )
            )
        if options.beam:
            lists.append(beam_search(network, [ids], search, dev)[0])
        targets = []
        for hyp in merge_candidates(*lists, top=options.top):
            text = " ".join(model.tgt_vocab.decode(hyp.ids))
            in_table = None if table is None else text in table[key]
            targets.append(SampledTarget(text, hyp.logprob, in_table))
        results.append((phrase, targets))
    return results
