"""The bin/ scripts for Moses users, run as a user would (subprocess, from another directory).

They run on copies of the shipped example system (examples/model, cut to its first 2,000 lines)
with the tiny trained model of conftest; Moses itself is absent here, so its tools are either
missing (the scripts must print the commands) or small fakes that record their arguments.
"""

from __future__ import annotations

import gzip
import itertools
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from phrasescore.cli import cli
from phrasescore.jobs.analysis.info import describe_file
from phrasescore.moses.ini import count_features_and_weights, list_phrase_tables
from phrasescore.moses.phrase_table import read_phrase_table
from phrasescore.training.trainer import Trainer

from .forked_cli import client_environment

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "bin"
EXAMPLES = ROOT / "examples"
TABLE_LINES = 2000
RESCORE_FLAGS = ["--", "--threads", "1", "--device", "cpu", "--no-progress"]
SCRIPTS = [
    "phrasescore-moses-model",
    "phrasescore-train-from-moses",
    "phrasescore-mert",
    "phrasescore-train-recipe",
]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def script_environment(path_extra=None, env_extra=None) -> dict[str, str]:
    """A minimal PATH (no Moses on it) and this checkout's phrasescore."""
    env = dict(os.environ)
    env.pop("MOSES", None)
    env["PATH"] = os.pathsep.join([*(path_extra or []), "/usr/bin", "/bin"])
    env.update(client_environment())  # phrasescore forked from a process that has PyTorch
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env.update(env_extra or {})
    return env


