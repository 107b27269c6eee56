"""The ``translate`` job: generate target text with a trained model.

It reads sentences (a file or ``-``), one per line, and writes one line per input line:
the best hypothesis of a batched beam search (:func:`phrasescore.engine.search.beam_search`), or with
``nbest`` the K best as a Moses n-best list::

    id ||| hypothesis ||| RNNEncDec0= log p(hypothesis | source) ||| score

where ``score`` is the ranking score (log p divided by the GNMT length penalty; equal to log p with
``length_penalty=0``), ids are 0-based input line numbers, and the list reads with
:mod:`phrasescore.moses.nbest`. A source line goes through the model's source normaliser, as in
training (it tokenises only if the model was trained with ``--tokenize``). An empty input line
gives an empty output line (in an n-best list one entry with the empty hypothesis and log p 0,
which is how Moses answers an empty line). ``detokenize`` joins the output tokens with sacremoses'
``MosesDetokenizer`` (Moses escapes such as ``&apos;`` are undone). With a ``reference``, the
1-best output is scored as ``evaluate`` does (:mod:`phrasescore.jobs.bleu`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

import torch

from phrasescore.bundle import TrainedModel
from phrasescore.engine.search import (
    Hypothesis,
    SearchOptions,
    beam_search,
    check_beam,
)
from phrasescore.errors import InputError
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.outputs import AtomicOutput, check_output_path
from phrasescore.files.reading import iter_lines
from phrasescore.hardware import resolve_device
from phrasescore.jobs.bleu import Evaluation, evaluate, require_sacrebleu
from phrasescore.jobs.common import model_for
from phrasescore.moses.nbest import check_feature_name, format_nbest_line
from phrasescore.progress import log_startup, progress_bar

log = logging.getLogger(__name__)

DEFAULT_FEATURE = "RNNEncDec0"


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

    @classmethod
    def from_flags(
        cls,
        beam: int = 5,
        nbest: int | None = None,
        max_length: int | None = None,
        length_penalty: float = 1.0,
        forbid_unk: bool = False,
        **others,
    ) -> TranslateOptions:
        """The options of the command's flags: ``nbest`` K (None: 1-best text) and the search
        settings; ``others`` are fields of this class."""
        search = SearchOptions(
            beam=beam,
            nbest=nbest or 1,
            max_length=max_length,
            length_penalty=length_penalty,
            forbid_unk=forbid_unk,
        )
        return cls(search=search, nbest_output=nbest is not None, **others)


@dataclass
class TranslateResult:
    output: str
    sentences: int
    empty: int
    seconds: float
    tokens: int
    evaluation: Evaluation | None = None
    beam: int = 5

    @property
    def sentences_per_second(self) -> float:
        return self.sentences / max(self.seconds, 1e-9)

    def lines(self) -> list[str]:
        """The summary ``translate`` prints on standard error, then BLEU and chrF if any."""
        summary = (
            f"phrasescore: {self.sentences} sentences in {self.seconds:.1f} s "
            f"({self.sentences_per_second:.2f} sentences/s), beam {self.beam} -> {self.output}"
        )
        return [summary, *(self.evaluation.lines() if self.evaluation is not None else [])]


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
        words = self.model.target_words(hyp.ids)
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

    def write_block(self, block: list[str], first_index: int, out, firsts: list[str]):
        """Translate a block of input lines (ids from ``first_index``) and write the 1-best
        lines or n-best entries to ``out``; each line's best text is appended to ``firsts``.
        Returns (empty lines, tokens of the 1-best outputs)."""
        model, options = self.model, self.options
        token_lists = [model.src_text(line) if line.strip() else [] for line in block]
        empty = tokens = 0
        for offset, hyps in enumerate(self.search(token_lists)):
            index = first_index + offset
            texts = [self.text(h) for h in hyps]
            if not hyps:
                empty += 1
            tokens += sum(len(h.ids) for h in hyps[:1])
            firsts.append(texts[0] if texts else "")
            if not options.nbest_output:
                out.write(firsts[-1] + "\n")
            elif not hyps:
                out.write(format_nbest_line(index, "", [(options.feature_name, 0.0)], 0.0))
            else:
                for hyp, text in zip(hyps, texts, strict=True):
                    feature = (options.feature_name, hyp.logprob)
                    out.write(format_nbest_line(index, text, [feature], hyp.score))
        return empty, tokens


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
    bleu_tokenize: str = "13a",
) -> TranslateResult:
    """Translate every line of ``input_path`` into ``output`` (see the module docstring);
    ``bleu_tokenize`` is sacrebleu's tokenizer of the BLEU against ``reference`` (``none`` for
    tokenised text, as ``ab`` scores it)."""
    options = options or TranslateOptions()
    _check_options(options, input_path, reference)
    refuse_outputs_onto_inputs(
        {"input": input_path, "model": model_path, "--reference": reference}, {"-o": output}
    )
    check_output_path(output)
    dev = resolve_device(device)
    model = model_for(model, model_path, dev)
    search = options.search
    check_beam(search.beam, search.nbest, model.config.tgt_vocab_size, search.forbid_unk)
    translator = Translator(model, options, dev)
    refs = list(iter_lines(reference)) if reference is not None else None
    firsts: list[str] = []
    sentences = empty = tokens = 0
    log_startup(log, "the model loaded")
    started = time.monotonic()
    bar = progress_bar(progress, unit=" sentences")
    try:
        with AtomicOutput(output) as out:
            for block in _blocks(iter_lines(input_path), options.block_lines):
                block_empty, block_tokens = translator.write_block(block, sentences, out, firsts)
                empty += block_empty
                tokens += block_tokens
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
        "<stdout>" if output == "-" else output, sentences, empty, seconds, tokens, beam=search.beam
    )
    log.info(
        "translated %d sentences (%d empty) in %.1f s: %.2f sentences/s, beam %d, model %s",
        sentences,
        empty,
        seconds,
        result.sentences_per_second,
        search.beam,
        model.signature,
    )
    if refs is not None:
        result.evaluation = evaluate(firsts, refs, bleu_tokenize, flag="--bleu-tokenize")
    return result


def _check_options(options: TranslateOptions, input_path: str, reference: str | None) -> None:
    check_feature_name(options.feature_name)
    if options.detokenize and options.nbest_output:
        raise InputError("--detokenize is for 1-best output: n-best lists hold tokenised text")
    if options.search.nbest > 1 and not options.nbest_output:
        raise InputError("an n-best size above 1 needs n-best output")
    if reference is not None:
        require_sacrebleu()
        if reference == "-" and input_path == "-":
            raise InputError("the input and --reference cannot both be standard input")
