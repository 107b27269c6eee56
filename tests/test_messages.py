"""Errors that name their file: a manifest without its fields, a
moses.ini that cannot be read or lacks the table."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from .conftest import DATA, run_cli

TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"


@pytest.fixture(scope="module")
def parts(tiny_model_path, tmp_path_factory) -> list:
    folder = tmp_path_factory.mktemp("parts")
    flags = ["-m", tiny_model_path, "--chunk-lines", "40", "--no-progress", "--threads", "1"]
    made = []
    for k in (1, 2):
        part = folder / f"part.{k}.gz"
        proc = run_cli("rescore", TABLE, *flags, "--shard", f"{k}/2", "-o", part)
        assert proc.returncode == 0, proc.stderr
        made.append(part)
    return made


def _copy(parts, folder) -> list:
    copies = []
    for part in parts:
        for path in (part, f"{part}.manifest.json"):
            shutil.copy(path, folder)
        copies.append(folder / os.path.basename(part))
    return copies


def _one_line(proc) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ---------------------------------------------------------------------------- shard manifests
@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda m: m.pop("part"), '"part" is missing'),
        (lambda m: m["part"].update(size="1234"), '"part.size" is not an integer >= 0'),
        (lambda m: m.update(shard=None), '"shard" is not an integer >= 0'),
        (lambda m: m["plan"].pop("chunk_lines"), '"plan.chunk_lines" is missing'),
        (lambda m: m.update(shard=3), '"shard" 3 is not between 1 and "of" 2'),
        (lambda m: m["part"]["chunks"].append({"chunk": 9}), '"part.chunks" holds an invalid'),
    ],
    ids=["no-part", "size-string", "shard-null", "no-chunk-lines", "shard-3-of-2", "bad-record"],
)
def test_merge_refuses_a_manifest_without_its_fields_in_one_line(parts, tmp_path, edit, problem):
    copies = _copy(parts, tmp_path)
    manifest_file = tmp_path / "part.2.gz.manifest.json"
    manifest = json.loads(manifest_file.read_text())
    edit(manifest)
    manifest_file.write_text(json.dumps(manifest))
    line = _one_line(run_cli("merge-shards", *copies, "-o", tmp_path / "all.gz"))
    assert line.startswith(f"phrasescore: error: {manifest_file}: invalid manifest: {problem}")
    assert not (tmp_path / "all.gz").exists()


# ---------------------------------------------------------------------------- moses.ini
MODERN = """[feature]
UnknownWordPenalty
PhraseDictionaryMemory name=TranslationModel0 num-features={n} path=phrase-table.gz input-factor=0 output-factor=0

