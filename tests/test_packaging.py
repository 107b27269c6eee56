"""`pip install -e .[test]` brings everything the tests import (issue 14)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _extra(name: str) -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options.extras_require"][name].split("\n")
    return {re.split(r"[<>=!~ ]", line.strip())[0].lower() for line in lines if line.strip()}


def test_the_test_extra_brings_sacrebleu_which_the_translate_tests_use():
    assert "sacrebleu" in _extra("test")


def test_the_test_extra_brings_pytest_xdist_which_make_test_uses():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "pytest -q -n $(PYTEST_WORKERS) tests" in makefile
    assert "pytest-xdist" in _extra("test")


def _imports(path: Path) -> set[str]:
    """The phrasescore modules a source file imports (at any depth of the file)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("phrasescore")}


def test_the_engine_knows_no_moses_file_and_no_job():
    """The engine scores ids and strings; the jobs parse the Moses lines (issue 24)."""
    for path in (ROOT / "phrasescore" / "engine").glob("*.py"):
        bad = {n for n in _imports(path) if n.startswith(("phrasescore.moses", "phrasescore.jobs"))}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_training_loop_calls_no_job_and_reads_no_moses_line():
    """The training loop is engine, not a job (issue 29): it imports no job, no Moses format
    module and no CLI."""
    for path in (ROOT / "phrasescore" / "training").glob("*.py"):
        prefixes = ("phrasescore.jobs", "phrasescore.moses", "phrasescore.cli")
        bad = {n for n in _imports(path) if n.startswith(prefixes)}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_a_job_imports_no_other_command():
    """A job module imports the shared modules of jobs/ and its own parts, never another
    command's job (issue 24)."""
    shared = {"common", "bleu", "ini_update", "moses_tools", "nbest_features"}
    own_parts = {"rescore": {"rescore_columns", "rescore_chunks", "rescore_partial"}}
    own_parts["rescore_chunks"] = {"rescore_columns", "rescore_partial"}
    own_parts["rescore_columns"] = {"rescore_partial"}
    own_parts["ab"] = {"ab_rerank"}
    for path in (ROOT / "phrasescore" / "jobs").glob("*.py"):
        jobs = {n.split(".")[2] for n in _imports(path) if n.startswith("phrasescore.jobs.")}
        allowed = shared | own_parts.get(path.stem, set())
        assert jobs <= allowed, f"{path.name} imports the jobs {sorted(jobs - allowed)}"
