"""Training checkpoints that know their run: ``--resume`` refuses other data or flags
in one line, a damaged checkpoint is refused by its checksum, a resume says what it resumes,
and a failed run leaves nothing under the model's name."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from phrasescore.errors import InputError
from phrasescore.training.trainer import Trainer

from .conftest import run_cli, train_tiny

STEPS = dict(max_steps=4, valid_every=2, learning_rate=3e-3, seed=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_files):
    """A tiny run of 4 steps and its checkpoint: (model path, source, target)."""
    folder = tmp_path_factory.mktemp("run")
    model = folder / "m.safetensors"
    train_tiny(model, *corpus_files, **STEPS)
    return model, *corpus_files


def _copy_run(trained, tmp_path):
    """The trained run's model and checkpoint in ``tmp_path`` (each test resumes its own)."""
    model, src, tgt = trained
    for suffix in ("", ".checkpoint", ".log"):
        shutil.copy(f"{model}{suffix}", tmp_path / f"m.safetensors{suffix}")
    return tmp_path / "m.safetensors", src, tgt


def _swapped(src, tgt, tmp_path):
    return tgt, src


def _copied(src, tgt, tmp_path):
    """The same data under other names: the same run."""
    return str(shutil.copy(src, tmp_path / "copy.en")), str(shutil.copy(tgt, tmp_path / "copy.fr"))


def _edited(src, tgt, tmp_path):
    lines = open(src, encoding="utf-8").read().splitlines()
    lines[5] = "a changed line"
    path = tmp_path / "edited.en"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path), tgt


@pytest.mark.parametrize(
    "change, expected",
    [
        (dict(seed=2), "was trained with --seed 1, this run has --seed 2"),
        (dict(learning_rate=1e-3), "was trained with --lr 0.003, this run has --lr 0.001"),
        (dict(vocab_size=50), "was trained with --vocab-size 15000, this run has --vocab-size 50"),
        (dict(arch="attention"), "was trained with --arch cho, this run has --arch attention"),
        (dict(src_lang="fr", tgt_lang="en"), "was trained with --src-lang en, this run has --src-lang fr"),
        (dict(lr_halve_after_epochs=1.0), "with no --lr-halve-after, this run has --lr-halve-after 1"),
        (dict(data=_swapped), "on SOURCE "),
        (dict(data=_edited), "this run's is other data: SOURCE "),
    ],
    ids=["seed", "lr", "vocab-size", "arch", "direction", "schedule", "swapped-files", "edited"],
)  # fmt: skip
def test_resume_refuses_another_run_in_one_line(trained, tmp_path, change, expected):
    model, src, tgt = _copy_run(trained, tmp_path)
    change = dict(change)
    if "data" in change:
        src, tgt = change.pop("data")(src, tgt, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(InputError) as caught:
        train_tiny(model, src, tgt, resume=True, **{**STEPS, "max_steps": 6, **change})
    message = str(caught.value)
    assert message.startswith(f"--resume: {model}.checkpoint was trained ")
    assert expected in message and "\n" not in message
    assert message.endswith("(resume with the data and flags of the run, or train without "
                            "--resume to start again)")  # fmt: skip
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing touched


def test_resume_of_the_same_data_under_other_names_goes_on(trained, tmp_path, caplog):
    model, src, tgt = _copy_run(trained, tmp_path)
    src, tgt = _copied(src, tgt, tmp_path)
    with caplog.at_level("INFO", logger="phrasescore"):
        result = train_tiny(model, src, tgt, resume=True, **{**STEPS, "max_steps": 6})
    assert result.steps == 6
    assert f"resuming at step 4 of {model}.checkpoint (epoch 1, best validation perplexity " in (
        caplog.text
    )


def test_resume_of_a_finished_run_makes_no_step(trained, tmp_path):
    model, src, tgt = _copy_run(trained, tmp_path)
    result = train_tiny(model, src, tgt, resume=True, **STEPS)
    assert result.steps == 4
    assert Trainer.read_checkpoint(f"{model}.checkpoint")["meta"]["position"]["step"] == 4


def _flip_in_a_tensor(path) -> None:
    """Flip one byte of the network's first tensor in a checkpoint (a zip of stored members)."""
    data = bytearray(path.read_bytes())
    state = torch.load(path, weights_only=True)
    first = next(iter(state["network"].values()))
    needle = first.reshape(-1)[:8].numpy().tobytes()
    at = data.find(needle)
    assert at > 0
    data[at + 5] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, expected",
    [
        (_flip_in_a_tensor, "damaged checkpoint: its content does not match its checksum"),
        (
            lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
            "not a readable training checkpoint (damaged, truncated or another kind of file)",
        ),
        (
            lambda p: p.write_bytes(b"garbage\n" * 100),
            "not a readable training checkpoint (damaged, truncated or another kind of file)",
        ),
    ],
    ids=["one-byte-flipped", "truncated", "garbage"],
)
def test_a_damaged_checkpoint_is_refused_in_one_line(trained, tmp_path, damage, expected):
    model, src, tgt = _copy_run(trained, tmp_path)
    checkpoint = tmp_path / "m.safetensors.checkpoint"
    damage(checkpoint)
    args = ["train", src, tgt, "-o", model, "--preset", "tiny", "--max-steps", "6"]
    args += ["--valid-every", "2", "--lr", "3e-3", "--seed", "1", "--resume", "--no-progress"]
    proc = run_cli(*args)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"phrasescore: error: {checkpoint}: {expected}")
    )


