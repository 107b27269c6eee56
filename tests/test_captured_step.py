"""The captured training step (``train --graphs``): every position of a fixed-shape batch
weighted (0 at padding) gives the loss and gradients of the real positions gathered; the step's
graph mechanics (inputs copied into shared buffers, gradients into fixed ``.grad`` tensors,
shapes captured once) give the uncaptured step's weights to the bit; ``--graphs`` is refused
where it cannot capture. The capture itself on a GPU: tests/test_cuda.py."""

from __future__ import annotations

import copy

import pytest
import torch

from phrasescore.errors import InputError
from phrasescore.model import build_network
from phrasescore.model.config import TrainConfig, preset
from phrasescore.text.corpus import make_batch
from phrasescore.text.vocab import WordVocabulary
from phrasescore.training.captured_step import CapturedTrainingStep
from phrasescore.training.loop import bucketed, clip_gradients, make_optimizer
from phrasescore.training.trainer import Trainer

from .conftest import sample_pairs, train_tiny
from .test_device_engine import ReplayOnTheCpu


def _vocabularies(n: int = 120):
    src, tgt = sample_pairs(n)
    src_words, tgt_words = [s.split() for s in src], [t.split() for t in tgt]
    return src_words, tgt_words, WordVocabulary.build(src_words), WordVocabulary.build(tgt_words)


def _network(arch: str, **config_values):
    src_words, tgt_words, src_vocab, tgt_vocab = _vocabularies()
    config, _ = preset("tiny", arch)
    config.src_vocab_size, config.tgt_vocab_size = len(src_vocab), len(tgt_vocab)
    for key, value in config_values.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    return build_network(config)


def _batches(sizes=(24,), bucket: int = 8, start: int = 0):
    """Bucketed batches of real Multi30k pairs, ``sizes`` pairs each, one after the other."""
    src_words, tgt_words, src_vocab, tgt_vocab = _vocabularies()
    out = []
    for size in sizes:
        src = [src_vocab.encode(s) for s in src_words[start : start + size]]
        tgt = [tgt_vocab.encode(t) for t in tgt_words[start : start + size]]
        out.append(bucketed(make_batch(src, tgt), bucket))
        start += size
    return out


def _grads(network) -> list[torch.Tensor]:
    return [p.grad.clone() for p in network.parameters()]


