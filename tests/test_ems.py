"""phrasescore's steps in Moses' EMS: ``ems-meta`` splices them into experiment.meta.

Without Moses: the splice on a small meta written here (every new step's inputs are produced by
some step, the text it does not change comes back byte for byte, its errors are one line), and
the re-ranking step's command as experiment.perl writes it, run by sh. With MOSES_HOME (skipped
otherwise, as the other Moses integration tests): the splice of the build's own experiment.meta
plans Moses' baseline step for step when the config does not turn phrasescore on, and
examples/ems/config runs end to end under ``experiment.perl -exec`` with tiny models (the column
tuned by MERT, the re-ranked test BLEU beside the tuned system's own, each set decoded once),
then without its [EVALUATION] nbest line (the re-ranking step's one error line).
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
from pathlib import Path

import pytest

from phrasescore.jobs.recipe.ems import Commands, installed_commands, rerank_step, splice
from phrasescore.moses.ems_meta import parse_meta
from tests.conftest import run_cli

MOSES_HOME = os.environ.get("MOSES_HOME")
needs_moses = pytest.mark.skipif(
    not MOSES_HOME or not Path(MOSES_HOME, "scripts", "ems", "experiment.perl").is_file(),
    reason="needs a Moses build: set MOSES_HOME (bin/, scripts/ems/experiment.perl)",
)
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ems"
SYMAL = Path(__file__).parent / "data" / "ems" / "symal"
TRAIN_SETTINGS = "-- --preset tiny --max-steps 2 --seed 1"

# The steps of Moses' meta that the splice places its own beside or changes, in its format.
SMALL_META = """\
# a comment line
[CORPUS] multiple
get-corpus
\tin: get-corpus-script
\tout: raw-stem
\ttemplate: IN OUT

[TRAINING] single
consolidate
\tin: CORPUS:raw-stem
\tout: corpus
\tdefault-name: corpus
build-ttable
\tin: corpus
\tout: phrase-translation-table
sigtest-filter-reordering
\tin: phrase-translation-table
\tout: sigtest-filter-phrase-translation-table
create-config
\tin: sigtest-filter-phrase-translation-table
\tout: config
binarize-config
\tin: config
\tout: bin-config
\tpass-unless: binarize-all
\ttemplate: $binarize-all IN OUT \\
\t\t-Binarizer x

[TUNING] single
input
\tin: input-raw
\tout: input
reference
\tin: reference-raw
\tout: reference
filter
\tin: input TRAINING:sigtest-filter-phrase-translation-table
\tout: filtered-dir
\tignore-if: TRAINING:binarize-all
apply-filter
\tin: TRAINING:bin-config filtered-dir
\tout: filtered-config
tune
\tin: filtered-config input reference
\tout: weight-config
apply-weights
\tin: TRAINING:bin-config weight-config
\tout: config-with-reused-weights