def test_a_failed_run_leaves_nothing_beside_the_model(tmp_path):
    """Parallel files of different lengths: the error, and no model, log or curve left."""
    src = tmp_path / "a.en"
    tgt = tmp_path / "a.fr"
    src.write_text("a b\nc d\n", encoding="utf-8")
    tgt.write_text("x y\n", encoding="utf-8")
    proc = run_cli("train", src, tgt, "-o", tmp_path / "m.st", "--preset", "tiny", "--no-progress")
    assert proc.returncode == 1, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["a.en", "a.fr"]


def test_a_directory_given_as_a_model_is_named_a_directory(tmp_path):
    """``info`` and ``sample`` name a directory given as ``-m`` a directory, not a missing file."""
    folder = tmp_path / "models"
    folder.mkdir()
    for args in (["info", folder], ["sample", "a dog", "-m", folder]):
        proc = run_cli(*args)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.strip() == (
            f"phrasescore: error: {folder}: is a directory, not a model file"
        )


def test_a_device_given_as_a_model_is_named_not_a_file():
    """``info /dev/null`` said "no such model file"."""
    proc = run_cli("info", "/dev/null")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == (
        "phrasescore: error: /dev/null: is not a regular file (a device or a pipe): give the "
        "model file"
    )


def test_a_diverging_run_is_one_line_its_log_lines_whole_and_nothing_left(tmp_path, corpus_files):
    """A run whose validation perplexity is never finite (a huge finite --lr; ``--lr inf`` is
    refused at parse time) writes whole validation lines (inf, its seconds and rate), ends with
    one error line saying it diverged, and leaves no file behind."""
    import re

    args = ["train", *corpus_files, "-o", tmp_path / "m.st", "--preset", "tiny", "--max-steps"]
    args += ["5", "--valid-every", "2", "--lr", "0.5", "--seed", "1", "--no-progress"]
    proc = run_cli(*args, "--threads", "1")
    assert proc.returncode == 1, proc.stderr
    steps = [line for line in proc.stderr.splitlines() if line.startswith("phrasescore: step ")]
    assert len(steps) == 3
    assert "(no improvement (1/5); " in steps[0]  # validation perplexity inf
    assert re.search(r"validation perplexity inf, mean \|log Z\| [\d.]+ \(\d+ s; \d+ target "
                     r"tokens/s\)$", steps[2]), steps[2]  # fmt: skip
    assert proc.stderr.strip().splitlines()[-1] == (
        f"phrasescore: error: {tmp_path / 'm.st'}: no validation perplexity was finite (the "
        "training diverged): no model written; try a smaller --lr"
    )
    assert os.listdir(tmp_path) == []


