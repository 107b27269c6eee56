"""phrasescore recipe: the whole recipe as one resumable command, on a small real system.

The system: the 171 sample pairs of tests/data/text as the training corpus, 20 dev and 20 test
sentences of tests/data/moses-system; with MOSES_HOME, that system's 21,605-line table and a
5-gram KenLM that Moses' lmplz builds from the example corpus (the Moses steps run: MERT, the
decoder, rerank-tune); without it, the 200-line table sample (the Moses steps are skipped). The
models are tiny (2 updates): what is checked is which steps run and which bytes come out.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phrasescore.errors import InputError
from phrasescore.jobs.recipe.recipe import RecipeOptions, run_recipe

from . import forked_cli

DATA = Path(__file__).parent / "data"
EXAMPLES = Path(__file__).parent.parent / "examples"
MOSES_HOME = os.environ.get("MOSES_HOME")
HAS_MOSES = bool(MOSES_HOME) and Path(str(MOSES_HOME), "bin", "moses").is_file()
TRAIN_FLAGS = ["--preset", "tiny", "--max-steps", "2", "--seed", "1"]
SMALL = ["--jobs", "1", "--nbest-size", "10", "--mert-iterations", "1", "--runs", "1"]
TRAIN_STEPS = ["train-l2r", "train-r2l", "train-inverse", "train-lstm", "train-column"]
SCORING = ["l2r", "r2l", "lstm", "inverse"]
"""The sentence models, each scoring each list in a step of its own (nbest-SET-MODEL)."""
MOSES_STEPS = ["sets", "mert", "decode-dev", "decode-test"]
MOSES_STEPS += [
    step
    for name in ("dev", "test")
    for step in [*(f"nbest-{name}-{model}" for model in SCORING), f"nbest-{name}"]
]
MOSES_STEPS += ["rerank-tune", "rerank-test", "bleu"]
ALL_STEPS = TRAIN_STEPS + ["rescore"] + MOSES_STEPS
WIDTH = max(map(len, ALL_STEPS))
"""The plan's column of step names."""
KILLED = ["train-column", "rescore"]
"""A step of each kind the recipe kills in turn (then resumes); the Moses ones with Moses."""
if HAS_MOSES:
    KILLED += ["sets", "mert", "decode-test", "nbest-dev-l2r", "nbest-dev", "rerank-tune"]
    KILLED += ["rerank-test", "bleu"]

INI = """\
[input-factors]
0

[mapping]
0 T 0

[distortion-limit]
6

[feature]
UnknownWordPenalty
WordPenalty
PhrasePenalty
PhraseDictionaryMemory name=TranslationModel0 num-features=4 path={table} input-factor=0 output-factor=0
Distortion
{lm}
[weight]
UnknownWordPenalty0= 1
WordPenalty0= -1
PhrasePenalty0= 0.2
TranslationModel0= 0.2 0.2 0.2 0.2
Distortion0= 0.3
{lm_weight}
"""


def head(source: Path, target: Path, lines: int) -> None:
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt", encoding="utf-8") as text:
        target.write_text("".join(itertools.islice(text, lines)), encoding="utf-8")


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> Path:
    """The Moses system and its corpus, dev and test sets (STEM.en, STEM.fr) in one folder."""
    folder = tmp_path_factory.mktemp("system")
    for lang in ("en", "fr"):
        head(DATA / "text" / f"multi30k-sample.tok.lc.{lang}.gz", folder / f"train.{lang}", 171)
        head(DATA / "moses-system" / f"dev50.{lang}", folder / f"dev.{lang}", 20)
        head(DATA / "moses-system" / f"test20.{lang}", folder / f"test.{lang}", 20)
    lm, lm_weight = "", ""
    if HAS_MOSES:
        table = folder / "phrase-table.gz"
        shutil.copy(DATA / "moses-system" / "phrase-table.gz", table)
        arpa, binary = folder / "lm.fr.arpa", folder / "lm.fr.blm"
        with open(arpa, "wb") as out, gzip.open(EXAMPLES / "corpus" / "train.tok.lc.fr.gz") as fr:
            lmplz = [f"{MOSES_HOME}/bin/lmplz", "-o", "5", "-S", "10%", "-T", str(folder)]
            subprocess.run(
                lmplz, input=fr.read(), stdout=out, stderr=subprocess.DEVNULL, check=True
            )
        build = [f"{MOSES_HOME}/bin/build_binary", str(arpa), str(binary)]
        subprocess.run(build, stdout=subprocess.DEVNULL, check=True)
        lm, lm_weight = f"KENLM name=LM0 factor=0 path={binary} order=5\n", "LM0= 0.5"
    else:
        table = folder / "phrase-table.gz"
        shutil.copy(DATA / "text" / "multi30k-phrase-table-sample.gz", table)
    ini = INI.format(table=table, lm=lm, lm_weight=lm_weight)
    (folder / "moses.ini").write_text(ini, encoding="utf-8")
    return folder


