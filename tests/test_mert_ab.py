"""The MERT A/B job's own logic (no Moses needed): weights, BLEU, bootstrap, the report.

The whole job against a real Moses build is in tests/test_moses_integration.py.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from phrasescore.cli import cli
from phrasescore.errors import InputError
from phrasescore.jobs.moses_install import MosesInstall
from phrasescore.jobs.tuning.ab import (
    ComparisonOptions,
    RunResult,
    System,
    SystemResult,
    compare_systems,
    corpus_bleu,
    format_report,
    new_feature_weights,
    paired_bootstrap_p,
    parse_rerank_sets,
    report_names,
    rerank_models,
)
from phrasescore.jobs.tuning.ab_rerank import RerankStep, dev_folds, write_part
from phrasescore.jobs.tuning.moses_tools import Programs
from phrasescore.moses.ini import read_weights
from phrasescore.moses.nbest import read_nbest
from phrasescore.moses.tuning import mert_best_bleu

DATA = Path(__file__).parent / "data"
SYSTEM = DATA / "moses-system"

TUNED_INI = """\
[feature]
PhraseDictionaryMemory name=TranslationModel0 num-features=5 path=/x/pt.gz input-factor=0 output-factor=0
KENLM name=LM0 factor=0 path=/x/lm.arpa order=5

