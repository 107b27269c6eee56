"""The ``evaluate`` job: corpus BLEU (Papineni et al. 2002) and chrF (Popović 2015) of a
hypotheses file against a reference file, with sacrebleu's signatures
(:mod:`phrasescore.jobs.bleu`, which ``translate --reference`` and ``ab`` use too).
"""

from __future__ import annotations

from phrasescore.errors import InputError
from phrasescore.files.kinds import display_name
from phrasescore.files.reading import iter_lines
from phrasescore.jobs.bleu import Evaluation, evaluate, require_sacrebleu


def evaluate_files(
    hypothesis_path: str, reference_path: str, tokenize: str = "13a", lowercase: bool = False
) -> Evaluation:
    """:func:`evaluate` of two line-aligned files (plain or gzip; one may be ``-``)."""
    if hypothesis_path == "-" and reference_path == "-":
        raise InputError("only one of HYPOTHESES and REFERENCE can be standard input")
    require_sacrebleu()
    hyps = list(iter_lines(hypothesis_path))
    refs = list(iter_lines(reference_path))
    if len(hyps) != len(refs):
        raise InputError(
            f"{display_name(hypothesis_path)} has {len(hyps)} lines but "
            f"{display_name(reference_path)} has {len(refs)}: they must be line-aligned"
        )
    return evaluate(hyps, refs, tokenize=tokenize, lowercase=lowercase)