def recipe_command(system: Path, work: Path, *extra: str) -> list[str]:
    """``phrasescore recipe`` on ``system`` into ``work``, run by :func:`run` (its trainings
    too: train-recipe runs phrasescore as $PHRASESCORE says)."""
    return [
        *[sys.executable, forked_cli.__file__, "recipe", "--moses-ini", str(system / "moses.ini")],
        *["--corpus", str(system / "train"), "--dev", str(system / "dev")],
        *["--test", str(system / "test"), "--f", "en", "--e", "fr", "-o", str(work), *SMALL],
        *extra,
        *["--", *TRAIN_FLAGS],
    ]


def run(command: list[str], kill: str | None = None) -> subprocess.CompletedProcess:
    """A ``recipe_command`` in a child of the tests' forking server (tests/forked_cli.py)."""
    env = {**os.environ, **forked_cli.client_environment()}
    env.pop("PHRASESCORE_RECIPE_KILL_IN", None)
    if kill:
        env["PHRASESCORE_RECIPE_KILL_IN"] = kill
    return subprocess.run(command, capture_output=True, text=True, env=env)


def recipe(system: Path, work: Path, *extra: str, kill: str | None = None):
    return run(recipe_command(system, work, *extra), kill=kill)


def states(stdout: str) -> dict[str, str]:
    """Step name -> what the run did with it (``ran``, ``up to date``, ``skipped``, ``run``)."""
    found = {}
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] in ALL_STEPS:
            found[fields[0]] = "up to date" if fields[1] == "up" else fields[1]
    return found


def finished(work: Path) -> dict[str, tuple[bytes, int, int]]:
    """Each stamped step's stamp, its mtime and its log's mtime: what a resumed run keeps."""
    logs = work / "logs"
    return {
        stamp.stem: (
            stamp.read_bytes(),
            stamp.stat().st_mtime_ns,
            (logs / f"{stamp.stem}.log").stat().st_mtime_ns,
        )
        for stamp in logs.glob("*.stamp")
    }


def final_outputs(work: Path) -> dict[str, bytes]:
    """The recipe's outputs, each step's, with the work folder's path taken out (the rescored
    ini, the tuned ini and the results name files in it)."""
    names = [f"nn/{name.split('-')[1]}.safetensors" for name in TRAIN_STEPS]
    names += ["model/phrase-table.rescored.gz", "model/moses.rescored.ini"]
    if HAS_MOSES:
        names += ["data/dev.en", "data/test.fr", "mert/moses.ini", "lists/dev.10best.nbest"]
        names += ["lists/test.1best.fr", "lists/dev.scored.nbest", "lists/test.scored.nbest"]
        names += [f"lists/test.{model}.nbest" for model in SCORING]
        names += ["rerank.weights", "test.reranked.fr", "results.txt"]
    outputs = {}
    for name in names:
        data = (work / name).read_bytes()
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        lines = data.replace(str(work).encode(), b"WORK").splitlines(keepends=True)
        # mert-moses.pl dates the ini it writes
        outputs[name] = b"".join(line for line in lines if not line.startswith(b"# finished"))
    return outputs