[weight]
# tuned by mert-moses.pl
LM0= 0.0992
TranslationModel0= 0.0133 0.0592 0.0546 0.0412 0.0044
WordPenalty0= -0.2
"""


def test_read_weights_gives_every_feature_in_file_order():
    weights = read_weights(TUNED_INI)
    assert list(weights) == ["LM0", "TranslationModel0", "WordPenalty0"]
    assert weights["TranslationModel0"] == [0.0133, 0.0592, 0.0546, 0.0412, 0.0044]
    assert weights["WordPenalty0"] == [-0.2]


def test_read_weights_refuses_a_non_number_with_its_line():
    with pytest.raises(InputError, match=r"TranslationModel0: weights must be numbers") as err:
        read_weights("[weight]\nLM0= 0.5\nTranslationModel0= 0.2 x\n")
    assert err.value.line == 3


def test_new_weights_are_the_added_column_and_the_added_feature():
    base = {"TranslationModel0": [0.2] * 4, "LM0": [0.5]}
    cand = {"TranslationModel0": [0.1, 0.2, 0.3, 0.4, 0.05], "LM0": [0.5], "LM1": [0.3]}
    assert new_feature_weights(base, cand) == {"TranslationModel0[4]": [0.05], "LM1[0]": [0.3]}
    assert new_feature_weights(base, base) == {}


def test_bleu_and_bootstrap_on_real_sentences(tmp_path):
    refs = (SYSTEM / "test20.fr").read_text(encoding="utf-8").splitlines()
    same = tmp_path / "same.txt"
    same.write_text("\n".join(refs) + "\n", encoding="utf-8")
    worse = tmp_path / "worse.txt"
    worse.write_text("\n".join(" ".join(r.split()[:-2]) for r in refs) + "\n", encoding="utf-8")
    assert corpus_bleu(same, SYSTEM / "test20.fr", "none") == pytest.approx(100.0)
    worse_bleu = corpus_bleu(worse, SYSTEM / "test20.fr", "none")
    assert 30 < worse_bleu < 95
    # the reference itself against a clearly worse system: a tiny p; one changed sentence: no evidence
    assert paired_bootstrap_p(refs, worse, same, "none", 200) < 0.01
    nearly = tmp_path / "nearly.txt"
    nearly.write_text("\n".join(refs[:-1] + [refs[-1] + " ."]) + "\n", encoding="utf-8")
    assert paired_bootstrap_p(refs, same, nearly, "none", 200) > 0.05


def _result(name: str, bleus: list[float], new: dict[str, list[float]]) -> SystemResult:
    runs = [
        RunResult(seed=s, weights={}, bleu={"test": b}, dev_bleu=b + 1 if s != 3 else None)
        for s, b in zip((1, 2, 3), bleus, strict=False)
    ]
    return SystemResult(System(name, Path(f"/x/{name}.ini")), runs, new)


def test_mean_sd_closest_run_and_report():
    base = _result("baseline", [57.0, 57.6, 57.3], {})
    cand = _result("rnn", [58.0, 57.0, 58.3], {"TranslationModel0[4]": [0.004, 0.011, 0.02]})
    cand.p_values["test"] = 0.0123
    mean, sd = cand.bleu_mean_sd("test")
    assert mean == pytest.approx(57.7667, abs=1e-4)
    assert sd == pytest.approx(0.6807, abs=1e-4)
    assert cand.closest_to_mean("test").seed == 1  # 58.0 is nearest 57.77
    lines = format_report([base, cand], ["test"])
    assert lines[0].split()[:2] == ["system", "test"]
    assert lines[1].split()[:4] == ["baseline", "57.30", "±", "0.30"]
    assert "57.77 ± 0.68" in lines[2] and "0.0123" in lines[2]
    assert re.split(r"\s{2,}", lines[0])[2:4] == ["test per run", "dev per run"]
    assert "57.00 / 57.60 / 57.30  58.00 / 58.60 / -" in lines[1]  # a run's dev unknown: -
    assert "58.00 / 57.00 / 58.30  59.00 / 58.00 / -" in lines[2]
    assert "TranslationModel0[4]=0.004/0.011/0.02" in lines[2]
    assert "held out" not in lines[0]  # no re-ranked run: no held-out column
    for run, heldout in zip(cand.runs, (57.5, 56.25, 57.125), strict=True):
        run.heldout_dev_bleu = heldout
    lines = format_report([base, cand], ["test"])
    assert re.split(r"\s{2,}", lines[0])[3:5] == ["dev per run", "dev held out per run"]
    assert "59.00 / 58.00 / -  57.50 / 56.25 / 57.12" in lines[2]
    assert "58.00 / 58.60 / -  - / - / -" in lines[1]


def test_dev_folds_and_the_parts_tuned_on_keep_every_byte_but_the_id(tmp_path):
    assert dev_folds(5, 2) == [range(0, 3), range(3, 5)]
    assert dev_folds(1014, 2) == [range(0, 507), range(507, 1014)]
    assert [len(part) for part in dev_folds(10, 3)] == [4, 3, 3]
    with pytest.raises(InputError, match="cannot cut 1 dev sentences into 2 parts"):
        dev_folds(1, 2)
    nbest = DATA / "nbest" / "multi30k.test2016.ids0-4.100best.nbest.gz"
    entries = list(read_nbest(str(nbest)))
    write_part(nbest, [1, 3], tmp_path / "part.nbest")
    part = list(read_nbest(str(tmp_path / "part.nbest")))
    expected = [e for e in entries if e.id in (1, 3)]
    assert len(part) == len(expected) > 100
    assert [e.id for e in part] == [0 if e.id == 1 else 1 for e in expected]
    for got, want in zip(part, expected, strict=True):
        assert got.line().split("|||", 1)[1] == want.line().split("|||", 1)[1]
        assert got.line().startswith(f"{got.id} |||")


def test_without_moses_one_line_says_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.delenv("MOSES_HOME", raising=False)
    monkeypatch.delenv("MOSES", raising=False)
    with pytest.raises(InputError, match="Moses not found: set MOSES_HOME"):
        MosesInstall.find(None)
    with pytest.raises(InputError, match=r"lacks bin/moses, bin/mert"):
        MosesInstall.find(str(tmp_path))
    with pytest.raises(InputError, match="Moses not found"):
        compare_systems("base.ini", ["c.ini"], ("d.en", "d.fr"), [], str(tmp_path / "w"))
    with pytest.raises(InputError, match="nothing to compare: give --candidate INI, --rerank"):
        compare_systems("base.ini", [], ("d.en", "d.fr"), [], str(tmp_path / "w"))
    with pytest.raises(InputError, match="--rerank-system needs --rerank MODEL"):
        options = ComparisonOptions(rerank_systems=("rnn",))
        compare_systems("b.ini", ["c.ini"], ("d.en", "d.fr"), [], str(tmp_path), options=options)


def test_rerank_models_are_named_checked_and_distinct(tmp_path, tiny_model_path):
    one = (tiny_model_path,)
    assert rerank_models([tiny_model_path, f"Att={tiny_model_path}"]) == (
        ("RNNEncDec0", one, False),
        ("Att", one, False),
    )
    # target->source models: their own default names, the same name space as --rerank's
    assert rerank_models(
        [f"L2R={tiny_model_path}"], [tiny_model_path, f"Inv={tiny_model_path}"]
    ) == (
        ("L2R", one, False),
        ("RNNEncDecInv0", one, True),
        ("Inv", one, True),
    )
    # comma-separated models: one feature, their ensemble (each file checked)
    assert rerank_models([f"Ens={tiny_model_path},{tiny_model_path}"]) == (
        ("Ens", (tiny_model_path, tiny_model_path), False),
    )
    with pytest.raises(InputError, match="--rerank Ens model: no such file"):
        rerank_models([f"Ens={tiny_model_path},{tmp_path / 'none.safetensors'}"])
    with pytest.raises(InputError, match="--rerank-inverse L2R=.*: feature name L2R given twice"):
        rerank_models([f"L2R={tiny_model_path}"], [f"L2R={tiny_model_path}"])
    with pytest.raises(InputError, match="contains '_'"):
        rerank_models([f"Sent_0={tiny_model_path}"])
    with pytest.raises(InputError, match="feature name Att given twice"):
        rerank_models([f"Att={tiny_model_path}", f"Att={tiny_model_path}"])
    with pytest.raises(InputError, match="--rerank X model: no such file"):
        rerank_models([f"X={tmp_path / 'none.safetensors'}"])


def test_rerank_sets_name_subsets_of_the_features_in_their_order(tmp_path, tiny_model_path):
    """``--rerank-set``: each set's features in the order of --rerank / --rerank-inverse, the
    report's systems SYSTEM+SET per re-ranked system (the tuner's suffix after it); a feature
    that is not given, a set named twice or the same features twice is one error."""
    features = rerank_models(
        [f"L2R={tiny_model_path}", f"R2L={tiny_model_path}"], [f"Inv={tiny_model_path}"]
    )
    sets = parse_rerank_sets(["three=Inv,L2R,R2L", "l2r=L2R", "ends=Inv,L2R"], features)
    assert sets == (
        ("three", ("L2R", "R2L", "Inv")),
        ("l2r", ("L2R",)),
        ("ends", ("L2R", "Inv")),
    )
    systems = [System("baseline", Path("b.ini")), System("col", Path("c.ini"))]
    options = ComparisonOptions(rerank=features, rerank_sets=sets, rerank_systems=("col",))
    assert report_names(systems, options) == ["baseline", "col", "col+three", "col+l2r", "col+ends"]
    options.rerank_tuner = "kbmira"
    assert report_names(systems, options)[2:] == [
        "col+three-kbmira",
        "col+l2r-kbmira",
        "col+ends-kbmira",
    ]
    without_sets = ComparisonOptions(rerank=features)
    assert report_names(systems, without_sets)[2:] == ["baseline+rerank", "col+rerank"]
    for specs, message in [
        (["a=L2R,LSTM"], r"--rerank-set a=L2R,LSTM: LSTM: give names of --rerank / "
         r"--rerank-inverse features \(L2R, R2L, Inv\)"),
        (["a=L2R", "a=R2L"], "give each a distinct NAME=FEATURE,FEATURE"),
        (["L2R"], "give each a distinct NAME=FEATURE,FEATURE"),
        (["a="], "a=: no feature"),
        (["a=L2R,R2L", "b=R2L,L2R"], "--rerank-set b: the same features as a"),
        (["a=L2R,R2L"], "Inv: in no --rerank-set"),
    ]:  # fmt: skip
        with pytest.raises(InputError, match=message):
            parse_rerank_sets(specs, features)
    with pytest.raises(InputError, match="--rerank-set needs --rerank MODEL"):
        parse_rerank_sets(["a=L2R"], ())


def test_the_report_says_which_system_its_p_values_compare_with():
    base = _result("baseline", [57.0, 57.6, 57.3], {})
    one = _result("baseline+one", [58.0, 57.0, 58.3], {})
    base.p_values["test"] = 0.002
    assert re.split(r"\s{2,}", format_report([base, one], ["test"])[0])[4] == "p (test)"
    lines = format_report([base, one], ["test"], against="baseline+one")
    assert re.split(r"\s{2,}", lines[0])[4] == "p (test vs baseline+one)"
    assert "0.0020" in lines[1] and "0.0020" not in lines[2]


def test_cli_without_moses_is_one_line_exit_1(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MOSES_HOME", "MOSES")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "phrasescore",
            "ab",
            "--baseline",
            "b.ini",
            "--candidate",
            "c.ini",
            "--dev",
            str(SYSTEM / "dev50.en"),
            str(SYSTEM / "dev50.fr"),
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "Moses not found: set MOSES_HOME" in proc.stderr


def test_programs_stop_ends_every_running_process_group_and_starts_no_more(tmp_path):
    """An interrupted ab stops its mert-moses.pl and the decoders it started (one process
    group each) instead of finishing its queue of MERT runs."""
    import threading

    programs = Programs()
    errors = []
    # a program with a child of its own, as mert-moses.pl starts moses: both must end
    script = "sleep 600 & echo $! > child.pid; wait"

    def run():
        try:
            programs.run(["sh", "-c", script], tmp_path, "prog.log")
        except InputError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=run)
    thread.start()
    pid_file = tmp_path / "child.pid"
    for _ in range(6000):  # wait (up to a minute) for the child to start
        if pid_file.exists() and pid_file.read_text().strip():
            break
        threading.Event().wait(0.01)
    child = int(pid_file.read_text())
    programs.stop()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert errors and "failed with exit code -15" in errors[0]
    for _ in range(6000):  # the orphaned child is reaped by init soon after its SIGTERM
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
            break
        threading.Event().wait(0.01)
    else:
        raise AssertionError(f"child {child} still runs")
    with pytest.raises(InputError, match="stopped before sh"):
        programs.run(["sh", "-c", "true"], tmp_path, "late.log")


def phrasescore_in_process(command: list[str], cwd: Path) -> None:
    """A ``python -m phrasescore ...`` command of a step, run by the CLI in this process (the
    command's own code, without a process's start-up) in its work folder ``cwd``, as ``ab``'s
    :class:`Programs` runs it."""
    assert command[:3] == [sys.executable, "-m", "phrasescore"], command
    before = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(cli, ["-q", *command[3:]])
    finally:
        os.chdir(before)
    assert result.exit_code == 0, result.output


def test_rerank_caches_are_keyed_on_the_nbest_size(tmp_path, tiny_model_path):
    """Another --nbest-size in the same workdir scores its own lists: the 100-best's scored
    list is never taken for the 500-best's (and the 100-best keeps its earlier file names)."""
    data = Path(__file__).parent / "data" / "nbest"
    source = data / "multi30k.test2016.head5.tok.lc.en"
    with gzip.open(data / "multi30k.test2016.ids0-4.100best.nbest.gz", "rt") as lines:
        full = lines.read().splitlines(keepends=True)
    lists = {100: tmp_path / "dev.100best.nbest", 500: tmp_path / "dev.500best.nbest"}
    seen: dict[str, int] = {}  # the first 20 hypotheses of each sentence: the shorter list
    shorter = []
    for line in full:
        sentence = line.split(" ||| ")[0]
        seen[sentence] = seen.get(sentence, 0) + 1
        if seen[sentence] <= 20:
            shorter.append(line)
    lists[100].write_text("".join(shorter))
    lists[500].write_text("".join(full))

    def run(command, cwd, log_name):
        phrasescore_in_process(command, cwd)

    models = rerank_models([f"L2R={tiny_model_path}"])
    scored = {}
    for size, nbest in lists.items():
        step = RerankStep(models, "mert", 5, 1, str, run, nbest_size=size)
        scored[size] = step.score(nbest, "dev", source, tmp_path)
    digest = hashlib.sha256(RerankStep(models, "mert", 5, 1, str, run).model_labels[0].encode())
    assert scored[100] == tmp_path / "scored" / f"dev.{digest.hexdigest()[:10]}.nbest"
    assert scored[500] != scored[100]
    counts = {size: len(path.read_text().splitlines()) for size, path in scored.items()}
    assert counts == {100: len(shorter), 500: len(full)} and len(shorter) < len(full)
    assert all(" L2R= " in line for line in scored[500].read_text().splitlines())


