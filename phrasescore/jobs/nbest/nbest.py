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
about ``chunk_lines`` lines and scored with :class:`~phrasescore.engine.scoring.PairScorer`, which
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
"""

from __future__ import annotations

import collections
import hashlib
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from phrasescore.bundle import load_lm
from phrasescore.engine.lm_scoring import LMScorer
from phrasescore.errors import InputError
from phrasescore.files.guards import refuse_outputs_onto_inputs
from phrasescore.files.inputs import check_files_exist
from phrasescore.files.kinds import display_name, is_pipe, is_stream_target
from phrasescore.files.locks import output_lock, remove_stale_temporaries
from phrasescore.files.outputs import AtomicOutput, check_output_path
from phrasescore.files.reading import iter_lines
from phrasescore.hardware import resolve_device
from phrasescore.jobs.feature_specs import FeatureModel
from phrasescore.jobs.nbest.features import ModelFeatures, nbest_feature_models
from phrasescore.moses.nbest import (
    NBestEntry,
    best_index,
    check_feature_name,
    gap_ids,
    iter_nbest_groups,
    missing_ids_message,
    parse_features,
    read_nbest,
    read_weights,
    weighted_totals,
    with_feature,
    with_total,
)
from phrasescore.progress import progress_bar
from phrasescore.runners import distributed
from phrasescore.runners.shards import (
    NBEST,
    Shard,
    chunk_record,
    manifest_path,
    run_on_ranks,
    write_manifest,
)
from phrasescore.runners.workers import (
    WorkerMap,
    check_torchrun_options,
    check_workers_device,
    loading_for_workers,
)

log = logging.getLogger(__name__)


@dataclass
class NBestOptions:
    """Flags of ``phrasescore nbest``."""

    name: str | None = None
    """``--name`` of a plain ``-m MODEL`` (default ``RNNEncDec0``); None with ``NAME=MODEL``."""
    normalize: bool = False
    weights: str | None = None
    one_best: bool = False
    chunk_lines: int = 4000
    """Lines per chunk (``--chunk-lines``): a chunk ends after the sentence that reaches it."""
    batch_tokens: int = 8192
    lm: str | None = None
    """A CSLM file (``phrasescore train-lm``): also add ``lm_name= log p(hypothesis)``."""
    lm_name: str = "CSLM0"
    scoring: str = "exact"
    """``exact`` or ``self-normalized`` (:mod:`phrasescore.engine.scoring`; the model's feature only)."""
    inverse: bool = False
    """The model is target->source: its feature is log p(source | hypothesis)."""
    inverse_models: tuple[str, ...] = ()
    """``--inverse-model NAME=MODEL[,MODEL]`` specs: target->source features."""


@dataclass
class NBestResult:
    output: str
    sentences: int
    hypotheses: int
    seconds: float
    changed: int | None = None
    """With weights: ids whose best hypothesis is not the one with the best original total."""
    clamped: int = 0
    """Self-normalized scoring: hypotheses whose log p was above 0, clamped to 0."""
    scoring: str | None = None
    """The model's scoring (``exact`` or ``self-normalized``); None without a model."""

    @property
    def hypotheses_per_second(self) -> float:
        return self.hypotheses / max(self.seconds, 1e-9)

    def lines(self) -> list[str]:
        """The summary ``nbest`` prints on standard error."""
        changed = "" if self.changed is None else f", best hypothesis changed for {self.changed}"
        mode = ""
        if self.scoring is not None:
            mode = f", {self.scoring} scoring" + (
                f" ({self.clamped} clamped at log p = 0)" if self.clamped else ""
            )
        return [
            f"phrasescore: {self.hypotheses} hypotheses of {self.sentences} sentences, "
            f"{self.seconds:.1f} s{changed}{mode} -> {self.output}"
        ]


def read_source(path: str) -> list[str]:
    """The source sentences, one per line."""
    return list(iter_lines(path))


def _chunks(groups: Iterable[list[NBestEntry]], size: int) -> Iterator[list[list[NBestEntry]]]:
    chunk: list[list[NBestEntry]] = []
    count = 0
    for group in groups:
        chunk.append(group)
        count += len(group)
        if count >= size:
            yield chunk
            chunk, count = [], 0
    if chunk:
        yield chunk


def _source_of(entry: NBestEntry, sources: list[str], source_path: str) -> str:
    if entry.id >= len(sources):
        has = f"{len(sources)} lines (ids 0-{len(sources) - 1})" if sources else "no line"
        raise InputError(
            f"sentence id {entry.id} is out of range: the source {display_name(source_path)} has "
            f"{has}; the list and the source do not match",
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
) -> NBestResult:
    """Add the models' features (and the CSLM's) to every hypothesis of ``nbest`` (see the
    module docstring); with an ``options.lm`` and no model, the CSLM feature alone. With
    ``shard``, only that shard's chunks, and a manifest beside ``output``. ``workers`` > 1
    (CPU): the chunks are scored in that many forked single-threaded processes
    (:mod:`phrasescore.runners.chunk_pool`), with the bytes of one process.

    ``model_path``: the ``-m`` values, plain model files (one feature named ``options.name``;
    several: their ensemble, :class:`~phrasescore.engine.scoring.EnsembleScorer`) or
    ``NAME=MODEL[,MODEL]`` specs (one feature each; with ``options.inverse_models``)."""
    options = options or NBestOptions()
    features = nbest_feature_models(
        model_paths(model_path), options.inverse_models, options.name, options.inverse
    )
    with_model = _with_model(options, bool(features))
    names = _check_options(nbest, source, options, with_model, features)
    _refuse_onto_inputs(
        nbest, source, [p for f in features for p in f.paths], options, output, shard
    )
    if shard is not None:
        _check_shard(nbest, output, options)
    check_output_path(output)
    # one run at a time on an output: a second is refused before it loads anything
    with output_lock(output):
        if output != "-" and not is_stream_target(output):
            remove_stale_temporaries(output)  # of a run killed before (kill -9)
            remove_stale_temporaries(manifest_path(output))
        weights = _read_weights(options.weights, names) if options.weights else None
        sources = read_source(source)
        dev = resolve_device(device)
        check_workers_device(workers, dev)
        with loading_for_workers(workers):  # loaded at one thread, to fork from
            scored, signatures, scorer = _features(options, dev, features)
        if shard is not None:
            log.info(
                "shard %s: chunks i of about %d hypotheses with i %% %d == %d",
                shard,
                options.chunk_lines,
                shard.count,
                shard.index - 1,
            )
        writer = _Writer(options, weights, len(sources), [name for name, _ in scored])
        reader = _ChunkReader(nbest, sources, source, options.chunk_lines, shard)
        reader.first_chunk = scorer.warn_direction if scorer is not None else None
        manifest = None
        if shard is not None:
            job = _manifest_job(names, signatures, options, weights, sources, features)
            manifest = _PartManifest(output, shard, nbest, options, job, dev.type, reader, writer)
        started = time.monotonic()
        bar = progress_bar(progress, unit=" hyps", unit_scale=True)
        warm_up = scorer.warm_up if scorer is not None else None
        try:
            with (
                WorkerMap(ChunkScorer(scored, scorer), workers, warm_up) as scoring,
                AtomicOutput(output, before_rename=manifest) as out,
            ):
                clamped = _write_chunks(scoring.results(reader.pairs()), reader, writer, out, bar)
                scoring.finish()
                writer.finish(out, nbest)
        finally:
            bar.close()
        result = _result(output, writer, time.monotonic() - started, weights is not None, clamped)
        result.scoring = options.scoring if with_model else None
        return result


class _ChunkReader:
    """The list's chunks in input order (:func:`_chunks`): the pairs each one scores (None for
    another shard's chunk), every chunk kept in :attr:`pending` until its scores come back, the
    sizes of all chunks in :attr:`plan` (a shard's manifest) and the shard's own chunks' records
    in :attr:`records`."""

    def __init__(self, nbest: str, sources: list[str], source_path: str, size: int, shard):
        self.nbest = nbest
        self.sources = sources
        self.source_path = source_path
        self.size = size
        self.shard = shard
        self.plan: list[int] = []
        self.pending: collections.deque = collections.deque()
        self.records: list[dict] = []
        self.first_chunk = None
        """Called with the first scored chunk's ``(sources, hypotheses)`` in this process (the
        models' direction check, :meth:`~phrasescore.jobs.nbest.features.ModelFeatures.warn_direction`)."""

    def pairs(self) -> Iterator[tuple[list[str], list[str]] | None]:
        """The ``(sources, hypotheses)`` of each chunk to score (None for another shard's)."""
        groups = iter_nbest_groups(read_nbest(self.nbest))
        for index, chunk in enumerate(_chunks(groups, self.size)):
            entries = [e for group in chunk for e in group]
            self.plan.append(len(entries))
            srcs = [_source_of(e, self.sources, self.source_path) for e in entries]
            owned = self.shard is None or self.shard.owns(index)
            self.pending.append((index, chunk, entries))
            if not owned:
                yield None
                continue
            hyps = [e.hypothesis for e in entries]
            if self.first_chunk is not None:
                self.first_chunk(srcs, hyps)
                self.first_chunk = None
            yield srcs, hyps

    def written(self, index: int, entries: list[NBestEntry]) -> None:
        """Chunk ``index`` is written: a shard records it."""
        if self.shard is not None:
            self.records.append(chunk_record(index, [str(e.id) for e in entries]))


def _write_chunks(done, reader: _ChunkReader, writer: _Writer, out, bar) -> int:
    """Write the scored chunks ``done`` (``(pairs, score_chunk(pairs))`` in input order), each
    line with its new features; returns the model scores clamped."""
    clamped = 0
    for _, scored in done:
        index, chunk, entries = reader.pending.popleft()
        if scored is None:
            writer.skip(chunk)
            continue
        values, chunk_clamped = scored
        clamped += chunk_clamped
        for name, column in zip(writer.names, values, strict=True):
            entries = [
                with_feature(e, name, float(v)) for e, v in zip(entries, column, strict=True)
            ]
        writer.write_chunk(_regroup(entries, chunk), out)
        reader.written(index, entries)
        bar.update(len(entries))
    return clamped


def _manifest_job(names, signatures, options: NBestOptions, weights, sources, features) -> dict:
    """What every shard of one n-best job must share (the manifest's ``job``)."""
    inverse = [feature.name for feature in features if feature.inverse]
    return {
        "features": names,
        **signatures,
        "options": {
            "normalize": options.normalize,
            "batch_tokens": options.batch_tokens,
            "scoring": options.scoring,
            "weights": weights,
            **({"inverse": inverse} if inverse else {}),
        },
        "source": {
            "lines": len(sources),
            "sha256": hashlib.sha256("\n".join(sources).encode("utf-8")).hexdigest(),
        },
    }


@dataclass
class _PartManifest:
    """A shard's manifest, written beside the part just before it is renamed into place
    (:class:`~phrasescore.files.AtomicOutput`'s ``before_rename``)."""

    output: str
    shard: Shard
    nbest: str
    options: NBestOptions
    job: dict
    device: str
    reader: _ChunkReader
    writer: _Writer

    def __call__(self, written: str) -> None:
        write_manifest(
            self.output,
            written,
            self.shard,
            self.nbest,
            sum(self.reader.plan),
            self.options.chunk_lines,
            self.writer.hypotheses,
            self.job,
            device=self.device,
            kind=NBEST,
            chunk_sizes=self.reader.plan,
            chunks=self.reader.records,
        )


def _result(output: str, writer: _Writer, seconds: float, reranked: bool, clamped: int):
    """The result of a run, logged."""
    result = NBestResult(
        "<stdout>" if output == "-" else output,
        writer.sentences,
        writer.hypotheses,
        seconds,
        writer.changed if reranked else None,
        clamped,
    )
    log.info(
        "%d hypotheses of %d sentences scored in %.1f s (%.0f hypotheses/s)%s",
        writer.hypotheses,
        writer.sentences,
        seconds,
        result.hypotheses_per_second,
        f"; re-ranking changed the best hypothesis of {writer.changed} sentences"
        if reranked
        else "",
    )
    return result


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
) -> NBestResult:
    """``phrasescore nbest``: :func:`rescore_nbest`, or under torchrun (``WORLD_SIZE`` > 1)
    one shard per rank into a hidden part beside the output, merged by rank 0
    (:func:`phrasescore.runners.shards.run_on_ranks`); rank 0 returns the whole list's result."""
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
        )
    check_torchrun_options(launch, shard, workers)
    if source == "-":
        raise InputError("under torchrun give --source as a file (every rank reads it)")
    _refuse_onto_inputs(nbest, source, model_paths(model_path), options, output, None)
    _check_shard(nbest, output, options)
    check_output_path(output)
    started = time.monotonic()

    score_part = _RankPart(nbest, source, model_path, options, progress and launch.is_main)
    result, merged, (changed,) = run_on_ranks(launch, device, output, score_part, sums=_changed_sum)
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


