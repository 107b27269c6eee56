"""``train`` and ``train-lm``: the commands of :mod:`phrasescore.jobs.training`."""

from __future__ import annotations

import click

from phrasescore.cli.group import cli, echo_on_rank_0
from phrasescore.cli.options import (
    DROPOUT,
    FRACTION,
    NON_NEGATIVE_FLOAT,
    POSITIVE,
    POSITIVE_FLOAT,
    RegistryChoice,
    architectures,
    lm_presets,
    optimizers,
    presets,
    take,
    text_options,
    training_options,
)


@cli.command("train", short_help="Train an encoder-decoder on parallel text (or a table).")
@click.argument("source", required=False)
@click.argument("target", required=False)
@click.option(
    "-o", "--output", "model_path", required=True, help="Model file to write (.safetensors)."
)
@click.option("--phrase-table", help="Train on the distinct phrase pairs of a Moses table instead.")
@click.option(
    "--inverse",
    is_flag=True,
    help="With --phrase-table: train p(source phrase | target phrase) on the pairs reversed, "
    "for rescore --inverse-model (give --src-lang/--tgt-lang of that direction).",
)
@click.option(
    "--valid", nargs=2, metavar="SRC TGT", help="Validation files (else a held-out slice)."
)
@click.option(
    "--preset",
    type=RegistryChoice(presets),
    default="default",
    show_default=True,
    help="Model and training sizes of the architecture: default (CPU-sized), paper (the "
    "paper's sizes, for a GPU; not for transformer) or tiny (a seconds-long smoke test: 64 "
    "hidden units, 600-token batches; scores are not useful). docs/commands.md: Presets.",
)
@click.option(
    "--arch",
    type=RegistryChoice(architectures),
    default="cho",
    show_default=True,
    help="cho: RNN Encoder-Decoder (Cho et al. 2014); lstm: deep LSTM, source reversed "
    "(Sutskever et al. 2014); attention: RNNsearch (Bahdanau et al. 2015); transformer: "
    "self-attention (Vaswani et al. 2017; presets default and tiny). Stored in the model.",
)
@click.option(
    "--layers",
    type=POSITIVE,
    help="lstm, transformer: layers of the encoder and of the decoder (default: the preset's).",
)
@click.option(
    "--heads",
    type=POSITIVE,
    help="transformer: attention heads, dividing --hidden-dim (default: the preset's).",
)
@click.option(
    "--feedforward-dim",
    type=POSITIVE,
    help="transformer: units of each layer's feed-forward network (default: the preset's).",
)
@click.option(
    "--embedding-dim",
    type=POSITIVE,
    help="Word embedding size, source and target (default: the preset's; the transformer's "
    "are --hidden-dim wide). Stored in the model.",
)
@click.option(
    "--hidden-dim",
    type=POSITIVE,
    help="Hidden units of the encoder and decoder recurrences, or the transformer's layers "
    "(default: the preset's). Stored in the model.",
)
@click.option(
    "--maxout-units",
    type=POSITIVE,
    help="cho and attention: maxout units of the output layer (default: the preset's).",
)
@click.option(
    "--output-rank",
    type=POSITIVE,
    help="Rank of the output layer: the size of the vector the vocabulary projection reads, "
    "at most --maxout-units (cho, attention) or --hidden-dim (lstm, transformer; equal: no "
    "factorisation) "
    "(default: the preset's).",
)
@click.option(
    "--no-reverse",
    "reverse_source",
    is_flag=True,
    flag_value=False,
    default=None,
    help="lstm: read the source in its own order, not reversed.",
)
@click.option(
    "--reverse-target",
    is_flag=True,
    default=None,
    help="Right-to-left model: predict the target words last to first (a second re-ranking "
    "feature beside the left-to-right model). Stored in the model: every command gives and "
    "gets words in their natural order.",
)
@click.option(
    "--self-normalize",
    type=NON_NEGATIVE_FLOAT,
    metavar="ALPHA",
    help="Add ALPHA (log Z)² per target token to the loss (Devlin et al. 2014), so that "
    "rescore/nbest --scoring self-normalized can skip the softmax; 0 (default): off. Devlin et "
    "al. used 0.1. Stored in the model.",
)
@click.option(
    "--dropout",
    type=DROPOUT,
    metavar="P",
    help="Dropout rate on the embeddings and the output layer's input (default: the preset's, "
    "0.2 for default, none for paper). Stored in the model (scoring runs without it).",
)
@click.option(
    "--init",
    type=click.Choice(["fan-in", "paper"]),
    help="Initialisation: fan-in (PyTorch's scales; the default preset) or paper (N(0, 0.01²), "
    "lstm U(±0.08); the paper preset).",
)
@click.option(
    "--recurrence",
    type=click.Choice(["written", "fused"]),
    help="cho and attention: the GRUs written out, exactly Cho et al. eq. 5-8 (written, every "
    "preset's), or torch.nn.GRU for the encoder and cho's decoder (fused: one cuDNN call per "
    "sentence on a GPU; its reset gate acts after the recurrent product; not with --preset "
    "paper). Stored in the model.",
)
@click.option("--src-lang", default="en", show_default=True, help="Source language (tokeniser).")
@click.option("--tgt-lang", default="fr", show_default=True, help="Target language (tokeniser).")
@text_options
@click.option("--vocab-size", type=POSITIVE, help="Words per side (default 15000).")
@click.option(
    "--subwords",
    type=click.IntRange(min=5),
    help="Use a sentencepiece vocabulary of N pieces per side.",
)
@click.option(
    "--max-length", type=POSITIVE, help="Skip pairs longer than this (tokens; default 50)."
)
@click.option("--optimizer", type=RegistryChoice(optimizers), help="Override the preset.")
@click.option(
    "--lr",
    "learning_rate",
    type=POSITIVE_FLOAT,
    help="Learning rate (Adam: 1e-3, 2e-3 for the attention default; Adadelta: 1.0; SGD: 0.7).",
)
@click.option(
    "--lr-plateau-factor",
    type=FRACTION,
    metavar="F",
    help="Multiply the learning rate by F after each validation without a new best "
    "(default preset: 0.5; paper presets: never; 1: never).",
)
@click.option(
    "--lr-halve-after",
    "lr_halve_after_epochs",
    type=NON_NEGATIVE_FLOAT,
    metavar="EPOCHS",
    help="Halve the learning rate once EPOCHS epochs are done (may be fractional), then every "
    "--lr-halve-every epochs (Sutskever et al.: 5; default presets: never).",
)
@click.option(
    "--lr-halve-every",
    "lr_halve_every_epochs",
    type=POSITIVE_FLOAT,
    metavar="EPOCHS",
    help="With --lr-halve-after: epochs between halvings (default 0.5).",
)
@click.option(
    "--compile",
    is_flag=True,
    default=None,
    help="Run the written-out recurrences' steps (the GRU of eq. 5-8, the attention decoder's "
    "step) through torch.compile: the same equations in fewer kernels (off by default). Not a "
    "speed-up: measured, the compilation is not won back within a 10-minute training on the "
    "CPU or on a GPU (docs/benchmarks.md); it is there to study compiled steps "
    "(PHRASESCORE_COMPILE_MODE=reduce-overhead: CUDA graphs, with --bucket).",
)
@click.option(
    "--chunked-output",
    is_flag=True,
    default=None,
    help="Fuse the loss's vocabulary projection and log-sum-exp over row chunks: no [tokens x "
    "vocabulary] logits kept for the backward, at the price of one more product (off by "
    "default).",
)
@click.option(
    "--graphs",
    is_flag=True,
    default=None,
    help="Capture each batch shape's forward and backward in a CUDA graph and replay it: one "
    "launch a step instead of thousands of small kernels (--device cuda, with --bucket; off by "
    "default). The same loss and gradients up to float rounding; docs/commands.md.",
)
@click.option(
    "--bucket",
    type=click.IntRange(min=0),
    metavar="N",
    help="Pad each batch's widths and row count to multiples of N, so that shapes repeat (for "
    "--compile and CUDA graphs; default 0: off). Padding never enters the loss.",
)
@training_options(
    "MODEL",
    "Target tokens per batch.",
    POSITIVE_FLOAT,
    "Maximum epochs (may be fractional, e.g. 7.5).",
)
def train_command(init, **params):
    """Train an encoder-decoder (--arch) on SOURCE TARGET (parallel files, plain or gzip)."""
    from phrasescore.jobs.training.train import run_training
    from phrasescore.model.config import ModelConfig, TrainConfig, initialisation_overrides

    job = take(params, run_training)
    overrides = take(params, TrainConfig)
    model_overrides = take(params, ModelConfig)
    if params:
        raise TypeError(f"train: options that no configuration takes: {sorted(params)}")
    model_overrides.update(initialisation_overrides(init, job["arch"]))
    # threads=None: --threads (its callback) has set them while the options were parsed
    result = run_training(**job, threads=None, overrides=overrides, model_overrides=model_overrides)
    echo_on_rank_0(result)