[EVALUATION] multiple
input
\tin: input-raw
\tout: input
filter
\tin: input TRAINING:sigtest-filter-phrase-translation-table
\tout: filtered-dir
apply-filter
\tin: filtered-dir TRAINING:config TUNING:config-with-reused-weights
\tout: filtered-config
decode
\tin: TUNING:config-with-reused-weights input filtered-config
\tout: system-output
remove-markup
\tin: system-output
\tout: cleaned-output
"""


def _produced(meta) -> set[str]:
    return set(meta.outputs())


def _missing_inputs(meta, given: set[str]) -> list[str]:
    """``MODULE:step reads X`` for each input of a phrasescore step that no step produces."""
    made = _produced(meta) | given
    missing = []
    for module in meta.modules:
        for step in module.steps:
            if not step.name.startswith("phrasescore-"):
                continue
            for name in step.inputs():
                options = [o if ":" in o else f"{module.name}:{o}" for o in name.split("=OR=")]
                if not any(option in made for option in options):
                    missing.append(f"{module.name}:{step.name} reads {name}")
    return missing


def test_every_new_step_reads_what_a_step_produces_and_the_rest_is_unchanged():
    meta = splice(parse_meta(SMALL_META), installed_commands())
    again = parse_meta(meta.text())
    assert again.text() == meta.text()
    assert _missing_inputs(again, given=set()) == []
    new = [(m.name, s.name) for m in again.modules for s in m.steps if "phrasescore" in s.name]
    assert new == [
        ("TRAINING", "phrasescore-column-model"),
        ("TRAINING", "phrasescore-sentence-models"),
        ("TRAINING", "phrasescore-config"),
        ("TUNING", "phrasescore-filter"),
        ("TUNING", "phrasescore-weights"),
        ("EVALUATION", "phrasescore-filter"),
        ("EVALUATION", "phrasescore-rerank"),
    ]
    # Moses' steps: the same lines but the four reads and ignore-ifs the splice changes
    original = parse_meta(SMALL_META)
    changed = {
        ("TRAINING", "binarize-config"): ("in", "phrasescore-config"),
        ("TUNING", "filter"): ("ignore-if", "TRAINING:binarize-all phrasescore"),
        ("EVALUATION", "filter"): ("ignore-if", "phrasescore"),
        ("EVALUATION", "remove-markup"): ("in", "phrasescore-output"),
    }
    for module in original.modules:
        for step in module.steps:
            spliced = again.module(module.name).step(step.name)
            if (module.name, step.name) in changed:
                key, value = changed[(module.name, step.name)]
                assert spliced.attributes()[key] == value
                assert {k: v for k, v in spliced.attributes().items() if k != key} == {
                    k: v for k, v in step.attributes().items() if k != key
                }
            else:
                assert spliced.lines == step.lines
    assert meta.text().startswith("# a comment line\n[CORPUS] multiple\n")
    assert "\t\t-Binarizer x\n" in meta.text()  # a continued line kept as it was


def test_every_new_step_is_off_without_the_setting():
    """Each step is ignored, or passed (its output is its first input's), unless the config sets
    phrasescore; the templates hold nothing experiment.perl would misread (no # comment, IN
    only after a space)."""
    meta = splice(parse_meta(SMALL_META), installed_commands())
    for module in meta.modules:
        for step in module.steps:
            if not step.name.startswith("phrasescore-"):
                continue
            attributes = step.attributes()
            assert "phrasescore" in (
                attributes.get("ignore-unless", "").split()
                + attributes.get("pass-unless", "").split()
            )
            template = attributes["template"]
            assert "#" not in template
            assert not re.search(r"[^ ]IN\d", template), template
            # define_template reads a name up to a space, slash or quote
            for name in re.findall(r"\$\??([a-z][^\s/\"']*)", template):
                assert re.fullmatch(r"[a-z][a-z\d-]*", name), (step.name, name)


def test_ems_meta_writes_the_file_and_refuses_its_input(tmp_path):
    source = tmp_path / "experiment.meta"
    source.write_text(SMALL_META, encoding="utf-8")
    out = tmp_path / "phrasescore.meta"
    proc = run_cli("ems-meta", "--meta", source, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "experiment.perl -meta" in proc.stdout
    lines = proc.stdout.splitlines()
    at = lines.index("  [EVALUATION]")
    assert lines[at + 1] == '  nbest = "$phrasescore-nbest distinct"'
    assert {"  phrasescore = yes", "  phrasescore-nbest = 100"} <= set(lines[:at])
    assert "phrasescore-rerank\n" in out.read_text(encoding="utf-8")

    proc = run_cli("ems-meta", "--meta", source, "-o", source)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"phrasescore: error: -o {source} is the Moses meta file ({source}): "
        "refusing to overwrite an input"
    ]
    assert source.read_text(encoding="utf-8") == SMALL_META


def _as_experiment_perl_writes(template: str, inputs: list[str], output: str, settings) -> str:
    """A template as experiment.perl writes it into a step's script: read_meta's IN, OUT and TMP
    escapes, then define_template's inputs, output and ``$name``/``$?name`` settings."""
    cmd = re.sub(r"^IN", "EMS_IN_EMS", template)
    cmd = re.sub(r" IN(\d*)", r" EMS_IN\1_EMS", cmd)
    cmd = cmd.replace(" OUT", " EMS_OUT_EMS").replace("TMP", "EMS_TMP_EMS")
    if "EMS_IN1_EMS" not in cmd and len(inputs) > 1:
        cmd = cmd.replace("EMS_IN_EMS", " ".join(inputs), 1)
    else:
        cmd = re.sub(r"EMS_IN(\d)_EMS", lambda m: inputs[int(m.group(1))], cmd)
        cmd = cmd.replace("EMS_IN_EMS", inputs[0])
    cmd = cmd.replace("EMS_OUT_EMS", output)
    braced = re.compile(r"^([\S\s]*)\$(\??)\{([a-z][^\s/\"']*)\}([\S\s]*)$", re.I)
    plain = re.compile(r"^([\S\s]*)\$(\??)([a-z][^\s/\"']*)([\S\s]*)$", re.I)
    while match := braced.match(cmd) or plain.match(cmd):
        pre, optional, name, post = match.groups()
        cmd = pre + (settings.get(name, "") if optional else settings[name]) + post
    return cmd


def _rerank_in_sh(tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """The test set's phrasescore-rerank as experiment.perl runs it (sh), with phrasescore's
    command an echo of its arguments."""
    evaluation, models = tmp_path / "evaluation", tmp_path / "models"
    evaluation.mkdir(exist_ok=True)
    models.mkdir(exist_ok=True)
    system_output = evaluation / "test.output.1"
    system_output.write_text("a\n", encoding="utf-8")
    inputs = [system_output, evaluation / "test.input.1", tmp_path / "weights", models]
    template = rerank_step(Commands("echo phrasescore", "false")).attributes()["template"]
    output = evaluation / "test.phrasescore-reranked.1"
    cmd = _as_experiment_perl_writes(
        template, list(map(str, inputs)), str(output), {"phrasescore-nbest": "10"}
    )
    proc = subprocess.run(["sh", "-c", cmd], cwd=tmp_path, capture_output=True, text=True)
    return proc, output


def test_rerank_reads_the_list_decode_wrote_beside_its_output(tmp_path):
    """decode writes SYSTEM-OUTPUT.best10 when [EVALUATION] sets nbest = "10 distinct"; the step
    scores that list and re-ranks it, decoding nothing."""
    evaluation = tmp_path / "evaluation"
    evaluation.mkdir()
    (evaluation / "test.output.1.best10").write_text("0 ||| a ||| F0= 1 ||| 1\n", encoding="utf-8")
    proc, output = _rerank_in_sh(tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    scored = f"{output}.scored.nbest"
    assert proc.stdout.splitlines() == [
        f"phrasescore nbest {evaluation}/test.output.1.best10 --source {evaluation}/test.input.1 "
        "-m L2R=l2r.safetensors -m R2L=r2l.safetensors -m LSTM=lstm.safetensors "
        f"--inverse-model Inv=inverse.safetensors --no-progress -o {scored}",
        f"phrasescore nbest {scored} --source {evaluation}/test.input.1 --weights "
        f"{tmp_path}/weights --one-best --no-progress -o {output}",
    ]
    assert "$decoder" not in rerank_step(installed_commands()).attributes()["template"]


def test_rerank_without_the_list_is_one_error_line_naming_the_setting(tmp_path):
    """A config without [EVALUATION] nbest: one line on stderr, where experiment.perl looks for
    "error" (it waits for the script's end, not its exit status), and nothing else run."""
    proc, output = _rerank_in_sh(tmp_path)
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"phrasescore-rerank: error: no n-best list {tmp_path}/evaluation/test.output.1.best10 "
        'from decode: add to the EMS config\'s [EVALUATION]: nbest = "10 distinct"'
    ]
    assert not output.exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("[TRAINING] single\n  stray words\n", "not a meta line: 'stray words'"),
        ("build-ttable\n\tin: corpus\n", "a step before the first [MODULE] line"),
        ("# nothing\n", "no [MODULE] line: not an EMS meta file"),
        (SMALL_META.replace("create-config\n", "other-step\n"), "no step create-config"),
    ],
)
def test_a_meta_it_cannot_splice_is_one_error_line(tmp_path, text, message):
    source = tmp_path / "experiment.meta"
    source.write_text(text, encoding="utf-8")
    proc = run_cli("ems-meta", "--meta", source, "-o", tmp_path / "out.meta")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("phrasescore: error: "), proc.stderr
    assert message in lines[0]
    assert not (tmp_path / "out.meta").exists()