@pytest.fixture(scope="module")
def uninterrupted(system, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("uninterrupted") / "work"
    proc = recipe(system, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = {name: "ran" for name in ALL_STEPS}
    if not HAS_MOSES:
        expected.update({name: "skipped" for name in MOSES_STEPS})
    assert states(proc.stdout) == expected
    return work


def test_dry_run_prints_every_step_and_its_command_and_writes_nothing(system, tmp_path):
    work = tmp_path / "work"
    proc = recipe(system, work, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert not work.exists()
    plan = states(proc.stdout)
    assert list(plan) == ALL_STEPS
    assert all(plan[name] == "run" for name in TRAIN_STEPS + ["rescore"])
    lines = proc.stdout.splitlines()
    rescore = lines.index(next(line for line in lines if line.split()[:1] == ["rescore"]))
    assert "run (after train-column)" in lines[rescore]
    assert lines[rescore + 1].split()[1:4] == [sys.executable, "-m", "phrasescore"]
    assert f"--ini-out {work}/model/moses.rescored.ini" in lines[rescore + 1]
    if HAS_MOSES:
        assert plan["mert"] == "run" and "mert-moses.pl" in proc.stdout
    else:
        assert {plan[name] for name in MOSES_STEPS} == {"skipped"}
        assert "needs Moses: set MOSES_HOME" in proc.stdout


def test_a_recipe_killed_in_any_step_resumes_with_that_step_and_ends_as_an_uninterrupted_one(
    system, uninterrupted, tmp_path
):
    work = tmp_path / "work"
    before: dict = {}
    for index, step in enumerate(KILLED):
        proc = recipe(system, work, kill=step)
        assert proc.returncode == -9, (step, proc.stderr[-3000:])
        done = finished(work)
        assert step not in done  # killed before its stamp: the next run redoes it
        if index > 0:
            killed_before = KILLED[index - 1]
            assert done[killed_before][0]  # the step killed last time was redone
            assert {name: done[name] for name in before} == before, step  # the rest was not
            if killed_before.startswith("train-"):  # from its checkpoint, not from step 0
                model = killed_before.split("-")[1]
                log = (work / "logs" / f"{killed_before}.log").read_text()
                assert f"continuing {model} from its checkpoint" in log
                assert "resuming at step 2" in (work / "nn" / f"{model}.stderr").read_text()
        if step.startswith("train-"):
            plan = recipe(system, work, "--dry-run").stdout
            assert f"{step:<{WIDTH}}  run (stopped: continues from its progress)" in plan
            assert f"--models {step.split('-')[1]} -o {work}/nn --resume" in plan
        before = done
    proc = recipe(system, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = states(proc.stdout)
    ran = [name for name, state in final.items() if state == "ran"]
    # what had not finished, the step killed last among it; nothing that had
    assert KILLED[-1] in ran
    assert ran == [
        name for name, state in final.items() if state != "skipped" and name not in before
    ]
    assert final_outputs(work) == final_outputs(uninterrupted)

    # every step up to date now; a changed setting or a newer input reruns what it decides
    assert set(states(recipe(system, work, "--dry-run").stdout).values()) <= {
        "up to date",
        "skipped",
    }
    if HAS_MOSES:
        for changed in (["--runs", "2"], ["--tune", "new"]):
            plan = recipe(system, work, "--dry-run", *changed).stdout
            runs = [name for name, state in states(plan).items() if state == "run"]
            assert runs == ["rerank-tune", "rerank-test", "bleu"]
            assert f"{'rerank-tune':<{WIDTH}}  run (settings changed: rerank-tune)" in plan
        assert "--tune new" in plan
    os.utime(system / "phrase-table.gz")
    plan = states(recipe(system, work, "--dry-run").stdout)
    runs = [name for name, state in plan.items() if state == "run"]
    assert runs == ["train-column", "rescore"] + (MOSES_STEPS[1:] if HAS_MOSES else [])
    kept = finished(work)
    proc = recipe(system, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [name for name, state in states(proc.stdout).items() if state == "ran"] == runs
    for name in ["train-l2r", "train-r2l", "train-inverse", "train-lstm"]:
        assert finished(work)[name] == kept[name]
    assert final_outputs(work) == final_outputs(uninterrupted)
    if not HAS_MOSES:
        return

    # a model trained again (here: its file newer) scores its two lists again, no other model
    os.utime(work / "nn" / "lstm.safetensors")
    kept = finished(work)
    proc = recipe(system, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = [name for name, state in states(proc.stdout).items() if state == "ran"]
    assert (
        ran == ["nbest-dev-lstm", "nbest-dev", "nbest-test-lstm", "nbest-test"] + MOSES_STEPS[-3:]
    )
    for name in ("l2r", "r2l", "inverse"):
        assert finished(work)[f"nbest-test-{name}"] == kept[f"nbest-test-{name}"]
    assert final_outputs(work) == final_outputs(uninterrupted)


def test_changed_training_flags_retrain_the_five_models(system, uninterrupted):
    flags = ["--preset", "tiny", "--max-steps", "3", "--seed", "1"]
    command = recipe_command(system, uninterrupted, "--dry-run")[: -len(TRAIN_FLAGS)] + flags
    proc = run(command)
    plan = states(proc.stdout)
    assert [name for name, state in plan.items() if state == "run"][:6] == TRAIN_STEPS + ["rescore"]
    assert f"{'train-l2r':<{WIDTH}}  run (settings changed: train)" in proc.stdout
    stamp = json.loads((uninterrupted / "logs" / "train-l2r.stamp").read_text())
    assert stamp["settings"]["train"] == TRAIN_FLAGS


def options(system: Path, folder: Path, **changes) -> RecipeOptions:
    values = dict(
        moses_ini=str(system / "moses.ini"),
        corpus=str(system / "train"),
        dev=str(system / "dev"),
        test=str(system / "test"),
        f="en",
        e="fr",
        work=str(folder),
        moses_home=None,
    )
    return RecipeOptions(**{**values, **changes})


def test_bad_inputs_are_refused_before_the_first_step(system, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "short.en").write_text("a\nb\n", encoding="utf-8")
    (bad / "short.fr").write_text("a\n", encoding="utf-8")
    lines = gzip.decompress((system / "phrase-table.gz").read_bytes()).splitlines(keepends=True)
    broken = b"".join(lines[:5] + [b"le chat ||| the cat\n"] + lines[5:])
    (bad / "table.gz").write_bytes(gzip.compress(broken))
    relative_ini = (system / "moses.ini").read_text().replace(f"path={system}/lm", "path=lm")
    (bad / "relative.ini").write_text(relative_ini, encoding="utf-8")
    (bad / "moses").mkdir()
    work = tmp_path / "work"
    cases = [
        (dict(corpus=str(bad / "short")), "has 2 lines but"),
        (dict(dev=str(bad / "nothing")), "--dev"),
        (dict(f="en", e="en"), "the same language"),
        (dict(f="english"), "not a language code"),
        (dict(table=str(bad / "table.gz")), f"{bad / 'table.gz'}:6:"),
        (dict(moses_home=str(bad / "moses")), "lacks bin/moses"),
        (dict(work=str(system)), "holds the"),
    ]
    if HAS_MOSES:
        cases.append((dict(moses_ini=str(bad / "relative.ini"), moses_home=MOSES_HOME), "relative"))
    for changes, message in cases:
        with pytest.raises(InputError, match=message.replace("(", r"\(")):
            run_recipe(options(system, work, **changes))
        assert not work.exists(), changes


def test_a_bad_input_is_one_line_and_exit_1(system, tmp_path):
    command = recipe_command(system, tmp_path / "work")
    command[command.index("--dev") + 1] = str(tmp_path / "missing")
    proc = run(command)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert f"--dev {tmp_path / 'missing'}: neither" in proc.stderr
    assert not (tmp_path / "work").exists()


@pytest.mark.skipif(not HAS_MOSES, reason="the n-best lists come from Moses")
def test_each_lists_joined_features_are_the_bytes_of_one_nbest_call_with_the_four_models(
    uninterrupted, tmp_path
):
    lists, nn = uninterrupted / "lists", uninterrupted / "nn"
    for name in ("dev", "test"):
        one_call = tmp_path / f"{name}.nbest"
        models = ["-m", f"L2R={nn}/l2r.safetensors", "-m", f"R2L={nn}/r2l.safetensors"]
        models += ["-m", f"LSTM={nn}/lstm.safetensors"]
        models += ["--inverse-model", f"Inv={nn}/inverse.safetensors"]
        proc = forked_cli.run_phrasescore(
            ["nbest", str(lists / f"{name}.10best.nbest"), "--source"]
            + [str(uninterrupted / "data" / f"{name}.en"), *models, "-o", str(one_call)]
            + ["--no-progress", "--device", "cpu", "--threads", "1"]
        )
        assert proc.returncode == 0, proc.stderr
        joined = (lists / f"{name}.scored.nbest").read_bytes()
        assert joined == one_call.read_bytes()
        assert joined.count(b"\n") == (lists / f"{name}.10best.nbest").read_bytes().count(b"\n")
        assert b" L2R= " in joined and b" Inv= " in joined


def test_on_gpus_five_steps_share_each_gpu_and_split_the_cores(monkeypatch):
    """The default --jobs: the five trainings (and the eight scoring steps) at once per GPU, as
    train-recipe runs them, each step its share of the cores; one step per core on the CPU."""
    import torch

    from phrasescore.jobs.recipe.inputs import Machine, machine

    cpus = len(os.sched_getaffinity(0))
    assert machine("cpu", None) == Machine("cpu", cpus, 1, 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # no GPU here: the plan alone
    assert machine(None, None) == Machine("cuda", 10, max(1, cpus // 10), 2)
    assert machine("cuda", 3) == Machine("cuda", 3, max(1, cpus // 3), 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert machine(None, None).device == "cpu"
    with pytest.raises(InputError, match="--device cuda: PyTorch sees no GPU"):
        machine("cuda", None)