@cli.command("train-lm", short_help="Train the CSLM target language model.")
@click.argument("corpus")
@click.option("-o", "--output", "model_path", required=True, help="LM file to write.")
@click.option("--valid", help="Validation text (else a held-out slice of CORPUS).")
@click.option(
    "--preset",
    type=RegistryChoice(lm_presets),
    default="default",
    show_default=True,
    help="Sizes (paper: order 7, 512-dim embeddings, 3072-1536-1024 relu layers).",
)
@click.option(
    "--order", type=click.IntRange(min=2), help="n of the n-gram model (default: the preset's)."
)
@click.option("--lang", default="fr", show_default=True, help="Language (tokeniser).")
@text_options
@click.option("--vocab-size", type=POSITIVE, help="Words in the vocabulary (default 15000).")
@click.option("--max-length", type=POSITIVE, help="Skip longer training sentences (default 100).")
@click.option("--lr", "learning_rate", type=POSITIVE_FLOAT, help="Learning rate (Adam).")
@training_options("LM", "Tokens per batch.", POSITIVE, "Maximum epochs.")
def train_lm_command(**params):
    """Train the CSLM target language model (Schwenk 2007) on CORPUS (target-language text)."""
    from phrasescore.jobs.training.train_lm import run_lm_training
    from phrasescore.model.config import TrainConfig

    overrides = take(params, TrainConfig)
    echo_on_rank_0(run_lm_training(**params, overrides=overrides))