@pytest.mark.parametrize(
    ("arch", "values"),
    [
        ("cho", {}),
        ("attention", {}),
        ("lstm", {}),
        ("attention", {"self_normalize": 0.1}),
        ("cho", {"chunked_output": True}),
    ],
)
def test_weighted_positions_give_the_gathered_loss_and_gradients(arch, values):
    """A bucketed batch (padded rows and positions): the loss over every position with weight
    0 at padding equals the loss over the real positions gathered, its NLL, Σ|log Z| and every
    parameter's gradient within float rounding."""
    chunked = values.pop("chunked_output", False)
    network = _network(arch, **values)
    network.chunked_output = chunked
    (batch,) = _batches()
    assert (batch.tgt_out == 0).any() and batch.src.shape[0] % 8 == 0  # padding to weigh out
    results = []
    for mask in (batch.tgt_out != 0, (batch.tgt_out != 0).float()):
        network.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        terms = network.loss_terms(
            batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, mask, log_z=True
        )
        (terms.objective / batch.n_tgt_tokens).backward()
        results.append((terms, _grads(network)))
    (gathered, gathered_grads), (weighted, weighted_grads) = results
    for a, b in zip(gathered, weighted, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert float(weighted.nll) > 0
    for a, b in zip(gathered_grads, weighted_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("per_sentence", [False, True])
def test_the_captured_step_makes_the_eager_step_s_clipped_gradients(per_sentence):
    """The same dropout masks (the same seed) and the same clipped gradients as the loop's
    eager step over the gathered positions, divided by the batch's tokens or its pairs."""
    network = _network("attention", dropout=0.2)
    (batch,) = _batches()
    pairs = int((batch.tgt_lengths > 0).sum())
    network.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    terms = network.loss_terms(
        batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, batch.tgt_out != 0
    )
    (terms.objective / (pairs if per_sentence else batch.n_tgt_tokens)).backward()
    clip_gradients(list(network.parameters()), 0.5)
    expected = _grads(network)
    step = CapturedTrainingStep(network, torch.device("cpu"), False, 0.5, per_sentence)
    torch.manual_seed(1)
    nll = step(batch)
    torch.testing.assert_close(nll, terms.nll, rtol=1e-5, atol=1e-5)
    for a, b in zip(expected, _grads(network), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_replayed_steps_train_the_uncaptured_step_s_weights_to_the_bit():
    """Batches of three shapes, the larger ones later (the input buffers grow and the graphs
    are captured again), each step's gradients from a replay into the fixed ``.grad`` tensors
    and then Adam's update: after every step the weights are those of the same steps run
    uncaptured, bit for bit; each shape captured once per buffer size."""
    eager_net = _network("attention", dropout=0.0)
    replay_net = copy.deepcopy(eager_net)
    tcfg = TrainConfig(optimizer="adam", learning_rate=3e-3)
    eager = CapturedTrainingStep(eager_net, torch.device("cpu"), False, 1.0)
    replayed = CapturedTrainingStep(replay_net, torch.device("cpu"), False, 1.0)
    replayed.captured = ReplayOnTheCpu()
    optimizers = make_optimizer(eager_net, tcfg), make_optimizer(replay_net, tcfg)
    batches = _batches((8, 8, 16, 8, 32, 16, 32))
    assert len({tuple(b.src.shape) + tuple(b.tgt_out.shape) for b in batches}) >= 3
    for batch in batches:
        nlls = eager(batch), replayed(batch)
        for optimizer in optimizers:
            optimizer.step()
        assert nlls[0].item() == nlls[1].item()
        for a, b in zip(eager_net.parameters(), replay_net.parameters(), strict=True):
            assert torch.equal(a, b)
    graph_replays = sum(graph.replays for graph, _, _ in replayed.captured.graphs.values())
    assert graph_replays >= 1 and replayed.captured.captures < len(batches)


@pytest.mark.parametrize(
    ("arch", "flags", "message"),
    [
        ("attention", {"bucket": 8}, "needs --device cuda, not cpu"),
        ("lstm", {"bucket": 8}, "--arch lstm packs its rows for cuDNN"),
    ],
)
def test_graphs_are_refused_where_they_cannot_capture(tmp_path, corpus_files, arch, flags, message):
    """--graphs on the CPU, or of an encoder that packs: one line, before any training."""
    with pytest.raises(InputError, match=message):
        train_tiny(tmp_path / "m.safetensors", *corpus_files, arch=arch, graphs=True, **flags)
    assert not list(tmp_path.iterdir())


def test_graphs_need_cuda_buckets_and_one_process():
    """The job's check of --graphs, each refusal in one line naming the flag to change."""
    from phrasescore.jobs.training.train import _check_graphs
    from phrasescore.model.config import ModelConfig

    cuda, attention = torch.device("cuda"), ModelConfig(arch="attention")
    _check_graphs(TrainConfig(graphs=True, bucket=8), attention, cuda, None)  # accepted
    _check_graphs(TrainConfig(graphs=False), attention, torch.device("cpu"), object())
    refusals = [
        (TrainConfig(graphs=True), attention, None, "needs --bucket N"),
        (TrainConfig(graphs=True, bucket=8), attention, object(), "without torchrun"),
        (TrainConfig(graphs=True, bucket=8, compile=True), attention, None, "--compile"),
        (TrainConfig(graphs=True, bucket=8), ModelConfig(arch="cho", recurrence="fused"), None,
         "--recurrence fused packs"),
    ]  # fmt: skip
    for tcfg, mcfg, launch, message in refusals:
        with pytest.raises(InputError, match=message):
            _check_graphs(tcfg, mcfg, cuda, launch)


def test_a_training_with_the_captured_step_learns_as_the_eager_one_and_resumes_exactly(
    tmp_path, corpus_files, monkeypatch
):
    """The trainer with its step through :class:`CapturedTrainingStep` (uncaptured here: on
    the CPU its work runs directly): the validation perplexities of the eager training within
    float rounding, and a run stopped and resumed ends with the uninterrupted run's weights."""
    from phrasescore.jobs.training import train as train_job

    monkeypatch.setattr(train_job, "_check_graphs", lambda *args: None)
    common = dict(arch="attention", valid_every=10, learning_rate=3e-3, seed=3, bucket=8)
    eager = train_tiny(tmp_path / "eager.safetensors", *corpus_files, max_steps=30, **common)
    whole = tmp_path / "graphs.safetensors"
    graphs = train_tiny(whole, *corpus_files, max_steps=30, graphs=True, **common)
    for a, b in zip(eager.history, graphs.history, strict=True):
        assert a["valid_ppl"] == pytest.approx(b["valid_ppl"], rel=1e-3)
    part = tmp_path / "resumed.safetensors"
    train_tiny(part, *corpus_files, max_steps=20, graphs=True, **common)
    train_tiny(part, *corpus_files, max_steps=30, graphs=True, resume=True, **common)
    a = Trainer.read_checkpoint(f"{whole}.checkpoint")
    b = Trainer.read_checkpoint(f"{part}.checkpoint")
    assert a["meta"]["position"]["step"] == b["meta"]["position"]["step"] == 30
    for name, tensor in a["network"].items():
        assert torch.equal(tensor, b["network"][name]), name
