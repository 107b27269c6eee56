"""``info``, ``translate``, ``evaluate``, ``sample``, ``represent``, ``compare``, ``align``: the
commands of :mod:`phrasescore.jobs.analysis`."""

from __future__ import annotations

import click

from phrasescore.cli.group import cli, echo
from phrasescore.cli.options import (
    NON_NEGATIVE,
    NON_NEGATIVE_FLOAT,
    POSITIVE,
    SEED,
    RegistryChoice,
    as_list,
    bleu_tokenizers,
    device_option,
    model_option,
    no_progress_option,
    take,
    threads_option,
)


@cli.command("info", short_help="Describe a model or CSLM file.")
@click.argument("path", metavar="MODEL")
def info_command(path):
    """Print what a model file (or a CSLM file) is: architecture, sizes, vocabularies, training."""
    from phrasescore.jobs.analysis.info import describe_file

    echo(describe_file(path))


@cli.command("translate", short_help="Translate text with beam search.")
@click.argument("input_path", metavar="[INPUT]", default="-", required=False)
@model_option()
@click.option("-o", "--output", default="-", show_default=True, help="Output file (.gz: gzip).")
@click.option("--beam", type=POSITIVE, default=5, show_default=True, help="Beam size (1: greedy).")
@click.option(
    "--nbest", type=POSITIVE, help="Write a Moses n-best list of K hypotheses per sentence."
)
@click.option("--max-length", type=POSITIVE, help="Most output tokens (default 2 x source + 10).")
@click.option(
    "--length-penalty",
    type=NON_NEGATIVE_FLOAT,
    default=1.0,
    show_default=True,
    help="GNMT alpha: rank by log p / ((5 + n) / 6)^alpha; 0 ranks by log p.",
)
@click.option("--no-unk", "forbid_unk", is_flag=True, help="Never output the unknown-word symbol.")
@click.option("--detokenize", is_flag=True, help="Detokenise the output (sacremoses).")
@click.option("--reference", help="Reference translations: print BLEU and chrF (sacrebleu).")
@click.option(
    "--bleu-tokenize",
    type=RegistryChoice(bleu_tokenizers),
    default="13a",
    show_default=True,
    help="sacrebleu tokenizer of --reference's BLEU (none: the text is tokenised already, as "
    "ab and multi-bleu.perl score it).",
)
@click.option(
    "--name", "feature_name", default="RNNEncDec0", show_default=True, help="n-best feature name."
)
@click.option(
    "--batch-size", type=POSITIVE, default=32, show_default=True, help="Sentences per batch."
)
@device_option
@threads_option
@no_progress_option
def translate_command(**params):
    """Translate INPUT (a file, or - for stdin) line by line with beam search."""
    from phrasescore.jobs.analysis.translate import TranslateOptions, translate_file

    flags = take(params, TranslateOptions.from_flags, TranslateOptions)
    echo(translate_file(options=TranslateOptions.from_flags(**flags), **params), err=True)


@cli.command("evaluate", short_help="BLEU and chrF of hypotheses (sacrebleu).")
@click.argument("hypothesis_path", metavar="HYPOTHESES")
@click.argument("reference_path", metavar="REFERENCE")
@click.option(
    "--tokenize",
    type=RegistryChoice(bleu_tokenizers),
    default="13a",
    show_default=True,
    help="sacrebleu's BLEU tokenizer.",
)
@click.option("--lowercase", is_flag=True, help="Case-insensitive BLEU and chrF.")
def evaluate_command(**params):
    """BLEU and chrF of HYPOTHESES against REFERENCE (sacrebleu), with sacrebleu's signatures."""
    from phrasescore.jobs.analysis.evaluate import evaluate_files

    echo(evaluate_files(**params))


@cli.command("sample", short_help="Sample target phrases for source phrases.")
@click.argument("arguments", nargs=-1, required=True, metavar="PHRASE... | -")
@model_option()
@click.option(
    "-n",
    "--samples",
    type=NON_NEGATIVE,
    default=100,
    show_default=True,
    help="Samples drawn (0: with --beam, the beam's targets alone).",
)
@click.option(
    "--top", type=POSITIVE, default=10, show_default=True, help="Targets kept per phrase."
)
@click.option("--beam", is_flag=True, help="Add the beam-search --top best to the candidates.")
@click.option("--phrase-table", help="Moses table: mark each pair as in the table or new.")
@click.option("--seed", type=SEED, default=1, show_default=True, help="Sampling seed.")
@click.option("--max-length", type=POSITIVE, help="Most target tokens (default 2 x source + 10).")
@click.option("--no-unk", "forbid_unk", is_flag=True, help="Never output the unknown-word symbol.")
@device_option
@threads_option
def sample_command(**params):
    """Best target phrases for each source PHRASE by sampling (Cho et al. 2014, Table 3).

    Prints one line per target: source, log p, target and, with --phrase-table, 'in-table' or
    'new', tab-separated.
    """
    from phrasescore.jobs.analysis.sample import SampleOptions, run_sample

    if params["samples"] == 0 and not params["beam"]:
        raise click.UsageError("nothing to do: -n 0 without --beam")
    options = SampleOptions(**take(params, SampleOptions))
    echo(run_sample(options=options, **params))


