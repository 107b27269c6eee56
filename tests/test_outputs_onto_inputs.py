"""No command destroys its own input.

* An output (``-o``, ``--ini-out``, ``--map``, ``--scatter``, the files a training or rescore
  writes beside ``-o``) naming an input is refused in one line before any work, whether it names
  the input by the same path, through a symlink, a symlinked directory or a hard link
  (:func:`phrasescore.files.refuse_outputs_onto_inputs`): one case per command and input.
* A named pipe or a device as ``-o`` is written as a stream (it stays what it was, its reader
  gets the bytes a file would have held), or refused where the output must be a file (a model).
* ``rescore --resume`` reads the lines done again and refuses another table (on standard input,
  or a file rewritten with its size and time kept) by their CRC-32.
* A second training onto a model being trained is refused, naming the process that holds it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from phrasescore.cli import cli
from phrasescore.errors import InputError
from phrasescore.files.locks import output_lock
from phrasescore.moses.nbest import read_weights

from .conftest import DATA, run_cli, train_tiny, write_lines

MOSES = DATA / "moses"
NBEST = DATA / "nbest"


# ---------------------------------------------------------------------------- the inputs
@pytest.fixture(scope="module")
def tiny_lm_path(tmp_path_factory, corpus_files) -> str:
    """A tiny CSLM (train-lm --preset tiny) on the sample's French side."""
    from phrasescore.jobs.training.train_lm import run_lm_training

    path = tmp_path_factory.mktemp("lm") / "lm.safetensors"
    run_lm_training(
        str(path), corpus_files[1], preset="tiny", device="cpu", overrides={"max_steps": 5}
    )
    return str(path)


@pytest.fixture(scope="module")
def attention_model_path(tmp_path_factory, corpus_files) -> str:
    path = tmp_path_factory.mktemp("attention") / "attention.safetensors"
    train_tiny(path, *corpus_files, arch="attention", max_steps=5, valid_every=5, seed=2)
    return str(path)


@pytest.fixture
def workspace(tmp_path, monkeypatch, corpus_files, tiny_model_path, tiny_lm_path):
    """A folder of real inputs, the current directory while a case runs: the sample corpus and
    a validation slice, the multi30k table beside its moses.ini, an n-best list with its
    source, reference and weights, a tiny model and CSLM, MERT's files, a phrase list."""
    src, tgt = corpus_files
    shutil.copy(src, tmp_path / "train.en")
    shutil.copy(tgt, tmp_path / "train.fr")
    for side in ("en", "fr"):
        lines = (tmp_path / f"train.{side}").read_text(encoding="utf-8").splitlines()[:20]
        write_lines(tmp_path / f"valid.{side}", lines)
    shutil.copy(MOSES / "multi30k.head300.phrase-table.gz", tmp_path / "phrase-table.gz")
    shutil.copy(MOSES / "multi30k.moses.ini", tmp_path / "moses.ini")
    shutil.copy(NBEST / "multi30k.test2016.ids0-4.100best.nbest.gz", tmp_path / "list.nbest.gz")
    shutil.copy(NBEST / "multi30k.test2016.head5.tok.lc.en", tmp_path / "source.en")
    shutil.copy(NBEST / "multi30k.test2016.head5.tok.lc.fr", tmp_path / "reference.fr")
    for name in ("features.dat", "weights.txt"):
        shutil.copy(NBEST / "mert" / name, tmp_path / name)
    lines = [
        f"{name}= " + " ".join(map(str, values))
        for name, values in read_weights(str(MOSES / "multi30k.moses.ini")).items()
    ]
    write_lines(tmp_path / "rerank.weights", [*lines, "RNNEncDec0= 0.5"])
    write_lines(tmp_path / "phrases.tsv", ["a man", "two dogs", "a woman in a red dress"])
    shutil.copy(tiny_model_path, tmp_path / "model.st")
    shutil.copy(tiny_lm_path, tmp_path / "lm.st")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry of ``folder`` (links as links) and the SHA-256 of every file's bytes."""
    files = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            files[name] = "-> " + os.readlink(path)
        elif path.is_file():
            files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            files[name] = "directory"
    return files