[weight]
UnknownWordPenalty0= 1
TranslationModel0= 0.2 0.2 0.2 0.2
"""


def test_ini_tables_names_the_ini_and_line_of_a_bad_num_features(tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text(MODERN.format(n="abc"))
    line = _one_line(run_cli("ini-tables", ini))
    assert line == (
        f"phrasescore: error: {ini}:3: num-features is not an integer in 'PhraseDictionaryMemory "
        "name=TranslationModel0 num-features=abc path=phrase-table.gz input-factor=0 "
        "output-factor=0'"
    )


def test_ini_tables_names_the_ini_and_line_of_a_malformed_ttable_file_line(tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text("[ttable-file]\n0 0 5 phrase-table.gz\n0 0 0\n")
    line = _one_line(run_cli("ini-tables", ini))
    assert line == (
        f"phrasescore: error: {ini}:3: [ttable-file] line '0 0 0' has 3 fields; expected "
        "'implementation input-factors output-factors nscores path'"
    )


def test_merge_with_an_ini_that_lacks_the_table_names_the_ini(parts, tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text(MODERN.format(n=4).replace("path=phrase-table.gz", "path=other-table.gz"))
    proc = run_cli(
        "merge-shards", *parts, "-o", tmp_path / "all.gz", "--moses-ini", ini
    )  # the table the parts were made from is not in this ini
    line = _one_line(proc)
    assert line == (
        f"phrasescore: error: {ini}: phrase table {str(TABLE)!r} is not in the ini; phrase "
        "tables found: TranslationModel0 (path=other-table.gz)"
    )
    assert sorted(os.listdir(tmp_path)) == ["moses.ini"]


# ---------------------------------------------------------------------------- line endings
def _table_with_endings(tmp_path, bare_cr_at: int | None):
    """The 300-line table with CRLF endings on every 7th line and, on line ``bare_cr_at``, a
    lone CR where its newline was (two entries joined), gzip."""
    import gzip

    lines = gzip.decompress(TABLE.read_bytes()).splitlines(keepends=True)
    for i in range(0, len(lines), 7):
        lines[i] = lines[i][:-1] + b"\r\n"
    if bare_cr_at is not None:
        lines[bare_cr_at - 1] = lines[bare_cr_at - 1].rstrip(b"\r\n") + b"\r"
    table = tmp_path / "table.gz"
    table.write_bytes(gzip.compress(b"".join(lines)))
    return table


TABLE_READERS = {
    "rescore": lambda model: ["rescore", "-m", model, "--chunk-lines", "40", "--no-progress"],
    "rescore --io-workers": lambda model: [
        "rescore",
        "-m",
        model,
        "--io-workers",
        "1",
        "--no-progress",
    ],
    "check-table": lambda model: ["check-table"],  # copy-table reads the same way
}


@pytest.mark.parametrize("command", sorted(TABLE_READERS))
def test_a_lone_carriage_return_in_a_table_is_refused_naming_its_line(
    command, tmp_path, tiny_model_path
):
    """A lone CR ending line 151 is refused with one error naming the line: Moses would read
    lines 151 and 152 as one entry (the second pair without its column). CRLF endings stay
    accepted."""
    args = TABLE_READERS[command](tiny_model_path)
    out = ["-o", tmp_path / "out.gz"] if args[0] != "check-table" else []
    table = _table_with_endings(tmp_path, bare_cr_at=151)
    line = _one_line(run_cli("-q", *args[:1], table, *args[1:], *out))
    assert line == (
        f"phrasescore: error: {table}:151: a carriage return (\\r) inside the line: Moses would "
        "read it and the next line as one entry (CRLF endings are fine; turn lone CRs into "
        "newlines)"
    )
    assert not (tmp_path / "out.gz").exists()
    if command == "rescore":
        table = _table_with_endings(tmp_path, bare_cr_at=None)
        proc = run_cli(*args[:1], table, *args[1:], *out)
        assert proc.returncode == 0, proc.stderr
        assert "rescored 300 lines" in proc.stderr


# --------------------------------------------------------------------------- checkpoints and models
def test_a_checkpoint_given_as_a_model_and_a_model_as_a_checkpoint_are_one_line(
    tiny_model_path, corpus_files, tmp_path
):
    """Each is named for what it is in one line, without safetensors' "header too large" or
    PyTorch's pickle warning from reading a file that is not its own."""
    checkpoint = tiny_model_path + ".checkpoint"
    assert os.path.isfile(checkpoint)
    line = _one_line(run_cli("-q", "sample", "a man", "-m", checkpoint))
    assert line == (
        f"phrasescore: error: {checkpoint}: is a training checkpoint (MODEL.checkpoint), not a "
        "model file: give the model file itself"
    )
    shutil.copy(tiny_model_path, tmp_path / "m.st.checkpoint")  # a model where it should be
    args = ["train", *corpus_files, "--preset", "tiny", "--max-steps", "2", "--no-progress"]
    line = _one_line(run_cli("-q", *args, "-o", tmp_path / "m.st", "--resume"))
    assert line == (
        f"phrasescore: error: {tmp_path / 'm.st.checkpoint'}: not a readable training checkpoint "
        "(damaged, truncated or another kind of file); train without --resume to start again"
    )


# ---------------------------------------------------------------------------- train -q
def test_train_quiet_keeps_stderr_quiet_and_still_writes_the_log(corpus_files, tmp_path):
    """``train -q`` writes nothing on standard error and still writes its lines to MODEL.log: -q
    is about standard error."""
    model = tmp_path / "m.st"
    args = ["train", *corpus_files, "--preset", "tiny", "--max-steps", "2", "--no-progress"]
    proc = run_cli("-q", *args, "-o", model)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    log_text = (tmp_path / "m.st.log").read_text()
    assert "word vocabulary" in log_text and "stopped (" in log_text


# ---------------------------------------------------------------------------- sample
def test_sample_says_why_it_shows_fewer_targets_than_asked(tiny_model_path):
    """Draws cut off by the length limit before the model drew the end of the phrase are no
    targets: ``sample`` warns how many ended within the limit and what to do, rather than show
    fewer (or no) targets without a word."""
    import re

    proc = run_cli("sample", "a man", "-m", tiny_model_path, "-n", "5", "--max-length", "1")
    assert proc.returncode == 0, proc.stderr
    shown = len(proc.stdout.splitlines())
    assert shown < 5
    warning = re.search(
        r"phrasescore: 'a man': (\d) of 5 samples ended within the length limit \(1 tokens; the "
        rf"others were cut off there and are not targets\), {shown} distinct shown: draw more "
        r"\(-n\), raise --max-length, or add --beam",
        proc.stderr,
    )
    assert warning is not None, proc.stderr
    assert int(warning.group(1)) < 5


# ---------------------------------------------------------------------------- resume after pipes
def test_a_resume_with_files_after_a_run_on_pipes_names_the_pipe_not_the_file(caplog):
    """The warning names the pipe the checkpoint's run read (/dev/fd/63), not the regular file
    r.en given now."""
    from phrasescore.training.run_identity import identity_difference

    saved = {"files": {"source corpus": {"name": "/dev/fd/63", "pipe": True}}}
    current = {"files": {"source corpus": {"name": "r.en", "bytes": 5, "sha256": "ab" * 32}}}
    with caplog.at_level("WARNING"):
        assert identity_difference(saved, current, "m.checkpoint") is None
    assert [r.getMessage() for r in caplog.records] == [
        "source corpus: the checkpoint's run read /dev/fd/63, a pipe: cannot check that r.en "
        "is the data resumed"
    ]