def test_without_moses_it_says_where_to_find_the_meta(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MOSES_HOME"}
    proc = run_cli("ems-meta", "-o", tmp_path / "out.meta", env=env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("phrasescore: error: no Moses: give --moses-home DIR")


# ----------------------------------------------------------------------------- with a Moses build
def _moses_folder(tmp_path: Path) -> Path:
    """MOSES_HOME's programs and scripts, and a symal (symmetrize-fast-align.perl calls
    bin/symal, which not every build has: a stand-in over fast_align's atools)."""
    moses = tmp_path / "moses"
    (moses / "bin").mkdir(parents=True)
    for program in Path(MOSES_HOME, "bin").iterdir():
        (moses / "bin" / program.name).symlink_to(program)
    if not (moses / "bin" / "symal").exists():
        (moses / "bin" / "symal").symlink_to(SYMAL)
    (moses / "scripts").symlink_to(Path(MOSES_HOME, "scripts"))
    return moses


EVALUATION_NBEST = 'nbest = "$phrasescore-nbest distinct"\n'


def _config(tmp_path: Path, moses: Path, phrasescore: bool = True, nbest: bool = True) -> Path:
    """examples/ems/config with its three paths set, tiny models, 2 MERT iterations and 10-best
    lists to re-rank; without phrasescore's lines, or without the [EVALUATION] nbest line that
    has decode write the lists."""
    text = (EXAMPLE / "config").read_text(encoding="utf-8")
    paths = {
        "working-dir": tmp_path / "work",
        "moses-src-dir": moses,
        "example-data": EXAMPLE / "data",
    }
    for name, path in paths.items():
        text, count = re.subn(rf"(?m)^{name} = .*$", f"{name} = {path}", text)
        assert count == 1, name
    text = text.replace(
        "# phrasescore-train-settings = ", f'phrasescore-train-settings = "{TRAIN_SETTINGS}"\n#'
    )
    text = text.replace("-maximum-iterations 5", "-maximum-iterations 2")
    text = text.replace("phrasescore-nbest = 100", "phrasescore-nbest = 10")
    assert text.count(EVALUATION_NBEST) == 1
    if not phrasescore or not nbest:
        text = text.replace(EVALUATION_NBEST, "")
    if not phrasescore:
        text = "".join(
            line for line in text.splitlines(keepends=True) if not line.startswith("phrasescore")
        )
    (tmp_path / "work").mkdir(exist_ok=True)
    name = "config" + ("" if phrasescore else ".baseline") + ("" if nbest else ".no-nbest")
    config = tmp_path / name
    config.write_text(text, encoding="utf-8")
    return config


def _experiment(moses: Path, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["perl", str(moses / "scripts" / "ems" / "experiment.perl"), "-no-graph", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def _plan(proc: subprocess.CompletedProcess) -> list[str]:
    """The steps of experiment.perl's STEP SUMMARY, without their numbers."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = proc.stdout.split("STEP SUMMARY:", 1)[1].split("DEFINE STEPS", 1)[0]
    return [line.split(" ", 1)[1] for line in summary.strip().splitlines()]


@needs_moses
def test_the_moses_meta_spliced_plans_the_baseline_without_the_setting(tmp_path):
    moses = _moses_folder(tmp_path)
    meta = tmp_path / "phrasescore.meta"
    proc = run_cli("ems-meta", "--moses-home", moses, "-o", meta)
    assert proc.returncode == 0, proc.stderr
    spliced = parse_meta(meta.read_text(encoding="utf-8"))
    assert _missing_inputs(spliced, given=set()) == []

    baseline = _config(tmp_path, moses, phrasescore=False)
    own = _plan(_experiment(moses, "-config", baseline, cwd=tmp_path))
    assert _plan(_experiment(moses, "-meta", meta, "-config", baseline, cwd=tmp_path)) == own
    assert not any("phrasescore" in step for step in own)

    on = _plan(_experiment(moses, "-meta", meta, "-config", _config(tmp_path, moses), cwd=tmp_path))
    for step in (
        "TRAINING:phrasescore-column-model",
        "TRAINING:phrasescore-sentence-models",
        "TRAINING:phrasescore-config",
        "TUNING:phrasescore-filter",
        "TUNING:phrasescore-weights",
        "EVALUATION:test:phrasescore-rerank",
    ):
        assert f"{step} ->\trun" in on
    assert "EVALUATION:test-no-rerank:phrasescore-rerank ->\trun" not in on  # passed


def _scores(path: Path) -> list[bytes]:
    """Each line of a phrase table without its scores after the fourth."""
    lines = []
    with gzip.open(path, "rb") as table:
        for line in table:
            fields = line.rstrip(b"\n").split(b" ||| ")
            fields[2] = b" ".join(fields[2].split()[:4])
            lines.append(b" ||| ".join(fields))
    return lines


@needs_moses
def test_the_example_config_runs_end_to_end_in_ems(tmp_path):
    moses = _moses_folder(tmp_path)
    meta = tmp_path / "phrasescore.meta"
    assert run_cli("ems-meta", "--moses-home", moses, "-o", meta).returncode == 0
    config = _config(tmp_path, moses)
    proc = _experiment(moses, "-meta", meta, "-config", config, "-exec", cwd=tmp_path)
    work = tmp_path / "work"
    report_file = work / "evaluation" / "report.1"
    if not report_file.exists():  # the steps that did not finish or crashed, and their errors
        unfinished = [
            f"{script.name}: {Path(f'{script}.STDERR').read_text()[-1500:]}"
            for script in sorted((work / "steps" / "1").glob("*.1"))
            if Path(f"{script}.STDERR").exists()
            and (
                not Path(f"{script}.DONE").exists()
                or Path(f"{script}.STDERR.digest").read_text().strip()
            )
        ]
        pytest.fail(proc.stdout[-2000:] + proc.stderr[-2000:] + "\n".join(unfinished))
    report = report_file.read_text(encoding="utf-8")
    bleu = dict(re.findall(r"(?m)^(test|test-no-rerank): ([\d.]+) \S* ?BLEU", report))
    assert set(bleu) == {"test", "test-no-rerank"}, report

    tuned = (work / "tuning" / "moses.ini.1").read_text(encoding="utf-8")
    table_line = re.search(r"(?m)^PhraseDictionaryMemory name=TranslationModel0 .*$", tuned)
    assert "num-features=5" in table_line.group(0)
    weights = re.search(r"(?m)^TranslationModel0= (.*)$", tuned).group(1).split()
    assert len(weights) == 5 and float(weights[4]) != 0

    # the rescored table: the original's lines, their first four scores untouched, and one more
    original = work / "model" / "phrase-table.1.gz"
    rescored = work / "model" / "moses.phrasescore.ini.1.table.gz"
    assert _scores(rescored) == _scores(original)
    with gzip.open(rescored, "rt", encoding="utf-8") as table:
        assert all(len(line.split(" ||| ")[2].split()) == 5 for line in table)

    reranked = (work / "evaluation" / "test.phrasescore-reranked.1").read_text(encoding="utf-8")
    assert len(reranked.splitlines()) == 200

    # each set decoded once, by decode, which wrote the 10-best list the rerank step read
    steps = work / "steps" / "1"
    decoding = sorted(
        script.name
        for script in steps.glob("EVALUATION_*.1")
        if re.search(r"bin/moses\s", script.read_text(encoding="utf-8"))
    )
    assert decoding == ["EVALUATION_test-no-rerank_decode.1", "EVALUATION_test_decode.1"]
    nbest_list = work / "evaluation" / "test.output.1.best10"
    assert str(nbest_list) in (steps / "EVALUATION_test_phrasescore-rerank.1").read_text()
    with nbest_list.open(encoding="utf-8") as lines:
        ids = [int(line.split(" ||| ", 1)[0]) for line in lines]
    assert sorted(set(ids)) == list(range(200)) and max(map(ids.count, set(ids))) <= 10

    # without [EVALUATION] nbest: decode runs again without lists, the rerank step crashes
    # with one line naming the setting
    no_nbest = _config(tmp_path, moses, nbest=False)
    proc = _experiment(moses, "-meta", meta, "-config", no_nbest, "-exec", cwd=tmp_path)
    assert "step EVALUATION:test:phrasescore-rerank crashed" in proc.stdout, proc.stdout[-3000:]
    assert not (work / "evaluation" / "test.output.2.best10").exists()
    stderr = work / "steps" / "2" / "EVALUATION_test_phrasescore-rerank.2.STDERR"
    assert stderr.read_text(encoding="utf-8").splitlines() == [
        f"phrasescore-rerank: error: no n-best list {work}/evaluation/test.output.2.best10 "
        'from decode: add to the EMS config\'s [EVALUATION]: nbest = "10 distinct"'
    ]