@cli.command("represent", short_help="Phrase vectors and word embeddings of a model.")
@click.argument("phrases_path", metavar="[PHRASES]", required=False)
@model_option()
@click.option(
    "-o",
    "--output",
    "output_prefix",
    required=True,
    help="Output prefix: PREFIX.npy and PREFIX.tsv.",
)
@click.option("--phrase-table", help="Take the most frequent phrases of a Moses table instead.")
@click.option(
    "--side",
    type=click.Choice(["source", "target"]),
    default="source",
    show_default=True,
    help="Side of --phrase-table.",
)
@click.option(
    "--limit", type=POSITIVE, default=1000, show_default=True, help="Phrases from --phrase-table."
)
@click.option(
    "--min-words", type=POSITIVE, default=1, show_default=True, help="Table phrases of >= N words."
)
@click.option(
    "--words", type=NON_NEGATIVE, default=0, help="Also write the N most frequent words' vectors."
)
@click.option("--map", "map_path", help="Draw a 2-D map of the phrase vectors (PNG).")
@click.option("--word-map", "word_map_path", help="Draw a 2-D map of the source words (PNG).")
@click.option(
    "--neighbours", type=NON_NEGATIVE, default=0, help="Print the K nearest phrases (cosine)."
)
@click.option(
    "--query",
    "queries",
    multiple=True,
    callback=as_list,
    help="Neighbours of this phrase only; repeat.",
)
@click.option(
    "--labels", type=NON_NEGATIVE, default=150, show_default=True, help="Most labels per map."
)
@click.option(
    "--method",
    type=click.Choice(["auto", "tsne", "pca"]),
    default="auto",
    show_default=True,
    help="Map projection (auto: t-SNE if scikit-learn is installed, else PCA).",
)
@click.option("--seed", type=SEED, default=1, show_default=True, help="t-SNE seed.")
@device_option
@threads_option
def represent_command(**params):
    """Phrase vectors (the encoder's summary c) and word embeddings of a model (Cho et al.
    2014, Fig. 4-5): PHRASES is a file of phrases, one per line (- for stdin).

    With --neighbours, prints one line per neighbour: query, rank, cosine, phrase (tab-separated).
    """
    from phrasescore.jobs.analysis.represent import RepresentOptions, represent

    options = RepresentOptions(**take(params, RepresentOptions))
    echo(represent(options=options, **params))


@cli.command("compare", short_help="A model's top targets beside a phrase table's.")
@click.argument("table")
@model_option()
@click.option("--sources", "sources_path", help="Source phrases to compare, one per line.")
@click.option(
    "--sample",
    type=POSITIVE,
    default=10,
    show_default=True,
    help="Else: sample N source phrases...",
)
@click.option(
    "--min-targets", type=POSITIVE, default=5, show_default=True, help="...with >= K targets..."
)
@click.option("--min-words", type=POSITIVE, default=1, show_default=True, help="...and >= W words.")
@click.option(
    "--top", type=POSITIVE, default=5, show_default=True, help="Targets listed per source."
)
@click.option(
    "--column", type=POSITIVE, default=3, show_default=True, help="Table score to compare (φ(e|f))."
)
@click.option("--proposals", type=NON_NEGATIVE, default=0, help="Draw N model samples per source.")
@click.option("--scatter", "scatter_path", help="Scatter plot of model vs table scores (PNG).")
@click.option(
    "--max-pairs",
    type=NON_NEGATIVE,
    default=20000,
    show_default=True,
    help="Pairs sampled for the scatter and correlations (0: all).",
)
@click.option("--seed", type=SEED, default=1, show_default=True, help="Sampling seed.")
@device_option
@threads_option
def compare_command(**params):
    """The model's top targets beside the phrase TABLE's (Cho et al. 2014, Table 2-3, Fig. 3),
    and the rank correlations of its log p with the table's columns; markdown on stdout."""
    from phrasescore.jobs.analysis.compare import CompareOptions, compare

    options = CompareOptions(**take(params, CompareOptions))
    echo(compare(options=options, **params))


@cli.command("align", short_help="Word alignments from an attention model.")
@click.argument("src_path", metavar="SOURCE")
@click.argument("tgt_path", metavar="TARGET")
@model_option("Attention model file.")
@click.option("-o", "--output", default="-", show_default=True, help="Output file (.gz: gzip).")
@click.option("--plot", "plot_dir", help="Also draw each pair's alignment matrix: DIR/NNNNNN.png.")
@click.option("--batch-size", type=POSITIVE, default=32, show_default=True, help="Pairs per batch.")
@device_option
@threads_option
def align_command(**params):
    """Word alignments of SOURCE TARGET (parallel files) from an attention model's weights.

    One line per pair, Moses 'i-j' (source word i, target word j, 0-based): each target word to
    the source word it attends to most, end-of-sentence excluded (Bahdanau et al. 2015, Fig. 3).
    """
    from phrasescore.jobs.analysis.align import align_files

    echo(align_files(**params), err=True)
