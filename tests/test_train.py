"""Training: the model learns, files are exact, resume is exact, foreign files are refused."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from phrasescore.bundle import load_model, save_model
from phrasescore.engine.scoring import PairScorer
from phrasescore.errors import ModelFileError
from phrasescore.model.config import TrainConfig
from phrasescore.training.data import TrainingData, prepare_data
from phrasescore.training.trainer import Trainer

from .conftest import TEXT, HostReads, run_cli, sample_pairs, train_tiny, write_lines


def _train(tmp_path, src, tgt, resume=False, **overrides):
    path = str(tmp_path / "m.safetensors")
    kw = dict(seed=5, valid_every=1000, learning_rate=1e-2)
    kw.update(overrides)
    return path, train_tiny(path, src, tgt, valid=(src, tgt), resume=resume, **kw)


def test_tiny_model_overfits_20_real_pairs(tmp_path):
    src, tgt = sample_pairs(20)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    _, result = _train(
        tmp_path, s, t, max_steps=250, batch_tokens=2000, valid_every=250, epochs=1000
    )
    assert result.unigram_valid_ppl > 50
    assert result.best_valid_ppl < 1.5  # near-zero loss: < 0.41 nats per token


def test_save_load_gives_identical_scores(tiny_model_path, tmp_path):
    model = load_model(tiny_model_path)
    src, tgt = sample_pairs(30)
    before = PairScorer(model).score_phrases(src, tgt).logprob
    copy = str(tmp_path / "copy.safetensors")
    signature = save_model(copy, model)
    assert signature == model.signature
    after = PairScorer(load_model(copy)).score_phrases(src, tgt).logprob
    assert (before == after).all()
    assert (before < 0).all() and math.isfinite(float(before.sum()))


def test_scores_sum_token_logprobs_including_eos(tiny_model_path):
    model = load_model(tiny_model_path)
    src, tgt = sample_pairs(5)
    scored = PairScorer(model).score_phrases(src, tgt, per_token=True)
    for i, line in enumerate(tgt):
        assert len(scored.token_logprobs[i]) == len(line.split()) + 1
        assert scored.token_logprobs[i].sum() == pytest.approx(scored.logprob[i], abs=1e-9)
    assert list(scored.n_tokens) == [len(t.split()) + 1 for t in tgt]


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path):
    src, tgt = sample_pairs(60)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    (tmp_path / "full").mkdir()
    (tmp_path / "parts").mkdir()
    common = dict(batch_tokens=300, valid_every=4, seed=9, learning_rate=3e-3)
    full, _ = _train(tmp_path / "full", s, t, max_steps=12, **common)
    part, _ = _train(tmp_path / "parts", s, t, max_steps=7, **common)
    _train(tmp_path / "parts", s, t, max_steps=12, resume=True, **common)
    a = Trainer.read_checkpoint(full + ".checkpoint")
    b = Trainer.read_checkpoint(part + ".checkpoint")
    assert a["meta"]["position"]["step"] == b["meta"]["position"]["step"] == 12
    for name, tensor in a["network"].items():
        assert torch.equal(tensor, b["network"][name]), name


def test_phrase_table_source_yields_each_distinct_pair_once(tmp_path):
    table = TEXT / "multi30k-phrase-table-sample.gz"
    import gzip

    lines = gzip.open(table, "rt", encoding="utf-8").read().splitlines(True)
    doubled = tmp_path / "pt"
    doubled.write_text("".join(lines + lines[:25]), encoding="utf-8")
    distinct = {tuple(x.strip() for x in line.split("|||")[:2]) for line in lines}
    tcfg = TrainConfig(valid_fraction=0.1, seed=1)
    *_, train, valid = prepare_data(TrainingData(phrase_table=str(doubled)), tcfg)
    assert len(train) + len(valid) == len(distinct)


def test_default_preset_trains_with_fan_in_init_and_paper_keeps_the_papers(tmp_path):
    """The default preset initialises with fan-in scales, on phrase pairs and
    on sentences; the paper preset keeps Cho et al.'s N(0, 0.01²)."""
    from phrasescore.jobs.training.train import run_training

    def trained_init(preset, **files):
        path = tmp_path / f"{preset}-{len(files)}.safetensors"
        run_training(
            model_path=str(path),
            valid=None,
            preset=preset,
            src_lang="en",
            tgt_lang="fr",
            tokenize=False,
            lowercase=False,
            device="cpu",
            amp=False,
            threads=1,
            resume=False,
            overrides=dict(max_steps=1, valid_every=1, batch_tokens=200, valid_max_pairs=5),
            **{"source": None, "target": None, "phrase_table": None, **files},
        )
        return load_model(str(path)).network.config.init

    table = str(TEXT / "multi30k-phrase-table-sample.gz")
    src, tgt = sample_pairs(20)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    assert trained_init("default", phrase_table=table) == "fan_in"
    assert trained_init("tiny", phrase_table=table) == "cho"
    assert trained_init("default", source=s, target=t) == "fan_in"
    assert trained_init("paper", source=s, target=t) == "cho"