def invoke(*args):
    return CliRunner().invoke(cli, ["-q", *map(str, args)])


# ---------------------------------------------------------------------------- outputs naming inputs
TRAIN = ("train", "train.en", "train.fr", "--preset", "tiny", "--max-steps", "2", "--no-progress")
TRAIN_LM = ("train-lm", "train.fr", "--preset", "tiny", "--max-steps", "2", "--no-progress")
RESCORE = ("rescore", "phrase-table.gz", "-m", "model.st", "--no-progress")
RERANK_TUNE = ("rerank-tune", "list.nbest.gz", "--reference", "reference.fr")
NBEST_CMD = ("nbest", "list.nbest.gz", "--source", "source.en", "-m", "model.st", "--no-progress")
TRANSLATE = ("translate", "source.en", "-m", "model.st", "--no-progress")
REPRESENT = ("represent", "phrases.tsv", "-m", "model.st")
COMPARE = ("compare", "phrase-table.gz", "-m", "model.st", "--sample", "2", "--min-targets", "1")

# (id, arguments, the input that the output names: as the message says it)
CASES = [
    ("train -o SOURCE", [*TRAIN, "-o", "train.en"], "-o train.en is the source corpus"),
    ("train -o TARGET", [*TRAIN, "-o", "train.fr"], "-o train.fr is the target corpus"),
    (
        "train -o VALID-SRC",
        [*TRAIN, "--valid", "valid.en", "valid.fr", "-o", "valid.en"],
        "-o valid.en is the validation source",
    ),
    (
        "train -o VALID-TGT",
        [*TRAIN, "--valid", "valid.en", "valid.fr", "-o", "valid.fr"],
        "-o valid.fr is the validation target",
    ),
    (
        "train -o's log onto VALID-TGT",
        [*TRAIN, "--valid", "valid.en", "valid.fr", "-o", "valid"],
        None,  # set up below: valid.log is the validation target
    ),
    (
        "train -o --phrase-table",
        [*TRAIN[:1], "--phrase-table", "phrase-table.gz", *TRAIN[3:], "-o", "phrase-table.gz"],
        "-o phrase-table.gz is the --phrase-table",
    ),
    ("train-lm -o CORPUS", [*TRAIN_LM, "-o", "train.fr"], "-o train.fr is the corpus"),
    (
        "train-lm -o --valid",
        [*TRAIN_LM, "--valid", "valid.fr", "-o", "valid.fr"],
        "-o valid.fr is the --valid",
    ),
    ("rescore -o TABLE", [*RESCORE, "-o", "phrase-table.gz"], "is the input table"),
    ("rescore -o -m", [*RESCORE, "-o", "model.st"], "-o model.st is the model (model.st)"),
    (
        "rescore -o --inverse-model",
        [*RESCORE, "--inverse-model", "inverse.st", "-o", "inverse.st"],
        "-o inverse.st is the --inverse-model",
    ),
    ("rescore -o --lm", [*RESCORE, "--lm", "lm.st", "-o", "lm.st"], "-o lm.st is the --lm"),
    (
        "rescore --ini-out --moses-ini",
        [*RESCORE, "-o", "new.gz", "--moses-ini", "moses.ini", "--ini-out", "moses.ini"],
        "--ini-out moses.ini is the --moses-ini",
    ),
    (
        "rescore -o --moses-ini",
        [*RESCORE, "--moses-ini", "moses.ini", "-o", "moses.ini"],
        "-o moses.ini is the --moses-ini",
    ),
    (
        "rescore --ini-out TABLE",
        [*RESCORE, "-o", "new.gz", "--moses-ini", "moses.ini", "--ini-out", "phrase-table.gz"],
        "--ini-out phrase-table.gz is the input table",
    ),
    ("nbest -o LIST", [*NBEST_CMD, "-o", "list.nbest.gz"], "-o list.nbest.gz is the n-best list"),
    ("nbest -o --source", [*NBEST_CMD, "-o", "source.en"], "-o source.en is the --source"),
    ("nbest -o -m", [*NBEST_CMD, "-o", "model.st"], "-o model.st is the model"),
    (
        "nbest -o --weights",
        [*NBEST_CMD, "--weights", "rerank.weights", "-o", "rerank.weights"],
        "-o rerank.weights is the --weights",
    ),
    ("nbest -o --lm", [*NBEST_CMD, "--lm", "lm.st", "-o", "lm.st"], "-o lm.st is the --lm"),
    ("translate -o INPUT", [*TRANSLATE, "-o", "source.en"], "-o source.en is the input"),
    ("translate -o -m", [*TRANSLATE, "-o", "model.st"], "-o model.st is the model"),
    (
        "translate -o --reference",
        [*TRANSLATE, "--reference", "reference.fr", "-o", "reference.fr"],
        "-o reference.fr is the --reference",
    ),
    (
        "copy-table -o TABLE",
        ["copy-table", "phrase-table.gz", "-o", "phrase-table.gz"],
        "-o phrase-table.gz is the input table",
    ),
    (
        "represent -o PHRASES",
        [*REPRESENT, "-o", "phrases"],
        "-o's .tsv phrases.tsv is the phrase file",
    ),
    (
        "represent --map -m",
        [*REPRESENT, "-o", "vectors", "--map", "model.st"],
        "--map model.st is the model",
    ),
    (
        "compare --scatter TABLE",
        [*COMPARE, "--scatter", "phrase-table.gz"],
        "--scatter phrase-table.gz is the phrase table",
    ),
    (
        "compare --scatter --sources",
        [*COMPARE, "--sources", "phrases.tsv", "--scatter", "phrases.tsv"],
        "--scatter phrases.tsv is the --sources",
    ),
    (
        "align -o SOURCE",
        ["align", "train.en", "train.fr", "-m", "attention.st", "-o", "train.en"],
        "-o train.en is the source",
    ),
    (
        "align -o -m",
        ["align", "train.en", "train.fr", "-m", "attention.st", "-o", "attention.st"],
        "-o attention.st is the model",
    ),
    (
        "rerank-weights -o FEATURES_DAT",
        ["rerank-weights", "features.dat", "--tuned", "weights.txt", "-o", "features.dat"],
        "-o features.dat is the FEATURES_DAT",
    ),
    (
        "rerank-weights -o --start",
        ["rerank-weights", "features.dat", "--start", "moses.ini", "-o", "moses.ini"],
        "-o moses.ini is the --start",
    ),
    (
        "rerank-weights -o --tuned",
        ["rerank-weights", "features.dat", "--tuned", "weights.txt", "-o", "weights.txt"],
        "-o weights.txt is the --tuned",
    ),
    (
        "rerank-tune -o LIST",
        [*RERANK_TUNE, "-o", "list.nbest.gz"],
        "-o list.nbest.gz is the n-best list",
    ),
    (
        "rerank-tune -o --reference",
        [*RERANK_TUNE, "-o", "reference.fr"],
        "-o reference.fr is the --reference",
    ),
    (
        "rerank-tune -o --start",
        [*RERANK_TUNE, "--start", "moses.ini", "-o", "moses.ini"],
        "-o moses.ini is the --start",
    ),
    ("merge-shards -o PART", ["merge-shards", "p1.gz", "p2.gz", "-o", "p1.gz"], "is the part"),
    (
        "ems-meta -o --meta",
        ["ems-meta", "--meta", "experiment.meta", "-o", "experiment.meta"],
        "-o experiment.meta is the Moses meta file (experiment.meta)",
    ),
    (
        "merge-shards --ini-out --moses-ini",
        [
            "merge-shards",
            "p1.gz",
            "p2.gz",
            "-o",
            "new.gz",
            "--moses-ini",
            "moses.ini",
            "--ini-out",
            "moses.ini",
        ],
        "--ini-out moses.ini is the --moses-ini",
    ),
    # the files a command writes, renames or deletes beside -o
    (
        "train -o's best onto SOURCE",
        [TRAIN[0], "oo.best", *TRAIN[2:], "-o", "oo"],
        "-o's best model oo.best is the source corpus (oo.best)",
    ),
    (
        "train -o's lock onto TARGET",
        [*TRAIN[:2], ".oo.lock", *TRAIN[3:], "-o", "oo"],
        "/.oo.lock is the target corpus (.oo.lock)",
    ),
    (
        "train-lm -o's best onto CORPUS",
        [TRAIN_LM[0], "lm.best", *TRAIN_LM[2:], "-o", "lm"],
        "-o's best model lm.best is the corpus (lm.best)",
    ),
    (
        "rescore -o's lock onto TABLE",
        ["rescore", ".new.gz.lock", *RESCORE[2:], "-o", "new.gz"],
        "/.new.gz.lock is the input table (.new.gz.lock)",
    ),
    (
        "nbest -o's lock onto LIST",
        [NBEST_CMD[0], ".out.lock", *NBEST_CMD[2:], "-o", "out"],
        "/.out.lock is the n-best list (.out.lock)",
    ),
    (
        "rerank-tune -o's lock onto --reference",
        [RERANK_TUNE[0], RERANK_TUNE[1], "--reference", ".w.lock", "-o", "w"],
        "/.w.lock is the --reference (.w.lock)",
    ),
    (
        "merge-shards -o's lock onto --moses-ini",
        ["merge-shards", "p1.gz", "p2.gz", "--moses-ini", ".new.gz.lock", "-o", "new.gz"],
        "/.new.gz.lock is the --moses-ini (.new.gz.lock)",
    ),
    (
        "merge-shards -o onto the table the parts were scored from",
        ["merge-shards", "p1.gz", "p2.gz", "-o", "phrase-table.gz"],
        "-o phrase-table.gz is the input the parts were scored from",
    ),
    (
        "rescore -o's temporary onto TABLE",
        ["rescore", ".new.gz.abcd1234.tmp", *RESCORE[2:], "-o", "new.gz"],
        "the input table .new.gz.abcd1234.tmp is named as a temporary file of -o new.gz",
    ),
    # the same file by another name
    (
        "rescore -o TABLE through a symlink",
        ["rescore", "table-link.gz", "-m", "model.st", "--no-progress", "-o", "phrase-table.gz"],
        "-o phrase-table.gz is the input table (table-link.gz)",
    ),
    (
        "train -o SOURCE through a symlinked directory",
        [*TRAIN, "-o", "linked-dir/train.en"],
        "-o linked-dir/train.en is the source corpus (train.en)",
    ),
    (
        "translate -o a hard link of INPUT",
        [*TRANSLATE, "-o", "hard-link.en"],
        "-o hard-link.en is the input (source.en)",
    ),
]