def test_train_lm_resume_refuses_another_order_and_corpus(tmp_path, corpus_files):
    from phrasescore.jobs.training.train_lm import run_lm_training

    path = str(tmp_path / "lm.safetensors")

    def train_lm(corpus, order=3, **overrides):
        settings = {"max_steps": 2, "valid_every": 2, "seed": 3, **overrides}
        return run_lm_training(path, corpus, preset="tiny", order=order, device="cpu",
                               progress=False, resume=True, overrides=settings)  # fmt: skip

    french = corpus_files[1]
    train_lm(french)
    with pytest.raises(InputError, match=r"was trained with --order 3, this run has --order 4 "):
        train_lm(french, order=4, max_steps=3)
    with pytest.raises(InputError, match=r"was trained on CORPUS .*, this run's is other data: "):
        train_lm(corpus_files[0], max_steps=3)
    assert train_lm(french, max_steps=3).steps == 3


def test_the_recipe_names_a_phrase_table_run_against_a_corpus_run(tmp_path):
    from phrasescore.training.run_identity import identity_difference, make_run_identity

    table, src, tgt = (tmp_path / name for name in ("pt", "a.en", "a.fr"))
    for path in (table, src, tgt):
        path.write_text(f"{path.name}\n", encoding="utf-8")
    settings = ({"arch": "cho", "reverse_source": True}, {"seed": 1, "epochs": 2})
    flags = {"--src-lang": "en", "--inverse": False}
    on_table = make_run_identity([("--phrase-table", str(table))], flags, "tiny", *settings)
    on_files = make_run_identity(
        [("SOURCE", str(src)), ("TARGET", str(tgt))], flags, "tiny", *settings
    )
    assert identity_difference(on_table, on_files, "c") == (
        f"--resume: c was trained on --phrase-table {table}, this run on SOURCE {src} and "
        f"TARGET {tgt}"
    )
    inverse = make_run_identity([("--phrase-table", str(table))], {**flags, "--inverse": True},
                          "tiny", *settings)  # fmt: skip
    assert identity_difference(on_table, inverse, "c") == (
        "--resume: c was trained with no --inverse, this run has --inverse"
    )
    no_reverse = make_run_identity([("--phrase-table", str(table))], flags, "tiny",
                             {"arch": "cho", "reverse_source": False}, settings[1])  # fmt: skip
    assert identity_difference(on_table, no_reverse, "c") == (
        "--resume: c was trained with no --no-reverse, this run has --no-reverse"
    )
    longer = make_run_identity([("--phrase-table", str(table))], flags, "tiny", settings[0],
                         {"seed": 1, "epochs": 5})  # fmt: skip
    assert identity_difference(on_table, longer, "c") is None  # a budget may change
    assert identity_difference(on_table, make_run_identity([("--phrase-table", str(table))], flags,
                             "default", *settings), "c") == (
        "--resume: c was trained with --preset tiny, this run has --preset default"
    )  # fmt: skip


def test_a_resume_with_another_size_names_the_size_flag(tmp_path):
    from phrasescore.training.run_identity import identity_difference, make_run_identity

    src = tmp_path / "a.en"
    src.write_text("a\n", encoding="utf-8")

    def identity(**sizes):
        model = {"arch": "attention", "hidden_dim": 256, "embedding_dim": 128, **sizes}
        return make_run_identity([("SOURCE", str(src))], {}, "default", model, {"seed": 1})

    assert identity_difference(identity(), identity(hidden_dim=512), "c") == (
        "--resume: c was trained with --hidden-dim 256, this run has --hidden-dim 512"
    )
    assert identity_difference(identity(), identity(embedding_dim=256), "c") == (
        "--resume: c was trained with --embedding-dim 128, this run has --embedding-dim 256"
    )
    assert identity_difference(identity(), identity(), "c") is None
    # a setting that no flag sets still says where a difference can come from
    assert identity_difference(identity(init_std=0.01), identity(init_std=0.02), "c") == (
        "--resume: c was trained with model init_std 0.01, this run has model init_std 0.02 "
        "(another preset or phrasescore version)"
    )