def test_phrase_pairs_start_the_cho_default_preset_at_2e_3():
    """`train --phrase-table` (the column's model): Adam at 2e-3 in the cho default preset
    (measured, docs/benchmarks.md); sentence-level cho, lstm and the paper preset keep their
    rates, and --lr or another --optimizer overrides it as for any preset."""
    from phrasescore.jobs.training.train import _configure

    def rate(preset="default", arch="cho", pairs=True, **overrides) -> float:
        return _configure(preset, arch, overrides, None, False, pairs)[1].learning_rate

    assert rate() == rate(optimizer="adam") == 2e-3
    assert rate(pairs=False) == rate(arch="lstm") == 1e-3
    assert rate(preset="paper") == rate(preset="paper", pairs=False) == 1.0  # Adadelta's
    assert rate(learning_rate=1e-3) == 1e-3
    assert rate(optimizer="sgd") == 0.7


def test_foreign_and_damaged_model_files_are_refused(tmp_path, tiny_model_path):
    text = tmp_path / "text.safetensors"
    text.write_text("hello\n")
    with pytest.raises(ModelFileError, match="not a phrasescore model"):
        load_model(str(text))
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain), metadata={"format": "other"})
    with pytest.raises(ModelFileError, match="not a phrasescore model"):
        load_model(str(plain))
    raw = open(tiny_model_path, "rb").read()
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(raw[:-8] + bytes(8))
    with pytest.raises(ModelFileError, match="signature"):
        load_model(str(damaged))
    proc = subprocess.run(
        [sys.executable, "-m", "phrasescore", "info", str(text)], capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "not a phrasescore model" in proc.stderr


def test_info_describes_the_model(tiny_model_path):
    proc = subprocess.run(
        [sys.executable, "-m", "phrasescore", "info", tiny_model_path],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "architecture: cho" in proc.stdout
    assert load_model(tiny_model_path).signature in proc.stdout


def test_parallel_files_of_different_lengths_are_an_error(tmp_path):
    src, tgt = sample_pairs(20)
    s = write_lines(tmp_path / "a.en", src)
    t = write_lines(tmp_path / "a.fr", tgt[:15])
    proc = subprocess.run(
        [sys.executable, "-m", "phrasescore", "train", s, t, "-o", str(tmp_path / "m.st")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "20" in proc.stderr and "15" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "m.st").exists()


@pytest.mark.parametrize(
    "sig, code", [("SIGINT", 130), ("SIGTERM", 143)], ids=["ctrl-c", "sigterm"]
)
def test_ctrl_c_saves_a_checkpoint_that_resume_continues(tmp_path, corpus_files, sig, code):
    """Ctrl-C, and SIGTERM (what Slurm sends before a job's time limit), save a checkpoint."""
    import signal

    model = tmp_path / "m.safetensors"
    cmd = [
        sys.executable,
        "-m",
        "phrasescore",
        "train",
        *corpus_files,
        "-o",
        str(model),
        "--preset",
        "tiny",
        "--max-steps",
        "100000",
        "--valid-every",
        "5",
        "--seed",
        "2",
        # no early stopping: the run only ends by the signal, however late the load lets it come
        "--patience",
        "1000000",
    ]
    # SIGINT back to its default in the child: a suite started in the background by a
    # non-interactive shell (`make test &`, CI wrappers) inherits SIGINT ignored, and Python then
    # never raises KeyboardInterrupt (the run went on to its end in such a loop)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # SIGINT once the first validation was logged: the training loop is running then, whatever
    # the machine's load (no sleep decides the outcome).
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if ", validation perplexity" in line:
            break
    assert ", validation perplexity" in "".join(seen), "".join(seen)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    err = "".join(seen) + err
    assert proc.returncode == code, err
    assert "continue with --resume" in err and "Traceback" not in err
    step = Trainer.read_checkpoint(str(model) + ".checkpoint")["meta"]["position"]["step"]
    assert step > 0
    again = cmd[:]  # the same command, a budget changed (what a resume may change)
    again[again.index("--max-steps") + 1] = str(step + 3)
    resumed = subprocess.run(again + ["--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    after = Trainer.read_checkpoint(str(model) + ".checkpoint")["meta"]["position"]["step"]
    assert after == step + 3


def test_no_daemon_thread_is_left_to_race_interpreter_shutdown(tmp_path, corpus_files):
    # tqdm's monitor thread is signalled but never joined at exit; racing finalisation it once
    # aborted an interrupted `train` ("PyThreadState_Get: ... GIL held", code -6).
    script = (
        "import sys, threading\n"
        "from phrasescore.cli import main\n"
        f"sys.argv = ['phrasescore', 'train', *{list(corpus_files)!r}, '-o', "
        f"{str(tmp_path / 'm.st')!r}, '--preset', 'tiny', '--max-steps', '2']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(t.name for t in threading.enumerate() if t.daemon))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout


def test_inverse_phrase_table_training_reads_each_pair_reversed(tmp_path):
    """``train --phrase-table T --inverse``: the pairs of p(source phrase | target phrase)."""
    from phrasescore.text.corpus import read_phrase_pairs
    from phrasescore.text.tokenize import TextNormalizer

    table = str(TEXT / "multi30k-phrase-table-sample.gz")
    en, fr = TextNormalizer("en"), TextNormalizer("fr")
    direct = list(read_phrase_pairs(table, en, fr, 50))
    inverse = list(read_phrase_pairs(table, fr, en, 50, inverse=True))
    assert len(direct) > 100
    assert inverse == [(tgt, src) for src, tgt in direct]
    assert sum(src != tgt for src, tgt in direct) > 100
    # end to end: the inverse model's source vocabulary is the table's French side
    path = tmp_path / "fr-en.safetensors"
    proc = run_cli(
        *("train", "--phrase-table", table, "--inverse", "--src-lang", "fr", "--tgt-lang", "en"),
        *("--preset", "tiny", "--max-steps", "2", "--threads", "1", "-o", path),
    )
    assert proc.returncode == 0, proc.stderr
    model = load_model(str(path))
    assert model.src_vocab.count_unknown([word for _, tgt in direct for word in tgt]) == 0
    assert model.tgt_vocab.count_unknown([word for src, _ in direct for word in src]) == 0
    assert "avec" in model.src_vocab.words and "avec" not in model.tgt_vocab.words
    assert "the" in model.tgt_vocab.words and "the" not in model.src_vocab.words
    # --inverse needs a table: for parallel files the order of the files says the direction
    src, tgt = sample_pairs(5)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    proc = run_cli("train", s, t, "--inverse", "-o", tmp_path / "x.safetensors")
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith("in the other order (TARGET SOURCE)")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("arch", ["cho", "lstm", "attention"])
def test_default_presets_start_from_fan_in_scales_and_paper_presets_from_the_papers(arch):
    """PyTorch's scales (embeddings N(0, 1), linear layers U(±1/√fan_in)) in every
    default preset; the paper presets keep N(0, 0.01²) (cho, attention) or U(±0.08) (lstm)."""
    from phrasescore.model import build_network
    from phrasescore.model.config import preset

    nets = {}
    for name in ("default", "paper"):
        mcfg, _ = preset(name, arch)
        mcfg.src_vocab_size, mcfg.tgt_vocab_size = 300, 400
        if name == "paper":  # small enough for a test; the scheme is what is checked
            mcfg.hidden_dim, mcfg.embedding_dim, mcfg.maxout_units = 32, 16, 16
            mcfg.output_rank = 32 if arch == "lstm" else 16
        torch.manual_seed(0)
        nets[name] = build_network(mcfg)
    default, paper = nets["default"], nets["paper"]
    assert default.config.init == "fan_in" and paper.config.init == "cho"
    assert float(default.src_embed.weight[1:].detach().std()) == pytest.approx(1.0, rel=0.05)
    assert float(default.tgt_embed.weight[0].detach().abs().max()) == 0.0  # PAD stays zero
    bound = 1.0 / math.sqrt(default.out_vocab.in_features)
    assert float(default.out_vocab.bias.detach().abs().max()) <= bound
    assert float(default.out_vocab.weight.detach().std()) == pytest.approx(
        bound / math.sqrt(3), rel=0.05
    )
    paper_scale = float(paper.src_embed.weight[1:].detach().abs().max())
    assert paper_scale <= 0.08  # N(0, 0.01²) or U(±0.08)
    if arch == "lstm":
        hid = default.config.hidden_dim
        assert float(default.encoder.weight_hh_l0.detach().abs().max()) <= 1 / math.sqrt(hid)
    else:
        block = default.dec_u_h.detach() if arch == "attention" else default.dec_u.detach()
        hid = default.config.hidden_dim
        square = block[:, :hid]
        assert torch.allclose(square.T @ square, torch.eye(hid), atol=1e-4)  # orthogonal


def test_learning_rate_halves_after_a_validation_without_a_new_best_and_resumes(tmp_path):
    """Reduce on plateau (``lr_plateau_factor``, the default presets' 0.5): the learning rate is
    the initial one times 0.5 per validation that did not improve, and a resumed run continues
    with it exactly (same weights as an uninterrupted run)."""
    src, tgt = sample_pairs(60)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    (tmp_path / "full").mkdir()
    (tmp_path / "parts").mkdir()
    # a learning rate far too high: validation perplexity rises now and then
    common = dict(
        batch_tokens=300, valid_every=2, seed=9, learning_rate=0.2, lr_plateau_factor=0.5,
        patience=100,
    )  # fmt: skip
    full, _ = _train(tmp_path / "full", s, t, max_steps=16, **common)
    part, _ = _train(tmp_path / "parts", s, t, max_steps=9, **common)
    _train(tmp_path / "parts", s, t, max_steps=16, resume=True, **common)
    a = Trainer.read_checkpoint(full + ".checkpoint")
    b = Trainer.read_checkpoint(part + ".checkpoint")
    history = a["meta"]["position"]["history"]
    best, misses = math.inf, []
    for point in history:
        misses.append(point["valid_ppl"] >= best)
        best = min(best, point["valid_ppl"])
    assert sum(misses) >= 1
    assert a["meta"]["position"]["lr_scale"] == 0.5 ** sum(misses)
    # the last step (16) ran before its validation: at the scale of the earlier ones
    last_lr = a["optimizer"]["param_groups"][0]["lr"]
    assert last_lr == pytest.approx(0.2 * 0.5 ** sum(misses[:-1]))
    for name, tensor in a["network"].items():
        assert torch.equal(tensor, b["network"][name]), name


def test_lr_halve_options_halve_the_learning_rate_by_epochs_from_the_command_line(tmp_path):
    """``train --lr-halve-after E --lr-halve-every F`` (the epoch schedule of Sutskever et al.,
    for any preset): the last step's learning rate is the initial one halved once at E epochs
    and again every F epochs; the model file records the schedule."""
    src, tgt = sample_pairs(60)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    out = tmp_path / "m.safetensors"
    args = ["-q", "train", s, t, "-o", str(out), "--preset", "tiny", "--batch-tokens", "300"]
    args += ["--lr", "0.01", "--lr-plateau-factor", "1", "--epochs", "1.5", "--seed", "9"]
    done = run_cli(*args, "--lr-halve-after", "0.5", "--lr-halve-every", "0.25")
    assert done.returncode == 0, done.stderr
    checkpoint = Trainer.read_checkpoint(str(out) + ".checkpoint")
    # the last step ran in [1.25, 1.5): halved at 0.5, 0.75, 1.0 and 1.25
    assert checkpoint["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.01 / 2**4)
    train_config = load_model(str(out)).info["train_config"]
    assert (train_config["lr_halve_after_epochs"], train_config["lr_halve_every_epochs"]) == (
        0.5,
        0.25,
    )


@pytest.mark.parametrize("arch", ["attention", "lstm"])
def test_init_option_gives_the_papers_scheme_with_default_sizes(tmp_path, corpus_files, arch):
    """``train --init paper`` keeps the default preset's sizes with the paper's initialisation
    (what docs/benchmarks.md compares); the model file records it."""
    out = tmp_path / "m.safetensors"
    args = ["-q", "train", *corpus_files, "-o", str(out), "--arch", arch, "--init", "paper"]
    done = run_cli(*args, "--max-steps", "1", "--valid-every", "1", "--batch-tokens", "200")
    assert done.returncode == 0, done.stderr
    config = load_model(str(out)).network.config
    assert config.init == "cho" and config.hidden_dim == 256
    assert config.init_uniform == (0.08 if arch == "lstm" else None)


@pytest.mark.parametrize("arch", ["cho", "attention", "lstm"])
def test_dropout_option_sets_the_rate_every_dropout_layer_trains_with(tmp_path, corpus_files, arch):
    """``train --dropout P`` replaces the preset's rate (default 0.2) in every dropout layer and in
    the model file; at 0 a training-mode forward pass is the evaluation-mode one to the bit, at
    0.5 it is not; a rate of 1 or more is refused in one line."""
    from phrasescore.model.builders import build_network
    from phrasescore.model.config import preset

    out = tmp_path / "m.safetensors"
    args = ["-q", "train", *corpus_files, "-o", str(out), "--arch", arch, "--preset", "tiny"]
    args += ["--max-steps", "1", "--valid-every", "1", "--batch-tokens", "200", "--layers", "2"]
    args = args if arch == "lstm" else args[:-2]
    done = run_cli(*args, "--dropout", "0.5")
    assert done.returncode == 0, done.stderr
    network = load_model(str(out)).network
    assert network.config.dropout == 0.5
    rates = [m.p for m in network.modules() if isinstance(m, torch.nn.Dropout)]
    rates += [m.dropout for m in network.modules() if isinstance(m, torch.nn.LSTM)]
    assert rates and set(rates) == {0.5}
    mcfg, _ = preset("tiny", arch)
    mcfg.src_vocab_size, mcfg.tgt_vocab_size, mcfg.layers = 300, 500, 2
    mcfg.init = "fan_in"  # N(0, 0.01²) weights make every output near-uniform, masks or not
    torch.manual_seed(5)
    src, lengths = torch.randint(4, 300, (6, 9)), torch.full((6,), 9)
    tgt_in, tgt_out = torch.randint(4, 500, (6, 8)), torch.randint(4, 500, (6, 8))
    mask = torch.ones(6, 8, dtype=torch.bool)
    for rate in (0.0, 0.5):
        mcfg.dropout = rate
        torch.manual_seed(3)
        net = build_network(mcfg)
        with torch.no_grad():
            trained = net.train().loss_terms(src, lengths, tgt_in, tgt_out, mask).nll
            evaluated = net.eval().loss_terms(src, lengths, tgt_in, tgt_out, mask).nll
        assert torch.equal(trained, evaluated) == (rate == 0.0)
    refused = run_cli(*args, "--dropout", "1")
    assert refused.returncode == 2 and "--dropout" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("arch", ["cho", "attention", "lstm"])
def test_loss_under_a_whole_network_autocast_keeps_it_in_the_output_layer(arch):
    """``train --amp`` on a GPU autocasts the whole network around ``loss_terms`` (bf16_output
    False): the output layer must stay under it (an inner autocast block with enabled=False
    switched it off and fed bf16 features to the fp32 projection: every CUDA --amp training
    failed). Checked with the CPU's autocast, the same mechanism; oneDNN is off because its
    bf16 LSTM kernel does not exist on every CPU (the recurrences' precision is not the
    question here)."""
    from phrasescore.model.builders import build_network
    from phrasescore.model.config import preset

    mcfg, _ = preset("tiny", arch)
    mcfg.src_vocab_size, mcfg.tgt_vocab_size = 300, 1500
    torch.manual_seed(3)
    net = build_network(mcfg)
    src = torch.randint(4, 300, (6, 9))
    tgt_in, tgt_out = torch.randint(4, 1500, (6, 8)), torch.randint(4, 1500, (6, 8))
    lengths, mask = torch.full((6,), 9), torch.ones(6, 8, dtype=torch.bool)
    logits = []
    net.out_vocab.register_forward_hook(lambda m, i, o: logits.append(o.dtype))
    fp32 = float(net.loss_terms(src, lengths, tgt_in, tgt_out, mask).nll)
    with torch.backends.mkldnn.flags(enabled=False), torch.autocast("cpu", dtype=torch.bfloat16):
        terms = net.loss_terms(src, lengths, tgt_in, tgt_out, mask, bf16_output=False)
    terms.objective.backward()
    assert logits == [torch.float32, torch.bfloat16]
    assert float(terms.nll) == pytest.approx(fp32, rel=2e-2)
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.parametrize("arch", ["cho", "attention", "lstm"])
def test_bf16_output_layer_gives_the_fp32_loss_and_gradients_within_bf16_rounding(arch):
    """``loss_terms(bf16_output=True)`` (what ``train --amp`` does on the CPU): only the
    vocabulary projection runs in bf16 (its logits and gradient are bf16, the recurrences'
    activations stay fp32), on a real-sized vocabulary (the compiled kernels of token_nll), and
    the NLL and the gradients are fp32's within bf16 rounding."""
    from phrasescore.model.builders import build_network
    from phrasescore.model.config import preset

    mcfg, _ = preset("tiny", arch)
    mcfg.src_vocab_size, mcfg.tgt_vocab_size = 300, 1500
    torch.manual_seed(3)
    net = build_network(mcfg)
    src = torch.randint(4, 300, (6, 9))
    tgt = torch.randint(4, 1500, (6, 8))
    lengths = torch.full((6,), 9)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    mask = torch.ones_like(tgt_out, dtype=torch.bool)
    dtypes = {}

    def seen(key, tensor):
        dtypes.setdefault(key, tensor.dtype)

    net.out_vocab.register_forward_hook(lambda m, i, o: seen("logits", o))
    net.out_vocab.register_full_backward_hook(lambda m, gi, go: seen("grad", go[0]))
    grads, nlls = [], []
    for bf16 in (False, True):
        dtypes.clear()
        net.zero_grad()
        terms = net.loss_terms(src, lengths, tgt_in, tgt_out, mask, bf16_output=bf16)
        terms.objective.backward()
        assert terms.nll.dtype == torch.float32
        assert dtypes == {
            "logits": torch.bfloat16 if bf16 else torch.float32,
            "grad": dtypes["logits"],
        }
        nlls.append(float(terms.nll))
        grads.append({n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None})
    assert nlls[1] == pytest.approx(nlls[0], rel=2e-3)
    assert grads[0].keys() == grads[1].keys()
    for name, want in grads[0].items():
        got = grads[1][name]
        assert got.dtype == torch.float32
        # bf16 keeps 8 bits of mantissa: the projections' products differ by ~2^-8 relative
        assert float((got - want).norm()) <= 0.02 * float(want.norm()) + 1e-7, name


def test_amp_on_the_cpu_learns_and_writes_the_same_bytes_twice(tmp_path):
    """``train --amp`` on the CPU (bf16 output layer): the model learns like the fp32 one and
    one seed gives one file (the weights are stored in fp32)."""
    src, tgt = sample_pairs(60)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    runs = []
    for name, amp in (("fp32", False), ("bf16a", True), ("bf16b", True)):
        path = str(tmp_path / f"{name}.safetensors")
        kw = dict(seed=5, valid_every=40, learning_rate=1e-2, max_steps=40, batch_tokens=500)
        result = train_tiny(path, s, t, valid=(s, t), amp=amp, **kw)
        runs.append((path, result))
    (fp32, r32), (bf16, r16), (again, _) = runs
    assert r16.best_valid_ppl < r16.unigram_valid_ppl / 2
    assert r16.best_valid_ppl == pytest.approx(r32.best_valid_ppl, rel=0.05)
    assert open(bf16, "rb").read() == open(again, "rb").read()
    assert open(bf16, "rb").read() != open(fp32, "rb").read()
    model = load_model(bf16)
    assert all(p.dtype == torch.float32 for p in model.network.parameters())


def test_a_training_step_does_not_wait_for_its_loss(tmp_path):
    """The step adds its loss to the window on the device and the window is read at a log or
    a validation: no scalar read in the step itself (on a GPU the host would wait there for the
    step's kernels before launching the next step's), and the train perplexity of the window is
    what adding each step's loss as it came gives (test_checkpoints: byte-identical resumes)."""
    src, tgt = sample_pairs(60)
    s, t = write_lines(tmp_path / "a.en", src), write_lines(tmp_path / "a.fr", tgt)
    with HostReads() as reads:
        result = train_tiny(tmp_path / "m.st", s, t, valid=(s, t), max_steps=6, seed=3)
    in_step = [k for k in reads.seen if "_local_scalar_dense" in k and k.endswith("(_step)")]
    assert not in_step, in_step
    assert result.history and math.isfinite(result.history[-1]["train_ppl"])


@pytest.mark.parametrize("arch", ["cho", "attention"])
def test_the_loss_over_positions_made_on_the_host_is_the_masks_to_the_bit(arch):
    """On a GPU the trainer selects the real target positions by their flat indices, made with
    the batch on the host (Batch.with_positions), instead of a boolean mask on the device: the
    same rows in the same order, so the same loss and gradients to the bit, and no boolean
    selection (which would make the host wait for the mask)."""
    from phrasescore.model import build_network
    from phrasescore.model.config import preset
    from phrasescore.text.corpus import make_batch

    config, _ = preset("tiny", arch)
    config.src_vocab_size = config.tgt_vocab_size = 60
    torch.manual_seed(0)
    network = build_network(config)
    pairs = [([4, 5, 6, 7], [9, 10, 11]), ([8, 9], [12]), ([10], [13, 14, 40, 41]), ([5], [9])]
    batch = make_batch([s for s, _ in pairs], [t for _, t in pairs]).with_positions()
    assert (
        batch.tgt_positions.tolist() == torch.nonzero(batch.tgt_out.reshape(-1)).squeeze(1).tolist()
    )

    def run(where):
        network.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout masks
        terms = network.loss_terms(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, where)
        terms.objective.backward()
        return terms.objective.detach(), {n: p.grad.clone() for n, p in network.named_parameters()}

    loss, grads = run(batch.tgt_out != 0)
    with HostReads() as reads:
        loss_p, grads_p = run(batch.tgt_positions)
    assert not [k for k in reads.seen if "index" in k], reads.seen
    assert torch.equal(loss, loss_p)
    for name, grad in grads.items():
        assert torch.equal(grad, grads_p[name]), name


@pytest.mark.parametrize("arch", ["cho", "attention", "lstm"])
def test_train_sizes_from_the_command_line_shape_the_network_and_are_stored(
    tmp_path, corpus_files, arch
):
    """--embedding-dim, --hidden-dim, --output-rank (and --maxout-units where there is a maxout
    layer) replace the preset's sizes: the stored configuration and the weights' shapes."""
    source, target = corpus_files
    out = tmp_path / "m.safetensors"
    sizes = ["--embedding-dim", "24", "--hidden-dim", "40", "--output-rank", "20"]
    if arch != "lstm":
        sizes += ["--maxout-units", "36"]
    args = ["train", source, target, "-o", out, "--preset", "tiny", "--arch", arch, *sizes]
    proc = run_cli(*args, "--max-steps", "1", "--valid-every", "1", "--batch-tokens", "200")
    assert proc.returncode == 0, proc.stderr
    network = load_model(str(out)).network
    cfg = network.config
    assert (cfg.embedding_dim, cfg.hidden_dim, cfg.output_rank) == (24, 40, 20)
    assert network.src_embed.weight.shape[1] == network.tgt_embed.weight.shape[1] == 24
    assert network.out_vocab.weight.shape == (cfg.tgt_vocab_size, 20)
    if arch != "lstm":
        assert cfg.maxout_units == 36 and network.out_rank.weight.shape == (20, 36)
    else:
        proc = run_cli(*args, "--maxout-units", "36", "--max-steps", "1")
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines()[-1] == (
            "phrasescore: error: --maxout-units is an option of --arch cho and attention, not of "
            "--arch lstm"
        )


@pytest.mark.parametrize(
    "arch, sizes, reads",
    [
        (
            "lstm",
            ["--hidden-dim", "48", "--output-rank", "49"],
            "48 units the output layer reads (--hidden-dim)",
        ),
        ("attention", ["--output-rank", "65"], "64 units the output layer reads (--maxout-units)"),
        (
            "cho",
            ["--maxout-units", "16", "--output-rank", "32"],
            "16 units the output layer reads (--maxout-units)",
        ),
    ],
)
def test_an_output_rank_above_what_the_output_layer_reads_is_refused(
    tmp_path, corpus_files, arch, sizes, reads
):
    source, target = corpus_files
    out = tmp_path / "m.safetensors"
    proc = run_cli("train", source, target, "-o", out, "--preset", "tiny", "--arch", arch, *sizes)
    assert proc.returncode == 1
    rank = sizes[-1]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"phrasescore: error: --output-rank {rank} is larger than the {reads}: give --output-rank "
        f"{reads.split()[0]} or less"
    )
    assert not out.exists()


def test_a_smaller_paper_lstm_is_told_to_give_its_output_rank(tmp_path, corpus_files):
    """--preset paper --arch lstm reads the top state with the full matrix (rank = hidden units):
    a smaller --hidden-dim alone leaves the preset's rank above it, and the message says so."""
    source, target = corpus_files
    args = ["train", source, target, "-o", tmp_path / "m.safetensors", "--arch", "lstm"]
    proc = run_cli(*args, "--preset", "paper", "--hidden-dim", "500")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "phrasescore: error: the preset's output rank 1000 is larger than the 500 units the output "
        "layer reads (--hidden-dim): give --output-rank 500 or less"
    )