BESIDE = {  # case: (an input named like a file written beside -o, a copy of)
    "train -o's best onto SOURCE": ("oo.best", "train.en"),
    "train -o's lock onto TARGET": (".oo.lock", "train.fr"),
    "train-lm -o's best onto CORPUS": ("lm.best", "train.fr"),
    "rescore -o's lock onto TABLE": (".new.gz.lock", "phrase-table.gz"),
    "nbest -o's lock onto LIST": (".out.lock", "list.nbest.gz"),
    "rerank-tune -o's lock onto --reference": (".w.lock", "reference.fr"),
    "merge-shards -o's lock onto --moses-ini": (".new.gz.lock", "moses.ini"),
    "rescore -o's temporary onto TABLE": (".new.gz.abcd1234.tmp", "phrase-table.gz"),
}


def _prepare(case_id: str, folder: Path, request) -> None:
    """What some cases need beyond the workspace."""
    if "--inverse-model" in case_id:
        shutil.copy(request.getfixturevalue("tiny_inverse_model_path"), folder / "inverse.st")
    if case_id.startswith("align"):
        shutil.copy(request.getfixturevalue("attention_model_path"), folder / "attention.st")
    if case_id.startswith("merge-shards"):
        for k in (1, 2):  # the two parts of rescore --shard
            result = invoke(*RESCORE, "--shard", f"{k}/2", "--chunk-lines", "100", "-o", f"p{k}.gz")
            assert result.exit_code == 0, result.output
    if case_id.startswith("ems-meta"):
        write_lines(folder / "experiment.meta", ["[TRAINING] single", "consolidate"])
    if "log onto" in case_id:
        os.replace(folder / "valid.fr", folder / "valid.log")
    if case_id in BESIDE:  # an input under the name of a file written beside -o
        name, copy_of = BESIDE[case_id]
        shutil.copy(folder / copy_of, folder / name)
    if "symlink" in case_id:
        os.symlink("phrase-table.gz", folder / "table-link.gz")
    if "symlinked directory" in case_id:
        os.symlink(".", folder / "linked-dir")
    if "hard link" in case_id:
        os.link(folder / "source.en", folder / "hard-link.en")