@dataclass
class _RankPart:
    """What a torchrun rank runs: :func:`rescore_nbest` of its shard into its part."""

    nbest: str
    source: str
    model_path: str | Sequence[str] | None
    options: NBestOptions
    progress: bool

    def __call__(self, part: str, device: str, shard: Shard) -> NBestResult:
        return rescore_nbest(
            self.nbest,
            self.source,
            self.model_path,
            part,
            self.options,
            device,
            self.progress,
            shard=shard,
        )


def _changed_sum(result: NBestResult | None) -> list[int]:
    """What the ranks add up: the sentences whose best hypothesis changed."""
    return [result.changed or 0]


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
    writes (a shard's manifest beside the output too)."""
    refuse_outputs_onto_inputs(
        {
            "n-best list": nbest,
            "--source": source,
            "model": paths,
            "--lm": options.lm,
            "--weights": options.weights,
        },
        {
            "-o": output,
            "-o's manifest": manifest_path(output) if shard is not None and output != "-" else None,
        },
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


def _read_weights(path: str, names: list[str]) -> dict[str, list[float]]:
    """The weights of ``path``, which must weigh each new feature."""
    weights = read_weights(path)
    for name in names:
        if name not in weights:
            raise InputError(
                f"gives no weight for the new feature {name}: add a line "
                f"'{name}= 1.0' (or the weight MERT found) to its [weight] section",
                display_name(path),
            )
        if len(weights[name]) != 1:
            raise InputError(
                f"{name} has one value but {len(weights[name])} weights", display_name(path)
            )
    return weights


def model_paths(model_path: str | Sequence[str] | None) -> list[str]:
    """The model files of ``-m`` (given once, a string; several times, an ensemble)."""
    if model_path is None:
        return []
    return [model_path] if isinstance(model_path, str) else list(model_path)


def _features(options: NBestOptions, device, features: Sequence[FeatureModel]):
    """(name, score(sources, hypotheses) -> values) of each feature to add, in line order:
    the CSLM's first, then the models' (:class:`~phrasescore.jobs.nbest.features.ModelFeatures`,
    one feature per :class:`FeatureModel`); the signatures of the LM and models; and the models'
    scorers (None without a model)."""
    scored = []
    signatures: dict[str, list[str]] = {"lms": [], "models": []}
    scorer = None
    if options.lm:
        lm = load_lm(options.lm, device)
        signatures["lms"].append(lm.signature)
        lm_scorer = LMScorer(lm, device)
        log.info(
            "n-best rescoring with language model %s, feature %s", lm.signature, options.lm_name
        )
        scored.append((options.lm_name, _LMFeature(lm_scorer)))
    if features:
        scorer = ModelFeatures(features, device, options.batch_tokens, options.scoring)
        signatures["models"].extend(scorer.signatures)
        scored.extend(scorer.scorer_features(options.normalize))
    return scored, signatures, scorer


@dataclass
class _LMFeature:
    """The CSLM feature: log p(hypothesis </s> | <s>) of each hypothesis."""

    scorer: LMScorer

    def __call__(self, srcs: list[str], hyps: list[str]) -> np.ndarray:
        return self.scorer.score_sentences(hyps).logprob


def score_chunk(features, scorer: ModelFeatures | None, pairs) -> tuple[list, int] | None:
    """Each feature's values for one chunk's ``(sources, hypotheses)`` (None: another shard's
    chunk), and the model scores it clamped; the same function runs in this process and in
    ``--workers`` processes."""
    if pairs is None:
        return None
    srcs, hyps = pairs
    before = scorer.clamped if scorer is not None else 0
    values = [np.asarray(score(srcs, hyps), dtype=np.float64) for _, score in features]
    return values, (scorer.clamped - before if scorer is not None else 0)


@dataclass
class ChunkScorer:
    """:func:`score_chunk` with the features and scorer of one run: the function run on each
    chunk, here or in a ``--workers`` process (which inherits it by ``fork``)."""

    features: list
    scorer: ModelFeatures | None

    def __call__(self, pairs):
        return score_chunk(self.features, self.scorer, pairs)


def _regroup(entries: list[NBestEntry], chunk: list[list[NBestEntry]]) -> list[list[NBestEntry]]:
    """``entries`` cut into groups of the sizes of ``chunk``'s."""
    groups, position = [], 0
    for group in chunk:
        groups.append(entries[position : position + len(group)])
        position += len(group)
    return groups


class _Writer:
    """Writes the scored groups: as they are, re-ranked by ``weights``, or the 1-best texts."""

    def __init__(
        self, options: NBestOptions, weights: dict | None, n_sources: int, names: list[str]
    ):
        self.options = options
        self.names = names
        """The features added to each line, in order."""
        self.weights = weights
        self.n_sources = n_sources
        self.best_texts: list[str] | None = [""] * n_sources if options.one_best else None
        self.sentences = self.hypotheses = self.changed = 0
        self.last_id = -1
        self.missing: list[int] = []
        """Ids without a hypothesis before the last id seen (:meth:`finish` warns)."""
        self.check_weighed = weights is not None and not names
        """Warn of weights for a feature the list lacks (re-ranking without a model: a feature
        weighed but missing may be the ``-m`` forgotten)."""

    def write_chunk(self, groups: list[list[NBestEntry]], out) -> None:
        for group in groups:
            self._see(group[0].id)
            self.sentences += 1
            self.hypotheses += len(group)
            if self.weights is None:
                out.writelines(e.line() for e in group)
                continue
            if self.check_weighed:
                self._check_weighed(group[0])
            lines, best, was_best = _rerank(group, self.weights, self.options)
            self.changed += best.hypothesis != was_best.hypothesis
            if self.best_texts is not None:
                self.best_texts[group[0].id] = best.hypothesis
            else:
                out.writelines(lines)

    def _check_weighed(self, entry: NBestEntry) -> None:
        listed = {name for name, _ in parse_features(entry.features, entry.path, entry.lineno)}
        missing = [name for name in self.weights if name not in listed and "_" not in name]
        if missing:  # moses.ini weighs features Moses leaves out of lists (UnknownWordPenalty0)
            log.warning(
                "%s: --weights gives %s, which this list lacks (0 in every total): add a model "
                "feature first (nbest -m MODEL --name NAME) if one was meant",
                display_name(entry.path),
                ", ".join(missing),
            )
        self.check_weighed = False  # one entry is enough: every line of a list has the same

    def skip(self, groups: list[list[NBestEntry]]) -> None:
        """Groups another shard writes (only their ids count, for :meth:`finish`)."""
        for group in groups:
            self._see(group[0].id)

    def _see(self, sentence_id: int) -> None:
        """The next group's id: the ids skipped before it are missing."""
        self.missing.extend(gap_ids(self.last_id, sentence_id))
        self.last_id = max(self.last_id, sentence_id)

    def finish(self, out, nbest: str) -> None:
        """Refuse a list that ends before the source; write the 1-best texts."""
        if self.last_id + 1 != self.n_sources:
            ends = "is empty" if self.last_id < 0 else f"ends with sentence id {self.last_id}"
            raise InputError(
                f"the n-best list {ends} but the source has "
                f"{self.n_sources} lines: the list and the source do not match (give exactly "
                "the source lines that were decoded)",
                display_name(nbest),
            )
        if self.missing:  # an empty line keeps the 1-best aligned with the source
            log.warning(
                "%s%s",
                missing_ids_message(nbest, self.missing, self.n_sources),
                " --one-best writes an empty line for each" if self.best_texts is not None else "",
            )
        if self.best_texts is not None:
            out.writelines(text + "\n" for text in self.best_texts)


def _rerank(
    group: list[NBestEntry], weights: dict, options: NBestOptions
) -> tuple[list[str], NBestEntry, NBestEntry]:
    """The lines of one id, new features added, ordered by their new totals (written in the
    total field), the new best entry and the old one (best original total).

    The new features enter the total with their values as written (6 significant digits), so
    the totals can be recomputed from the output.
    """
    totals = weighted_totals(group, weights, options.weights)
    old_best = best_index([float(entry.total) for entry in group])
    order = sorted(range(len(group)), key=lambda i: (-totals[i], i))
    lines = [with_total(group[i], totals[i]).line() for i in order]
    return lines, group[order[0]], group[old_best]