def run_script(name, *args, cwd, path_extra=None, env_extra=None):
    """Run bin/NAME in :func:`script_environment`."""
    return subprocess.run(
        ["bash", str(BIN / name), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=script_environment(path_extra, env_extra),
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


def example_model_dir(folder: Path, lines: int = TABLE_LINES) -> Path:
    """A copy of examples/model with the first ``lines`` lines of its phrase table."""
    folder.mkdir(parents=True)
    shutil.copyfile(EXAMPLES / "model" / "moses.ini", folder / "moses.ini")
    os.chmod(folder / "moses.ini", 0o644)
    with gzip.open(EXAMPLES / "model" / "phrase-table.gz", "rt", encoding="utf-8") as src:
        head = list(itertools.islice(src, lines))
    with gzip.open(folder / "phrase-table.gz", "wt", encoding="utf-8") as out:
        out.writelines(head)
    return folder


def make_executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def weights_of(ini_text: str, name: str) -> list[str]:
    for line in ini_text.splitlines():
        if line.startswith(f"{name}="):
            return line.split()[1:]
    raise AssertionError(f"no weight line for {name}")


def assert_one_more_column(old_table: Path, new_table: Path, n_new: int = 1) -> None:
    old = list(read_phrase_table(str(old_table)))
    new = list(read_phrase_table(str(new_table)))
    assert len(new) == len(old)
    for a, b in zip(old, new, strict=True):
        assert (b.source, b.target, b.tail) == (a.source, a.target, a.tail)
        assert b.scores[: len(a.scores)] == a.scores
        assert len(b.scores) == len(a.scores) + n_new
        assert all(0.0 < float(v) <= 1.0 for v in b.scores[len(a.scores) :])


# ---------------------------------------------------------------------------- --help
@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help(script, flag, tmp_path):
    done = run_script(script, flag, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script}")
    assert done.stderr == ""


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_are_executable_bash_with_strict_mode(script):
    path = BIN / script
    assert os.access(path, os.X_OK)
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text


# ---------------------------------------------------------------------------- moses-model
def test_moses_model_on_the_example_system(tiny_model_path, tmp_path):
    model_dir = example_model_dir(tmp_path / "model")
    original_ini = (model_dir / "moses.ini").read_text()
    work = tmp_path / "elsewhere"
    work.mkdir()
    done = run_script(
        "phrasescore-moses-model", model_dir, "--model", tiny_model_path, *RESCORE_FLAGS, cwd=work
    )
    assert done.returncode == 0, done.stderr
    new_ini = (model_dir / "moses.rescored.ini").read_text()
    assert (model_dir / "moses.ini").read_text() == original_ini
    [table] = list_phrase_tables(new_ini)
    assert (table.name, table.num_features, table.path) == (
        "TranslationModel0",
        5,
        "phrase-table.rescored.gz",
    )
    assert "num-features=5" in new_ini
    assert weights_of(new_ini, "TranslationModel0") == ["0.2"] * 5
    assert all(f == w for f, w in count_features_and_weights(new_ini).values() if f and w)
    assert_one_more_column(model_dir / "phrase-table.gz", model_dir / "phrase-table.rescored.gz")
    # the report: what was produced, and the MERT step
    assert str(model_dir / "moses.rescored.ini") in done.stdout
    assert str(model_dir / "phrase-table.rescored.gz") in done.stdout
    assert "4 -> 5 scores" in done.stdout
    assert "mert-moses.pl" in done.stdout and "features.list" in done.stdout
    assert "--decoder-flags" in done.stdout and "--working-dir" in done.stdout
    assert "error" not in done.stderr


def test_moses_model_several_tables_unk_column_and_out_dir(tiny_model_path, tmp_path):
    model_dir = example_model_dir(tmp_path / "model", lines=600)
    with gzip.open(model_dir / "phrase-table.gz", "rt", encoding="utf-8") as fh:
        lines = fh.readlines()
    with gzip.open(model_dir / "second.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(lines[-200:])
    ini = (model_dir / "moses.ini").read_text()
    ini = ini.replace(
        "path=phrase-table.gz input-factor=0 output-factor=0\n",
        f"path={model_dir}/phrase-table.gz input-factor=0 output-factor=0\n"
        "PhraseDictionaryMemory name=TranslationModel1 num-features=4 path=second.gz "
        "input-factor=0 output-factor=0\n",
    )
    ini = ini.replace(
        "TranslationModel0= 0.2 0.2 0.2 0.2\n",
        "TranslationModel0= 0.2 0.2 0.2 0.2\nTranslationModel1= 0.1 0.1 0.1 0.1\n",
    )
    ini = ini.replace("0 T 0\n", "0 T 0\n1 T 1\n")
    (model_dir / "moses.ini").write_text(ini)
    out_dir = tmp_path / "out"
    done = run_script(
        "phrasescore-moses-model",
        model_dir,
        "-m",
        tiny_model_path,
        "--unk-column",
        "--weight",
        "0.05",
        "--out-dir",
        out_dir,
        *RESCORE_FLAGS,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    new_ini = (out_dir / "moses.rescored.ini").read_text()
    tables = {t.name: t for t in list_phrase_tables(new_ini)}
    assert tables["TranslationModel0"].num_features == 6
    assert tables["TranslationModel1"].num_features == 6
    assert weights_of(new_ini, "TranslationModel0") == ["0.2"] * 4 + ["0.05"] * 2
    assert weights_of(new_ini, "TranslationModel1") == ["0.1"] * 4 + ["0.05"] * 2
    assert_one_more_column(model_dir / "phrase-table.gz", out_dir / "phrase-table.rescored.gz", 2)
    assert_one_more_column(model_dir / "second.gz", out_dir / "second.rescored.gz", 2)
    assert not (model_dir / "moses.rescored.ini").exists()


def test_moses_model_refuses_a_table_that_another_step_writes(tiny_model_path, tmp_path):
    """TranslationModel1's table at phrase-table.rescored.gz, the file the step of
    TranslationModel0 writes, is refused with one error line before any step runs: that step
    would replace it before TranslationModel1's own step read it."""
    model_dir = example_model_dir(tmp_path / "model", lines=300)
    shutil.copyfile(model_dir / "phrase-table.gz", model_dir / "phrase-table.rescored.gz")
    ini = (model_dir / "moses.ini").read_text()
    ini = ini.replace(
        "path=phrase-table.gz input-factor=0 output-factor=0\n",
        "path=phrase-table.gz input-factor=0 output-factor=0\n"
        "PhraseDictionaryMemory name=TranslationModel1 num-features=4 "
        "path=phrase-table.rescored.gz input-factor=0 output-factor=0\n",
    )
    ini = ini.replace(
        "TranslationModel0= 0.2 0.2 0.2 0.2\n",
        "TranslationModel0= 0.2 0.2 0.2 0.2\nTranslationModel1= 0.1 0.1 0.1 0.1\n",
    )
    (model_dir / "moses.ini").write_text(ini.replace("0 T 0\n", "0 T 0\n1 T 1\n"))
    before = (model_dir / "phrase-table.rescored.gz").read_bytes()
    done = run_script("phrasescore-moses-model", model_dir, "-m", tiny_model_path, cwd=tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("phrasescore-moses-model: error: new table of TranslationModel0 ")
    assert "is the table TranslationModel1" in line and "refusing to overwrite an input" in line
    assert (model_dir / "phrase-table.rescored.gz").read_bytes() == before


def test_moses_model_missing_ini_is_one_clear_error(tiny_model_path, tmp_path):
    empty = tmp_path / "model"
    empty.mkdir()
    done = run_script("phrasescore-moses-model", empty, "--model", tiny_model_path, cwd=tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("phrasescore-moses-model: error: ") and "moses.ini" in line
    assert list(empty.iterdir()) == []


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "missing MODEL_DIR"),
        (["MODEL"], "--model"),
        (["MODEL", "--model"], "needs a value"),
        (["MODEL", "--model", "M", "--no-such-flag"], "unknown option"),
    ],
)
def test_moses_model_bad_usage_exits_2(args, message, tmp_path):
    args = [str(tmp_path) if a == "MODEL" else a for a in args]
    done = run_script("phrasescore-moses-model", *args, cwd=tmp_path)
    assert done.returncode == 2
    [line] = error_lines(done.stderr)
    assert message in line


def test_moses_model_missing_model_file(tmp_path):
    model_dir = example_model_dir(tmp_path / "model", lines=10)
    done = run_script("phrasescore-moses-model", model_dir, "-m", "nope.safetensors", cwd=tmp_path)
    assert done.returncode == 1
    assert error_lines(done.stderr) == [
        "phrasescore-moses-model: error: no such model file: nope.safetensors"
    ]


def compact_model_dir(folder: Path, lines: int = TABLE_LINES) -> Path:
    """The example system as a compact table: path=phrase-table (.minphr), text table beside."""
    model_dir = example_model_dir(folder, lines)
    ini = (model_dir / "moses.ini").read_text()
    ini = ini.replace(
        "PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=phrase-table.gz",
        f"PhraseDictionaryCompact name=TranslationModel0 num-features=4 path={model_dir}/phrase-table",
    )
    (model_dir / "moses.ini").write_text(ini)
    return model_dir


def test_moses_model_compact_table_prints_the_binarise_command(tiny_model_path, tmp_path):
    model_dir = compact_model_dir(tmp_path / "model")
    done = run_script(
        "phrasescore-moses-model",
        model_dir,
        "--model",
        tiny_model_path,
        *RESCORE_FLAGS,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    new = model_dir / "phrase-table.rescored"
    command = f"processPhraseTableMin -in {new}.gz -out {new} -nscores 5"
    assert command in done.stdout
    assert "processPhraseTableMin is not on PATH" in done.stdout
    [table] = list_phrase_tables((model_dir / "moses.rescored.ini").read_text())
    assert (table.class_name, table.num_features, table.path) == (
        "PhraseDictionaryCompact",
        5,
        str(new),
    )
    assert_one_more_column(model_dir / "phrase-table.gz", Path(f"{new}.gz"))


def test_moses_model_compact_table_runs_the_binariser_when_on_path(tiny_model_path, tmp_path):
    model_dir = compact_model_dir(tmp_path / "model", lines=300)
    fake_bin = tmp_path / "fake-bin"
    record = tmp_path / "binariser-args"
    make_executable(
        fake_bin / "processPhraseTableMin",
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "$@" > "{record}"\n'
        'while [[ $# -gt 0 ]]; do [[ $1 == -out ]] && touch "$2.minphr"; shift; done\n',
    )
    done = run_script(
        "phrasescore-moses-model",
        model_dir,
        "--model",
        tiny_model_path,
        *RESCORE_FLAGS,
        cwd=tmp_path,
        path_extra=[str(fake_bin)],
    )
    assert done.returncode == 0, done.stderr
    new = model_dir / "phrase-table.rescored"
    assert record.read_text().split("\n")[:-1] == [
        "-in",
        f"{new}.gz",
        "-out",
        str(new),
        "-nscores",
        "5",
    ]
    assert Path(f"{new}.minphr").exists()
    assert "binarised" in done.stdout


def test_moses_model_compact_table_without_its_text_table(tiny_model_path, tmp_path):
    model_dir = compact_model_dir(tmp_path / "model", lines=10)
    (model_dir / "phrase-table.gz").unlink()
    done = run_script("phrasescore-moses-model", model_dir, "-m", tiny_model_path, cwd=tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert "compact table" in line and "phrase-table.gz" in line
    assert not (model_dir / "moses.rescored.ini").exists()


# ---------------------------------------------------------------------------- train-from-moses
def write_corpus(stem: Path, lines: int = 200) -> None:
    """STEM.en (plain) and STEM.fr.gz from the example corpus, as train-model.perl's input."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    for lang, opener in (("en", open), ("fr", gzip.open)):
        with gzip.open(
            EXAMPLES / "corpus" / f"train.tok.lc.{lang}.gz", "rt", encoding="utf-8"
        ) as fh:
            head = list(itertools.islice(fh, lines))
        suffix = ".gz" if lang == "fr" else ""
        with opener(f"{stem}.{lang}{suffix}", "wt", encoding="utf-8") as out:
            out.writelines(head)


def test_train_from_moses_missing_corpus_file(tmp_path):
    write_corpus(tmp_path / "corpus")
    done = run_script(
        "phrasescore-train-from-moses", tmp_path / "corpus", "en", "de", "-o", "m.st", cwd=tmp_path
    )
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("phrasescore-train-from-moses: error: ") and "corpus.de" in line
    assert not (tmp_path / "m.st").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["corpus", "en", "fr"], "missing -o"),
        (["corpus", "en", "-o", "m"], "expected CORPUS_STEM F E"),
        (["--preset", "tiny", "corpus", "en", "fr", "-o", "m"], "before other flags"),
        (["corpus", "en", "en", "-o", "m"], "same language"),
    ],
)
def test_train_from_moses_bad_usage_exits_2(args, message, tmp_path):
    done = run_script("phrasescore-train-from-moses", *args, cwd=tmp_path)
    assert done.returncode == 2
    [line] = error_lines(done.stderr)
    assert message in line


def test_train_from_moses_trains_a_model(tmp_path):
    write_corpus(tmp_path / "work" / "corpus" / "train.clean")
    model = tmp_path / "models" / "en-fr.safetensors"
    done = run_script(
        "phrasescore-train-from-moses",
        "work/corpus/train.clean",
        "en",
        "fr",
        "-o",
        model,
        "--preset",
        "tiny",
        "--max-steps",
        "5",
        "--threads",
        "1",
        "--device",
        "cpu",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert model.exists() and model.stat().st_size > 0
    info = subprocess.run(
        [sys.executable, "-m", "phrasescore", "info", str(model)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert info.returncode == 0, info.stderr
    assert "phrasescore-moses-model" in done.stdout


# ---------------------------------------------------------------------------- train-recipe
DATA = ROOT / "tests" / "data"
RECIPE_MODELS = ["column", "l2r", "r2l", "inverse", "lstm"]


def recipe_inputs(folder: Path) -> list[str]:
    """A Moses user's files from the shipped real samples: corpus/train.{en,fr}.gz (171 lines),
    corpus/dev.{en,fr} (50) and model/phrase-table.gz (200 lines), and the recipe's flags."""
    (folder / "corpus").mkdir(parents=True)
    (folder / "model").mkdir()
    for lang in ("en", "fr"):
        shutil.copyfile(
            DATA / "text" / f"multi30k-sample.tok.lc.{lang}.gz", folder / f"corpus/train.{lang}.gz"
        )
        shutil.copyfile(DATA / "moses-system" / f"dev50.{lang}", folder / f"corpus/dev.{lang}")
    shutil.copyfile(
        DATA / "text" / "multi30k-phrase-table-sample.gz", folder / "model/phrase-table.gz"
    )
    return [
        "--corpus",
        "corpus/train",
        "--valid",
        "corpus/dev",
        "--table",
        "model/phrase-table.gz",
        "--f",
        "en",
        "--e",
        "fr",
        "-o",
        "nn",
    ]


def test_train_recipe_trains_the_five_models_then_refuses_to_replace_them(tmp_path):
    args = recipe_inputs(tmp_path)
    tiny = ["--jobs", "2", "--", "--preset", "tiny", "--max-steps", "3"]
    done = run_script("phrasescore-train-recipe", *args, *tiny, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    nn = tmp_path / "nn"
    # each model's line gives every limit its training stops at, --max-steps included
    assert (
        "training l2r (plateau (2 validations without a new best) or 60 min or 3 steps, "
        "whichever comes first, cpu slot 0)" in done.stderr
    )
    assert (
        "training column (plateau (2 validations without a new best) or 30 min or 3 steps, "
        "whichever comes first, cpu slot" in done.stderr
    )
    described = {}
    for name in RECIPE_MODELS:
        model = nn / f"{name}.safetensors"
        for companion in (".log", ".curve.png"):
            assert Path(f"{model}{companion}").stat().st_size > 0, (name, companion)
        assert "stopped (max steps) after 3 steps" in Path(f"{model}.log").read_text()
        described[name] = describe_file(str(model)).fields
        assert described[name]["steps"] == 3
    # each model is the recipe's: the column's on the table's pairs, the sentence models on the
    # corpus validated on dev, with the README's budgets, one thread each
    column = described["column"]
    assert column["architecture"] == "cho"
    assert column["data"]["phrase_table"] == "model/phrase-table.gz"
    assert column["data"]["inverse"] is False
    assert column["train_config"]["max_minutes"] == 30.0
    assert column["train_config"]["patience"] == 2
    expected = {  # name: (arch, reverse_target, source language, minutes: a cap)
        "l2r": ("attention", False, "en", 60.0),
        "r2l": ("attention", True, "en", 60.0),
        "inverse": ("attention", False, "fr", 60.0),
        "lstm": ("lstm", False, "en", 60.0),
    }
    for name, (arch, reverse_target, src, minutes) in expected.items():
        fields = described[name]
        tgt = {"en": "fr", "fr": "en"}[src]
        assert fields["architecture"] == arch, name
        assert fields["config"]["reverse_target"] is reverse_target, name
        assert fields["data"]["src_path"] == f"corpus/train.{src}.gz", name
        assert fields["data"]["tgt_path"] == f"corpus/train.{tgt}.gz", name
        assert fields["data"]["valid_src"] == f"corpus/dev.{src}", name
        assert fields["train_config"]["max_minutes"] == minutes, name
        assert fields["train_config"]["patience"] == 2, name  # stops at the curve's plateau
    # the report: every model and the next steps' commands with them
    for name in RECIPE_MODELS:
        assert f"  {name}.safetensors " in done.stdout
    assert f"rescore {tmp_path}/model/phrase-table.gz -m {nn}/column.safetensors" in done.stdout
    assert f"-m L2R={nn}/l2r.safetensors" in done.stdout
    assert f"--inverse-model Inv={nn}/inverse.safetensors" in done.stdout
    assert "rerank-tune" in done.stdout
    # a second run refuses before training anything: the models are unchanged
    stamps = {name: (nn / f"{name}.safetensors").stat().st_mtime_ns for name in RECIPE_MODELS}
    again = run_script("phrasescore-train-recipe", *args, *tiny, cwd=tmp_path)
    assert again.returncode == 1
    [line] = again.stderr.splitlines()
    assert line.startswith("phrasescore-train-recipe: error: nn/column.safetensors ")
    assert "--force" in line
    assert {n: (nn / f"{n}.safetensors").stat().st_mtime_ns for n in RECIPE_MODELS} == stamps


def test_train_recipe_models_trains_a_subset_and_replaces_only_it(tmp_path):
    """--models: the re-ranking models without the column's (no --table needed), then one of
    them again with --force, the other left as it was."""
    args = recipe_inputs(tmp_path)
    at = args.index("--table")
    args = args[:at] + args[at + 2 :]  # no --table: the column's model is not asked for
    tiny = ["--", "--preset", "tiny", "--max-steps", "3"]
    done = run_script(
        "phrasescore-train-recipe", *args, "--models", "lstm,l2r", "--jobs", "2", *tiny,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    nn = tmp_path / "nn"
    assert sorted(p.name for p in nn.glob("*.safetensors")) == [
        "l2r.safetensors",
        "lstm.safetensors",
    ]
    # the recipe's order whatever the order given: l2r first
    started = [line.split()[2] for line in done.stderr.splitlines() if " training " in line]
    assert started == ["l2r", "lstm"]
    assert describe_file(str(nn / "lstm.safetensors")).fields["architecture"] == "lstm"
    assert "trained l2r lstm in" in done.stdout
    assert "not in " in done.stdout and "--models column,r2l,inverse trains them" in done.stdout
    assert "rescore" not in done.stdout and "rerank-tune" not in done.stdout  # models missing
    # no step can be run yet: what is missing, not a bare "next:"
    assert done.stdout.rstrip().splitlines()[-2:] == [
        "next: the column needs column.safetensors and --table; re-ranking needs l2r, r2l, lstm "
        "and",
        "  inverse: train the missing ones with --models, then run this script again to see the "
        "steps",
    ]
    # one model again: only it is replaced
    l2r_stamp = (nn / "l2r.safetensors").stat().st_mtime_ns
    lstm_bytes = (nn / "lstm.safetensors").read_bytes()
    again = run_script("phrasescore-train-recipe", *args, "--models", "lstm", *tiny, cwd=tmp_path)
    assert again.returncode == 1 and "--force" in again.stderr  # not without --force
    assert (nn / "lstm.safetensors").read_bytes() == lstm_bytes
    # --resume: on from its checkpoint (a budget may change), not from step 0
    longer = ["--", "--preset", "tiny", "--max-steps", "5"]
    resumed = run_script(
        "phrasescore-train-recipe", *args, "--models", "lstm", "--resume", *longer, cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "continuing lstm from its checkpoint (" in resumed.stderr
    assert "resuming at step 3 " in (nn / "lstm.stderr").read_text()
    assert "\tsteps=5\t" in (nn / "lstm.result").read_text()
    forced = run_script(
        "phrasescore-train-recipe", *args, "--models", "lstm", "--force", *tiny, cwd=tmp_path
    )
    assert forced.returncode == 0, forced.stderr
    assert (nn / "l2r.safetensors").stat().st_mtime_ns == l2r_stamp
    assert (nn / "lstm.safetensors").read_bytes() == lstm_bytes  # same seed, same bytes
    assert "trained lstm in" in forced.stdout
    assert "l2r.safetensors      left to right (" in forced.stdout  # listed, trained before


def test_train_recipe_stopped_mid_training_resumes_from_the_checkpoint(tmp_path):
    """SIGTERM (a job's time limit) stops the training and keeps its checkpoint; --resume goes
    on from it, not from step 0."""
    args = recipe_inputs(tmp_path)
    at = args.index("--table")
    args = [*args[:at], *args[at + 2 :], "--models", "l2r"]
    endless = ["--preset", "tiny", "--max-steps", "100000", "--valid-every", "5"]
    endless += ["--patience", "1000000", "--seed", "3"]  # ends only by the signal
    proc = subprocess.Popen(
        ["bash", str(BIN / "phrasescore-train-recipe"), *args, "--", *endless],
        cwd=tmp_path,
        env=script_environment(),
        stderr=subprocess.PIPE,
        text=True,
    )
    log = tmp_path / "nn" / "l2r.safetensors.log"
    while proc.poll() is None and ", validation perplexity" not in (
        log.read_text() if log.exists() else ""
    ):
        time.sleep(0.2)  # polls the log: the signal comes once a validation is written
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "interrupted: the trainings were stopped" in err
    checkpoint = str(tmp_path / "nn" / "l2r.safetensors.checkpoint")
    step = Trainer.read_checkpoint(checkpoint)["meta"]["position"]["step"]
    assert step >= 5
    endless[endless.index("--max-steps") + 1] = str(step + 3)  # a budget a resume may change
    resumed = run_script(
        "phrasescore-train-recipe", *args, "--resume", "--", *endless, cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "continuing l2r from its checkpoint" in resumed.stderr
    assert f"resuming at step {step} " in (tmp_path / "nn" / "l2r.stderr").read_text()
    assert f"\tsteps={step + 3}\t" in (tmp_path / "nn" / "l2r.result").read_text()


@pytest.mark.parametrize(
    "change, code, message",
    [
        ("unequal", 1, "--valid: corpus/dev.en has 50 lines but corpus/dev.fr has 49"),
        ("empty", 1, "corpus/train.en.gz: empty file"),
        ("--e de", 1, "--corpus: no file for --e de: neither corpus/train.de nor"),
        ("--f e-n", 2, "--f e-n is not a language code"),
        ("--e en", 2, "--f and --e are the same language (en)"),
        ("--table corpus/dev.en", 1, "corpus/dev.en:1: not a Moses phrase table line"),
        ("--table nope.gz", 1, "--table: no such phrase table: nope.gz"),
        ("--minutes 0", 2, "--minutes 0 is not a positive number"),
        ("--patience 0", 2, "--patience 0 is not a positive whole number"),
        ("--force --resume", 2, "--force and --resume: give one"),
        ("--device tpu", 2, "--device tpu: give cpu or cuda"),
        ("--graphs --device cpu", 2, "--graphs captures CUDA graphs: it needs --device cuda"),
        ("no --valid", 2, "missing --valid"),
        ("--models gru", 2, "--models: no model gru in the recipe (its models: column l2r"),
        ("--models l2r;lstm", 2, "--models l2r;lstm: give names separated by commas"),
        ("--models l2r,", 2, "--models l2r,: give names separated by commas"),
        ("no --table", 2, "missing --table"),
    ],
)
def test_train_recipe_bad_input_fails_before_training(change, code, message, tmp_path):
    args = recipe_inputs(tmp_path)
    if change == "unequal":
        lines = (tmp_path / "corpus/dev.fr").read_text().splitlines(keepends=True)
        (tmp_path / "corpus/dev.fr").write_text("".join(lines[:-1]))
    elif change == "empty":
        with gzip.open(tmp_path / "corpus/train.en.gz", "wt", encoding="utf-8"):
            pass
    elif change == "no --valid":
        args = args[:2] + args[4:]
    elif change == "no --table":  # the column's model needs it
        at = args.index("--table")
        args = args[:at] + args[at + 2 :] + ["--models", "column,l2r"]
    elif change == "--graphs --device cpu":
        args += change.split()
    else:
        flag, value = change.split()
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    done = run_script("phrasescore-train-recipe", *args, cwd=tmp_path)
    assert done.returncode == code
    [line] = done.stderr.splitlines()
    assert line.startswith("phrasescore-train-recipe: error: ") and message in line, line
    assert not (tmp_path / "nn").exists()  # nothing trained, not even the folder made


@pytest.mark.parametrize(
    "written",
    ["l2r.stderr", "column.safetensors.best", ".r2l.safetensors.lock"],
)  # fmt: skip  (.result and .log: the same check)
def test_train_recipe_refuses_an_input_named_like_a_file_it_writes(written, tmp_path):
    """An input named like a file the recipe writes (OUT/<model>.stderr or .result, which the
    shell's redirections would truncate, or train's own .best, .lock, .log beside a model) is
    refused before any model trains, and left as it was."""
    args = recipe_inputs(tmp_path)
    (tmp_path / "nn").mkdir()
    table = tmp_path / "nn" / written
    shutil.copyfile(tmp_path / "model/phrase-table.gz", table)
    args[args.index("--table") + 1] = f"nn/{written}"
    done = run_script("phrasescore-train-recipe", *args, cwd=tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("phrasescore-train-recipe: error: ")
    assert line.endswith(f"is the --table (nn/{written}): refusing to overwrite an input"), line
    assert os.listdir(tmp_path / "nn") == [written]
    assert table.read_bytes() == (tmp_path / "model/phrase-table.gz").read_bytes()


# ---------------------------------------------------------------------------- mert
def mert_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    ini = tmp_path / "moses.rescored.ini"
    ini.write_text("[feature]\n")
    dev_f, dev_e = tmp_path / "dev.en", tmp_path / "dev.fr"
    dev_f.write_text("a man .\n")
    dev_e.write_text("un homme .\n")
    return ini, dev_f, dev_e


@pytest.mark.parametrize("print_only, code", [(True, 0), (False, 1)])
def test_mert_without_moses_prints_the_command(print_only, code, tmp_path):
    ini, dev_f, dev_e = mert_inputs(tmp_path)
    flags = ["--print-only"] if print_only else []
    work = tmp_path / "mert-work"
    work.mkdir()
    (work / "features.list").write_text("stale\n")
    done = run_script(
        "phrasescore-mert", *flags, "--threads", "3", "mert-work", ini, dev_f, dev_e, cwd=tmp_path
    )
    assert done.returncode == code, done.stderr
    assert f"rm -f {work}/features.list" in done.stdout
    assert (
        f"$MOSES/scripts/training/mert-moses.pl {dev_f} {dev_e} $MOSES/bin/moses {ini} "
        f"--mertdir $MOSES/bin --working-dir {work} --decoder-flags '-threads 3'"
    ) in done.stdout
    assert "mert-moses.pl is not on PATH" in done.stderr
    assert (work / "features.list").exists()  # nothing is run without Moses


def test_mert_runs_mert_moses_and_removes_the_stale_feature_list(tmp_path):
    ini, dev_f, dev_e = mert_inputs(tmp_path)
    moses = tmp_path / "mosesdecoder"
    record, seen = tmp_path / "mert-args", tmp_path / "seen-files"
    make_executable(
        moses / "scripts" / "training" / "mert-moses.pl",
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "$@" > "{record}"\n'
        "while [[ $1 != --working-dir ]]; do shift; done\n"
        f'ls -A "$2" > "{seen}"\n',
    )
    make_executable(moses / "bin" / "moses", "#!/usr/bin/env bash\nexit 0\n")
    work = tmp_path / "mert-work"
    (work / "filtered").mkdir(parents=True)
    (work / "filtered" / "moses.ini").write_text("old\n")
    (work / "features.list").write_text("TranslationModel0= 0.2 0.2 0.2 0.2\n")
    done = run_script(
        "phrasescore-mert",
        "--threads",
        "2",
        work,
        ini,
        dev_f,
        dev_e,
        "--",
        "--maximum-iterations",
        "3",
        cwd=tmp_path,
        env_extra={"MOSES": str(moses)},
    )
    assert done.returncode == 0, done.stderr
    assert record.read_text().split("\n")[:-1] == [
        str(dev_f),
        str(dev_e),
        str(moses / "bin" / "moses"),
        str(ini),
        "--mertdir",
        str(moses / "bin"),
        "--working-dir",
        str(work),
        "--decoder-flags",
        "-threads 2",
        "--maximum-iterations",
        "3",
    ]
    assert seen.read_text() == ""  # features.list and filtered/ were gone
    assert f"{work}/moses.ini" in done.stdout


@pytest.mark.parametrize(
    "held, role",
    [
        ("features.list", "DEV_F"),  # the stale feature list the script removes
        ("filtered/phrase-table.gz", "phrase table TranslationModel0"),  # the stale model
        ("moses.ini -> the ini", "MOSES_INI"),  # mert-moses.pl's tuned ini, through a link
    ],
)
def test_mert_refuses_a_workdir_that_holds_an_input_before_any_work(tmp_path, held, role):
    """The script's clean-up (features.list, filtered/) and mert-moses.pl's own files would
    delete or replace an input that lives in WORKDIR, or that a link there points at."""
    ini, dev_f, dev_e = mert_inputs(tmp_path)
    moses = tmp_path / "mosesdecoder"
    ran = tmp_path / "ran"
    make_executable(
        moses / "scripts" / "training" / "mert-moses.pl", f'#!/usr/bin/env bash\ntouch "{ran}"\n'
    )
    make_executable(moses / "bin" / "moses", "#!/usr/bin/env bash\nexit 0\n")
    work = tmp_path / "mert-work"
    (work / "filtered").mkdir(parents=True)
    table = tmp_path / "phrase-table.gz"
    if held == "features.list":
        dev_f = work / "features.list"
        dev_f.write_text("a man .\n")
        path = dev_f
    elif held.startswith("filtered/"):
        table = work / held
        path = table
    else:
        (work / "moses.ini").symlink_to(ini)
        path = ini
    table.write_bytes(gzip.compress(b"a ||| un ||| 0.5 0.5 0.5 0.5 ||| ||| \n"))
    ini.write_text(
        "[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 "
        f"path={table} input-factor=0 output-factor=0\n"
    )
    before = {p: p.read_bytes() for p in (ini, dev_f, dev_e, table)}
    done = run_script(
        "phrasescore-mert", work, ini, dev_f, dev_e, cwd=tmp_path, env_extra={"MOSES": str(moses)}
    )
    assert done.returncode == 1, done.stderr
    assert error_lines(done.stderr) == [
        f"phrasescore-mert: error: WORKDIR {work} holds the {role} ({path}): the tools write "
        "their files there under their own names and would overwrite it; give a folder of its own"
    ]
    assert {p: p.read_bytes() for p in before} == before
    assert not ran.exists()


def test_mert_missing_ini(tmp_path):
    _, dev_f, dev_e = mert_inputs(tmp_path)
    done = run_script("phrasescore-mert", "w", tmp_path / "nope.ini", dev_f, dev_e, cwd=tmp_path)
    assert done.returncode == 1
    assert error_lines(done.stderr) == [
        f"phrasescore-mert: error: no such moses.ini: {tmp_path}/nope.ini"
    ]
    done = run_script("phrasescore-mert", "w", "x.ini", cwd=tmp_path)
    assert done.returncode == 2


# ---------------------------------------------------------------------------- ini-tables
def test_ini_tables_lists_tables_with_resolved_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("PT_DIR", "/data/pt")
    ini = tmp_path / "moses.ini"
    ini.write_text(
        "[feature]\n"
        "UnknownWordPenalty\n"
        "PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=phrase-table.gz "
        "input-factor=0 output-factor=0\n"
        "PhraseDictionaryCompact name=TranslationModel1 num-features=5 path=${PT_DIR}/pt "
        "input-factor=0,1 output-factor=0\n"
        "PhraseDictionaryMultiModel name=Mix0 num-features=4 components=TranslationModel0\n"
        "[weight]\n"
    )
    result = CliRunner().invoke(cli, ["ini-tables", str(ini)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"TranslationModel0\tPhraseDictionaryMemory\t{tmp_path}/phrase-table.gz\t4",
        "TranslationModel1\tPhraseDictionaryCompact\t/data/pt/pt\t5",
        "Mix0\tPhraseDictionaryMultiModel\t-\t4",
    ]
    result = CliRunner().invoke(cli, ["ini-tables", "--factors", str(ini)])
    assert result.output.splitlines()[1].split("\t")[-2:] == ["0,1", "0"]


def test_ini_tables_missing_ini(tmp_path):
    result = CliRunner().invoke(cli, ["ini-tables", str(tmp_path / "nope.ini")])
    assert result.exit_code == 1
    assert "no such moses.ini" in result.output