@pytest.mark.parametrize("args, message", [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_an_output_onto_an_input_is_refused_and_the_input_kept(args, message, workspace, request):
    case_id = request.node.callspec.id
    _prepare(case_id, workspace, request)
    if "log onto" in case_id:
        args = [a if a != "valid.fr" else "valid.log" for a in args]
        message = "-o's log valid.log is the validation target (valid.log)"
    before = snapshot(workspace)
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("phrasescore: error: ")
    assert lines[0].endswith((": refusing to overwrite an input", ": rename it"))
    assert message in lines[0]
    assert snapshot(workspace) == before  # every input's bytes, and nothing written beside


def test_every_command_that_writes_has_a_case():
    """Each command with an output option is in CASES (sample, evaluate, info, check-table and
    ini-tables write standard output only; ab and recipe write in a work folder, which
    check_work_folder refuses where it holds an input: tests/test_recipe.py and
    tests/test_rerank_inputs.py)."""
    writers = {
        "train",
        "train-lm",
        "rescore",
        "nbest",
        "translate",
        "copy-table",
        "represent",
        "compare",
        "align",
        "rerank-weights",
        "rerank-tune",
        "merge-shards",
        "ems-meta",
    }
    assert {case[1][0] for case in CASES} == writers
    readers_only = {"sample", "evaluate", "info", "check-table", "ini-tables"}
    readers_only.add("check-outputs")  # hidden: the bin/ scripts' check, it writes nothing
    work_folders = {"ab", "recipe"}
    assert set(cli.commands) == writers | readers_only | work_folders


# --------------------------------------------------------------------- pipes and devices as outputs
class FifoReader(threading.Thread):
    """Read a named pipe to its end in a thread. The read end is opened here (non-blocking,
    so no writer is needed yet), then each read waits for the writer with select(): a run that
    never opens the pipe is released by :meth:`release`, without any timeout."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.data = b""

    def run(self) -> None:
        while True:
            select.select([self.fd], [], [])
            try:
                block = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not block:
                break
            self.data += block

    def release(self) -> None:
        """Open and close the pipe's write end (through this reader's descriptor, whatever its
        name now points at): a reader still waiting sees its end. The descriptor is closed
        here, after the thread ends, never by the thread: it stays this pipe's until then
        (the thread closing it between a check and this open raced)."""
        os.close(os.open(f"/proc/self/fd/{self.fd}", os.O_WRONLY | os.O_NONBLOCK))
        self.join()
        os.close(self.fd)


STREAMS = {
    "rescore": [*RESCORE],
    "nbest": [*NBEST_CMD],
    "translate": [*TRANSLATE],
    "copy-table": ["copy-table", "phrase-table.gz"],
    "merge-shards": ["merge-shards", "p1.gz", "p2.gz"],
}


@pytest.mark.parametrize("command", list(STREAMS))
def test_a_named_pipe_is_written_as_a_stream(command, workspace, request):
    _prepare(command, workspace, request)
    args = STREAMS[command]
    assert invoke(*args, "-o", "file.out").exit_code == 0
    fifo = workspace / "pipe.out"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    reader.start()
    proc = run_cli(*args, "-o", fifo, cwd=workspace)
    reader.release()
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the pipe, not a file in its place
    assert reader.data == (workspace / "file.out").read_bytes()
    assert not [name for name in os.listdir(workspace) if name.startswith(".pipe.out")]


def test_ini_out_onto_a_named_pipe_is_written_as_a_stream(workspace):
    """``rescore --ini-out FIFO`` writes the moses.ini through the pipe (its reader gets the
    file's bytes) and leaves it a pipe, not a file in its place."""
    args = [*RESCORE, "-o", "new.gz", "--moses-ini", "moses.ini", "--ini-out"]
    assert invoke(*args, "file.ini").exit_code == 0
    fifo = workspace / "pipe.ini"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    reader.start()
    result = invoke(*args, fifo)
    reader.release()
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the pipe
    assert reader.data == (workspace / "file.ini").read_bytes()
    assert not [name for name in os.listdir(workspace) if name.startswith(".pipe.ini")]


@pytest.mark.parametrize("command", list(STREAMS))
def test_dev_null_stays_a_device(command, workspace, request):
    _prepare(command, workspace, request)
    proc = run_cli(*STREAMS[command], "-o", "/dev/null", cwd=workspace)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_dev_stdout_is_written_as_a_stream(workspace):
    assert invoke("copy-table", "phrase-table.gz", "-o", "file.out").exit_code == 0
    proc = subprocess.run(
        [sys.executable, "-m", "phrasescore", "copy-table", "phrase-table.gz", "-o", "/dev/stdout"],
        capture_output=True,
        cwd=workspace,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (workspace / "file.out").read_bytes()


@pytest.mark.parametrize("command", ["train", "train-lm"])
def test_a_model_onto_a_pipe_or_device_is_refused(command, workspace):
    fifo = workspace / "model.pipe"
    os.mkfifo(fifo)
    args = TRAIN if command == "train" else TRAIN_LM
    for target in (fifo, "/dev/null"):
        proc = run_cli(*args, "-o", target, cwd=workspace)
        assert proc.returncode == 1
        what = "model" if command == "train" else "LM"
        assert proc.stderr == (
            f"phrasescore: error: {target}: is a named pipe or a device, not a file: the {what} "
            "must be a regular file\n"
        )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


# ------------------------------------------------------------ a second training onto the same model
@pytest.mark.parametrize("command", ["train", "train-lm"])
def test_a_second_training_onto_the_same_model_is_refused(command, workspace):
    args = TRAIN if command == "train" else TRAIN_LM
    with output_lock(str(workspace / "model.new")):  # this process: the first run
        before = snapshot(workspace)
        proc = run_cli(*args, "-o", "model.new", cwd=workspace)
        assert snapshot(workspace) == before
    assert proc.returncode == 1
    assert proc.stderr == (
        f"phrasescore: error: model.new: another run is writing this output (process "
        f"{os.getpid()} holds its lock .model.new.lock): wait for it to end, or stop it\n"
    )


def _rescore(table: Path, model: str, out: Path, resume: bool = False):
    from phrasescore.jobs.rescore.rescore import RescoreOptions, rescore_table

    options = RescoreOptions(chunk_lines=40)
    return rescore_table(str(table), [model], str(out), options, resume=resume, progress=False)


def _table_bytes() -> bytes:
    return gzip.decompress((MOSES / "multi30k.head300.phrase-table.gz").read_bytes())


def _interrupted_rescore(monkeypatch, model: str, table, out: Path, stdin: bytes = b"") -> None:
    """A rescore of ``table`` (``-``: ``stdin`` on standard input) stopped (KeyboardInterrupt)
    after 2 chunks of 40 lines, as tests/test_resume.py stops one."""
    from phrasescore.jobs.rescore.columns import NewColumns

    if table == "-":
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))

    original, calls = NewColumns.format_chunk, []

    def interrupted(self, chunk, *args):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return original(self, chunk, *args)

    monkeypatch.setattr(NewColumns, "format_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _rescore(table, model, out)
    monkeypatch.undo()


def test_resume_refuses_another_table_of_the_same_name_size_and_time(
    workspace, monkeypatch, tiny_model_path
):
    """The resume key's path, size and mtime cannot tell a table rewritten with its time kept
    (``cp -p``, ``rsync -t``): the CRC-32 of the lines read again does."""
    table, out = workspace / "table", workspace / "out"
    table.write_bytes(_table_bytes())
    _interrupted_rescore(monkeypatch, tiny_model_path, table, out)
    lines = table.read_bytes().splitlines(keepends=True)
    times = os.stat(table)
    lines[0], lines[1] = lines[1], lines[0]  # another table: same bytes, same size
    table.write_bytes(b"".join(lines))
    os.utime(table, ns=(times.st_atime_ns, times.st_mtime_ns))
    before = snapshot(workspace)
    with pytest.raises(InputError) as refused:
        _rescore(table, tiny_model_path, out, resume=True)
    assert str(refused.value) == (
        f"{out}: cannot resume: the first 80 lines of the input are not those the partial "
        "output was made from (their CRC-32 differs); run without --resume to start again"
    )
    assert snapshot(workspace) == before
    # the same lines again: the resume goes on, to the bytes of an uninterrupted run
    lines[0], lines[1] = lines[1], lines[0]
    table.write_bytes(b"".join(lines))
    os.utime(table, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert _rescore(table, tiny_model_path, out, resume=True).resumed_from_line == 80
    _rescore(table, tiny_model_path, workspace / "whole")
    assert out.read_bytes() == (workspace / "whole").read_bytes()


def test_rescore_resume_from_standard_input_checks_the_lines_it_reads_again(
    workspace, monkeypatch, tiny_model_path
):
    """``rescore - --resume`` with another table on standard input: one line, nothing published
    (no table mixed of both), the partial output kept. The same table again resumes to the
    bytes of an uninterrupted run."""
    table = _table_bytes()
    _interrupted_rescore(monkeypatch, tiny_model_path, "-", workspace / "out", stdin=table)
    other = table.splitlines(keepends=True)
    other[0], other[1] = other[1], other[0]
    args = ["rescore", "-", "-m", "model.st", "--chunk-lines", "40", "--dtype", "float32"]
    args += ["--no-progress", "-o"]
    before = snapshot(workspace)
    proc = subprocess.run(
        [sys.executable, "-m", "phrasescore", *args, "out", "--resume"],
        input=b"".join(other),
        capture_output=True,
        cwd=workspace,
    )
    assert proc.returncode == 1
    assert proc.stderr.decode().splitlines()[-1] == (
        "phrasescore: error: out: cannot resume: the first 80 lines of the input are not those "
        "the partial output was made from (their CRC-32 differs); run without --resume to "
        "start again"
    )
    assert snapshot(workspace) == before
    # a state of an earlier version records no CRC-32 of its input: standard input is refused
    state_path = workspace / ".out.partial.json"
    state = json.loads(state_path.read_text())
    state_path.write_text(json.dumps({k: v for k, v in state.items() if k != "input_crc32"}))
    proc = subprocess.run(
        [sys.executable, "-m", "phrasescore", *args, "out", "--resume"],
        input=table,
        capture_output=True,
        cwd=workspace,
    )
    assert proc.returncode == 1
    assert proc.stderr.decode().splitlines()[-1] == (
        "phrasescore: error: out: cannot resume from standard input: the partial output's state "
        "(of an earlier version) records no CRC-32 of its input lines to check them against; "
        "give the table as a file, or run without --resume to start again"
    )
    state_path.write_text(json.dumps(state))
    for out, resume in (("out", ["--resume"]), ("whole", [])):
        proc = subprocess.run(
            [sys.executable, "-m", "phrasescore", *args, out, *resume],
            input=table,
            capture_output=True,
            cwd=workspace,
        )
        assert proc.returncode == 0, proc.stderr
        assert ("resuming after line 80" in proc.stderr.decode()) == bool(resume)
    assert (workspace / "out").read_bytes() == (workspace / "whole").read_bytes()