def test_each_way_of_tuning_the_reranking_has_its_own_systems_and_weights_file():
    """mert on every weight keeps the names of workdirs made before the choices (they resume);
    kbmira and --rerank-tune new are systems of their own, with weights files of their own."""
    from phrasescore.jobs.tuning.ab_rerank import RerankStep

    def step(tuner: str, weights: str = "all") -> RerankStep:
        return RerankStep((), tuner, 5, 1, str, print, tuned_weights=weights)

    assert (step("mert").name, step("mert").tuned_weights_name) == ("rerank", "weights.txt.ini")
    assert (step("kbmira").name, step("kbmira").tuned_weights_name) == (
        "rerank-kbmira",
        "weights.kbmira.ini",
    )
    assert (step("mert", "new").name, step("mert", "new").tuned_weights_name) == (
        "rerank-new",
        "weights.new.ini",
    )


def test_rerank_tune_new_with_kbmira_is_one_line_before_moses_is_looked_for(
    tmp_path, tiny_model_path
):
    result = CliRunner().invoke(
        cli,
        ["-q", "ab", "--baseline", str(tmp_path / "moses.ini"), "--rerank", str(tiny_model_path),
         "--rerank-tuner", "kbmira", "--rerank-tune", "new", "--dev", "d.en", "d.fr",
         "--test", "t", "t.en", "t.fr", "--workdir", str(tmp_path / "ab"),
         "--moses-home", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if "error" in line]
    assert errors and "--rerank-tune new moves the models' weights with mert's -o" in errors[0], (
        result.output
    )


def real_list(path: Path) -> tuple[Path, Path]:
    """The real Moses 100-best list of tests/data/nbest (5 test_2016 sentences) written to
    ``path``, and its source sentences."""
    data = Path(__file__).parent / "data" / "nbest"
    with gzip.open(data / "multi30k.test2016.ids0-4.100best.nbest.gz", "rt") as lines:
        path.write_text(lines.read())
    return path, data / "multi30k.test2016.head5.tok.lc.en"


def test_a_test_list_is_scored_once_for_every_choice_of_reranking_weights(
    tmp_path, tiny_model_path
):
    """The test list scored by the models is kept (scored/, as the dev list), and each tuned
    variant (every weight, then the models' alone) re-ranks it without scoring it again: the
    second variant runs one nbest call, with --weights and no model; both 1-best outputs have
    a line per sentence, each a hypothesis of that sentence."""
    nbest, source = real_list(tmp_path / "t16.100best.nbest")
    commands = []

    def run(command, cwd, log_name):
        commands.append(command)
        phrasescore_in_process(command, cwd)

    models = rerank_models([f"L2R={tiny_model_path}"])
    first = next(iter(read_nbest(str(nbest))))
    values: dict[str, int] = {}  # each feature's number of values
    for field in first.features.split():
        if field.endswith("="):
            name = field
            values[name] = 0
        else:
            values[name] += 1
    weights = tmp_path / "weights.ini"
    lines = [f"{name} {' '.join(['0.1'] * n)}\n" for name, n in values.items()]
    weights.write_text("".join(lines) + "L2R= 0.5\n")
    outputs = {}
    for tune in ("all", "new"):
        commands.clear()
        step = RerankStep(models, "mert", 5, 1, str, run, tuned_weights=tune)
        outputs[tune] = step.rerank(nbest, "t16", source, tmp_path, weights)
        with_models = [c for c in commands if any(a.startswith("L2R=") for a in c)]
        assert len(with_models) == (1 if tune == "all" else 0), commands
        assert len(commands) == (2 if tune == "all" else 1)
    assert outputs["all"] != outputs["new"]
    assert len(list((tmp_path / "scored").iterdir())) == 1
    hypotheses = {}
    for entry in read_nbest(str(nbest)):
        hypotheses.setdefault(entry.id, set()).add(entry.hypothesis)
    for path in outputs.values():
        best = path.read_text().splitlines()
        assert len(best) == 5 and all(b in hypotheses[i] for i, b in enumerate(best))
    assert outputs["all"].read_text() == outputs["new"].read_text()  # the same weights


def test_a_set_of_models_scores_only_the_models_no_earlier_set_scored(
    tmp_path, monkeypatch, tiny_model_path, tiny_second_seed_model_path, tiny_inverse_model_path
):
    """A second set of re-ranking models in the same run, its first model swapped and its
    target->source model kept, scores the swapped model alone (one ``nbest`` call) and leaves
    the kept model's list untouched; each set's scored list is the bytes of one ``nbest`` call
    with all its models. The second set is given paths relative to the current folder."""
    nbest, source = real_list(tmp_path / "dev.100best.nbest")
    scored_models = []

    def run(command, cwd, log_name):
        scored_models.append([a.split("=")[0] for a in command if "=" in a])
        phrasescore_in_process(command, cwd)

    def one_call(models: list[str], out: Path) -> bytes:
        command = [sys.executable, "-m", "phrasescore", "nbest", str(nbest), "--source"]
        phrasescore_in_process([*command, str(source), *models, "-o", str(out)], tmp_path)
        return out.read_bytes()

    inverse = ["--inverse-model", f"Inv={tiny_inverse_model_path}"]
    sets = {
        "first": ["-m", f"L2R={tiny_model_path}", *inverse],
        "second": ["-m", f"L2RB={tiny_second_seed_model_path}", *inverse],
    }
    scored, calls, kept = {}, {}, None
    for name, flags in sets.items():
        scored_models.clear()
        models = rerank_models([flags[1]], [flags[3]])
        step = RerankStep(models, "mert", 5, 1, str, run)
        if name == "second":
            monkeypatch.chdir(tmp_path)
            scored[name] = step.score(Path(nbest.name), "dev", source, Path("."))
        else:
            scored[name] = step.score(nbest, "dev", source, tmp_path)
        calls[name] = list(scored_models)
        inverse_list = step.scored_list(tmp_path, "dev", step.model_labels[1:])
        if kept is None:
            kept = inverse_list.stat().st_mtime_ns
        assert scored[name].read_bytes() == one_call(flags, tmp_path / f"{name}.nbest")
    assert calls == {"first": [["L2R"], ["Inv"]], "second": [["L2RB"]]}
    assert inverse_list.stat().st_mtime_ns == kept
    assert len(list((tmp_path / "scored").iterdir())) == 5  # L2R, Inv, L2RB and the two sets


def test_the_dev_bleu_of_a_mert_run_is_its_last_iterations_best_point(tmp_path):
    """mert-moses.pl's runN.mert.log, the highest N with a best point (a killed iteration's
    log has none); mert's own line from tests/data, progress bytes and carriage returns around
    it."""
    best_point = (DATA / "nbest" / "mert" / "mert.best-point.txt").read_bytes()
    assert mert_best_bleu(tmp_path) is None
    (tmp_path / "run1.mert.log").write_bytes(b"Best point: 0.1 0.2 0.7  => 0.25\n")
    assert mert_best_bleu(tmp_path) == 0.25
    (tmp_path / "run2.mert.log").write_bytes(b"shard 1\r\xff\n50%\r" + best_point + b"done\r\n")
    (tmp_path / "run10.mert.log").write_bytes(b"killed before its best point\n")
    (tmp_path / "run.mert.log").write_bytes(b"Best point: 1  => 0.99\n")
    assert mert_best_bleu(tmp_path) == pytest.approx(0.768998)
