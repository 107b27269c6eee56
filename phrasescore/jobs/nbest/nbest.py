"""The n-best rescoring job: add log p(hypothesis | source) to every hypothesis of a Moses list.

This is the last step of the README's recipe (README.md "The recipe"), and how Sutskever et al.
(2014, §3.2) used their LSTM: rescoring the n-best lists of an SMT baseline. For every line of
a Moses n-best list ``id ||| hypothesis ||| features ||| total [||| ...]`` it writes the same
line with ``Name= value`` added after the last feature
(:func:`phrasescore.moses.nbest.add_feature`): every other byte, the total included, is
unchanged. ``value`` is log p(hypothesis | source sentence id) under the model (end-of-sequence
included), or with ``normalize`` the per-token average log p / n (n target tokens including EOS). It is a log score, used by MERT as it is.

Text: the hypotheses of a Moses n-best list are tokenised text, and the source is the decoder's
input (for a Moses system, tokenised and lowercased or truecased): both are treated as already
tokenised (:meth:`TextNormalizer.normalize_tokenized`: split on spaces, lowercased if the model
lowercases; never tokenised again).

Streaming: the list is read once, the hypotheses of consecutive ids are gathered into chunks of
about ``chunk_lines`` lines and scored with the device's engine (:class:`~phrasescore.engine.scoring.BlockScorer`), which
encodes each distinct source once per chunk, so the hypotheses of one id share one encoder pass.
The source file is read into memory first (one line per sentence, 100x smaller than the list).

Checks (each an :class:`~phrasescore.errors.InputError` naming file and line; a file output is
then not written at all): an id beyond the last source line; an id whose source line is empty;
a list whose last id is not the last source line (the list and the source do not match: give the
source lines that were decoded); the malformed lines :func:`read_nbest` refuses.

Inverse direction: with ``inverse`` (``--inverse``) the model is a target->source model (trained
on the corpus with its two sides swapped) and the feature is log p(source | hypothesis), the
inverse-direction re-ranking feature of Sennrich et al. (2016) (with ``normalize``: per source
token). A right-to-left model (``train --reverse-target``) needs no flag: it carries its order
and reads each hypothesis reversed (:meth:`~phrasescore.model.config.ModelConfig.target_order`).

Ensembles: ``-m`` given several times (``model_path`` a sequence) adds one feature, the
token-level ensemble of the models (:class:`~phrasescore.engine.scoring.EnsembleScorer`: their
next-token probabilities averaged), for checkpoints or seeds of one model (Sutskever et al. 2014,
§3.6); the models must share the target vocabulary and direction.

Several features in one pass: ``-m NAME=MODEL`` (repeatable), ``--inverse-model NAME=MODEL``
(``options.inverse_models``, target->source) and ``NAME=A,B`` (an ensemble) add one feature per
name, the ``-m`` ones in their order, then the inverse ones
(:func:`~phrasescore.jobs.nbest.features.nbest_feature_models`). The list is read and written
once, every model scores each chunk in turn, and the output is byte-identical to one call per
feature, each on the list the previous call wrote: a feature's values do not depend on the
others', and each is added after the line's last feature as that call would. Every model is
checked for the list's direction on the first chunk (a warning per model that looks reversed).

CSLM: with ``lm`` (``--lm``), the feature ``CSLM0= log p(hypothesis </s> | <s>)`` of a target
language model (:mod:`phrasescore.engine.lm_scoring`, Schwenk 2007) is added too, before the model's
feature; re-ranking then needs a weight for it as well.

Shards: with ``shard`` (``--shard K/N``) only the chunks of shard K are scored and written, and a
manifest goes beside the output (:mod:`phrasescore.runners.shards`). The chunks are those above:
the list is cut after the sentence-id group that brings a chunk to ``chunk_lines`` lines
(``--chunk-lines``), so a sentence's hypotheses are never split, and chunk ``i`` belongs to shard
``i % N + 1``. Every shard reads the whole list (and checks every id against the source); the
parts joined by ``merge-shards`` are byte-identical to one process's output with the same flags.

Re-ranking: with ``weights`` (a moses.ini ``[weight]`` section or a file of ``Name= w ...``
lines, as written by MERT), which must give a weight to the new feature as well, each id's
hypotheses are ordered by the new total ``Σ weight · feature`` (ties keep the list's order) and
the total field holds that new total. With ``one_best`` only the best hypothesis text of each id is
written, one line per source line (an empty line for a sentence without hypotheses), which is
what ``multi-bleu.perl`` or ``phrasescore evaluate`` reads.

Resume: an output file is written as ``rescore``'s is, through a partial file and its state
(:mod:`phrasescore.runners.partial`); with ``resume`` an interrupted run goes on after its last
complete chunk, and the output is byte-identical to an uninterrupted run's.

The data, top to bottom: :func:`run_nbest` (torchrun: one shard per rank in a
:class:`~phrasescore.runners.chunked_job.RankRun` block) -> :func:`rescore_nbest` (every check
before any work) -> :func:`~phrasescore.jobs.nbest.job.score_list`, which drives the chunked
runner (:class:`~phrasescore.runners.chunked_job.ChunkedRun`) step by step: the features loaded
(:mod:`.features`), the list read as raw lines in chunks
(:class:`~phrasescore.jobs.nbest.job.ListChunks`, :mod:`.chunks`), each chunk parsed
(:mod:`phrasescore.moses.nbest`), scored (:class:`~phrasescore.jobs.nbest.features.ChunkFeatures`
-> the engine) and formatted (:mod:`.writer`) by the workers' map
(:class:`~phrasescore.jobs.nbest.chunks.ListChunkJob`), and appended to the output in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from phrasescore.errors import InputError
from phrasescore.files import (
    check_files_exist,
    check_output_path,
    is_pipe,
    is_stream_target,
    refuse_outputs_onto_inputs,
)
from phrasescore.jobs.nbest.features import nbest_feature_models
from phrasescore.jobs.nbest.job import NBestOptions, NBestResult, NBestRun, score_list
from phrasescore.moses.nbest import check_feature_name
from phrasescore.runners import distributed
from phrasescore.runners.chunked_job import RankRun, RunFlags
from phrasescore.runners.partial import check_resume_input, check_work_paths, run_outputs
from phrasescore.runners.shards import Shard
from phrasescore.runners.workers import check_torchrun_options

log = logging.getLogger(__name__)

__all__ = ["NBestOptions", "NBestResult", "rescore_nbest", "run_nbest"]


def rescore_nbest(
    nbest: str,
    source: str,
    model_path: str | Sequence[str] | None = None,
    output: str = "-",
    options: NBestOptions | None = None,
    device: str = "cpu",
    progress: bool = True,
    shard: Shard | None = None,
    workers: int = 1,
    resume: bool = False,
    io_workers: int = 0,
) -> NBestResult:
    """Add the models' features (and the CSLM's) to every hypothesis of ``nbest`` (see the
    module docstring); with an ``options.lm`` and no model, the CSLM feature alone. With
    ``shard``, only that shard's chunks, and a manifest beside ``output``. ``workers`` > 1
    (CPU): the chunks are scored in that many forked single-threaded processes
    (:mod:`phrasescore.runners.chunk_pool`), with the bytes of one process. ``resume``: go on
    after the last chunk an interrupted run wrote (:mod:`phrasescore.runners.partial`), the
    bytes those of an uninterrupted run. ``io_workers`` > 0 (any device): that many forked
    processes parse, look up ids and format the chunks while this process scores them (the one
    that owns the networks: a GPU), with the bytes of one process.

    ``model_path``: the ``-m`` values, plain model files (one feature named ``options.name``;
    several: their ensemble, :class:`~phrasescore.engine.scoring.EnsembleScorer`) or
    ``NAME=MODEL[,MODEL]`` specs (one feature each; with ``options.inverse_models``)."""
    options = options or NBestOptions()
    flags = RunFlags(output, device, resume, progress, shard, workers, io_workers)
    return score_list(_checked_run(nbest, source, model_path, options, flags), flags)


def _checked_run(nbest: str, source: str, model_path, options: NBestOptions, flags: RunFlags):
    """The run, after everything about its inputs, output and flags that can be refused
    before any work."""
    features = nbest_feature_models(
        model_paths(model_path), options.inverse_models, options.name, options.inverse
    )
    with_model = _with_model(options, bool(features))
    names = _check_options(nbest, source, options, with_model, features)
    paths = [p for f in features for p in f.paths]
    _refuse_onto_inputs(nbest, source, paths, options, flags.output, flags.shard)
    if flags.shard is not None:
        _check_shard(nbest, flags.output, options)
    if flags.resume:
        check_resume_input(nbest, "list")
    check_output_path(flags.output)
    if not flags.stream:
        check_work_paths(flags.output, flags.shard)
    return NBestRun(nbest, source, features, options, names, with_model)


def run_nbest(
    nbest: str,
    source: str,
    model_path: str | Sequence[str] | None,
    output: str,
    options: NBestOptions,
    device: str = "cpu",
    progress: bool = True,
    shard: Shard | None = None,
    workers: int = 1,
    resume: bool = False,
    io_workers: int = 0,
) -> NBestResult:
    """``phrasescore nbest``: :func:`rescore_nbest`, or under torchrun (``WORLD_SIZE`` > 1)
    one shard per rank into a hidden part beside the output, merged by rank 0
    (:class:`~phrasescore.runners.chunked_job.RankRun`); rank 0 returns the whole list's
    result."""
    launch = distributed.from_env()
    if launch is None:
        return rescore_nbest(
            nbest,
            source,
            model_path,
            output,
            options,
            device,
            progress,
            shard=shard,
            workers=workers,
            resume=resume,
            io_workers=io_workers,
        )
    check_torchrun_options(launch, shard, workers)
    if source == "-":
        raise InputError("under torchrun give --source as a file (every rank reads it)")
    _refuse_onto_inputs(nbest, source, model_paths(model_path), options, output, None)
    _check_shard(nbest, output, options)
    check_output_path(output)
    started = time.monotonic()
    flags = RunFlags(output, device, resume, progress, io_workers=io_workers)
    with RankRun(launch, flags, nbest) as rank:
        result = None
        if not rank.finished:
            run = _checked_run(nbest, source, model_path, options, rank.flags)
            result = score_list(run, rank.flags)
        merged, (changed,) = rank.merge([result.changed or 0] if result else [0])
    if merged is None:
        return result
    result = NBestResult(
        output,
        merged.groups,
        merged.lines,
        time.monotonic() - started,
        changed if options.weights else None,
        scoring=options.scoring
        if _with_model(options, bool(model_paths(model_path) or options.inverse_models))
        else None,
    )
    log.info(
        "torchrun: %d ranks scored %d hypotheses in %.1f s (%.0f hypotheses/s)",
        launch.world_size,
        result.hypotheses,
        result.seconds,
        result.hypotheses_per_second,
    )
    return result


def _check_shard(nbest: str, output: str, options: NBestOptions) -> None:
    """What ``--shard`` needs: a list file (its identity goes in the manifest), an output file
    (the manifest goes beside it), and a part of the list as output."""
    if nbest == "-" or output == "-" or is_stream_target(output):
        raise InputError(
            "--shard and torchrun need an n-best list file and an output file (for the manifest)"
        )
    check_files_exist([nbest])
    if is_pipe(nbest):
        raise InputError(
            "--shard reads the list's size and edges for its manifest: give the file", nbest
        )
    if options.one_best:
        raise InputError(
            "--one-best writes one line per source sentence, not a part of the list: shard "
            "without it (merge-shards joins re-ranked parts)"
        )


def _refuse_onto_inputs(
    nbest: str, source: str, paths: list[str], options: NBestOptions, output: str, shard
) -> None:
    """:func:`~phrasescore.files.refuse_outputs_onto_inputs` of every file ``nbest`` reads and
    writes (the partial output and its state beside a file output, a shard's manifest)."""
    outputs = run_outputs(output, shard)
    refuse_outputs_onto_inputs(
        {
            "n-best list": nbest,
            "--source": source,
            "model": paths,
            "--lm": options.lm,
            "--weights": options.weights,
        },
        outputs,
    )


def _with_model(options: NBestOptions, model_given: bool) -> bool:
    """Whether a model's feature is added: with ``-m``, or whenever neither ``--lm`` nor
    ``--weights`` alone says what to do (then ``-m`` is missing). ``--weights`` without ``-m``
    and ``--lm`` re-ranks a list that holds every feature already."""
    return model_given or not (options.lm or options.weights)


def _check_options(
    nbest: str, source: str, options: NBestOptions, with_model: bool, features
) -> list[str]:
    """The names of the features to add, in order, after checking the options."""
    if with_model:
        if not features:
            raise InputError("give a --model")
        for feature in features:
            check_feature_name(feature.name)
    elif options.inverse:
        raise InputError("--inverse needs -m MODEL (a target->source model)")
    if nbest == "-" and source == "-":
        raise InputError("the n-best list and --source cannot both be standard input")
    if options.one_best and not options.weights:
        raise InputError("--one-best needs --weights (the weights that pick the best hypothesis)")
    model_names = [feature.name for feature in features]
    names = ([options.lm_name] if options.lm else []) + model_names
    if options.lm:
        check_feature_name(options.lm_name)
        if options.lm_name in model_names:
            raise InputError(f"the model and the LM feature are both named {options.lm_name}")
    return names


def model_paths(model_path: str | Sequence[str] | None) -> list[str]:
    """The model files of ``-m`` (given once, a string; several times, an ensemble)."""
    if model_path is None:
        return []
    return [model_path] if isinstance(model_path, str) else list(model_path)
