"""`pip install -e .[test]` brings everything the tests import, and the import rules of the layers
that docs/development.md states hold."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
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


def _imports(path: Path, every: bool = False) -> set[str]:
    """The phrasescore modules a source file imports (at any depth of the file); with ``every``,
    the other packages' too."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if every or name.startswith("phrasescore")}


def test_the_engine_knows_no_moses_file_and_no_job():
    """The engine scores ids and strings; the jobs parse the Moses lines and hand it what it
    scores."""
    for path in (ROOT / "phrasescore" / "engine").glob("*.py"):
        bad = {n for n in _imports(path) if n.startswith(("phrasescore.moses", "phrasescore.jobs"))}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_training_loop_calls_no_job_and_reads_no_moses_line():
    """The training loop is a layer below the jobs, shared by train and train-lm: it imports no
    job, no Moses format module and no CLI."""
    for path in (ROOT / "phrasescore" / "training").glob("*.py"):
        prefixes = ("phrasescore.jobs", "phrasescore.moses", "phrasescore.cli")
        bad = {n for n in _imports(path) if n.startswith(prefixes)}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_a_job_imports_its_own_product_and_the_shared_jobs_never_another_product():
    """jobs/ holds one folder per product (rescore, nbest, tuning, analysis, training) beside the
    modules the products share (jobs/*.py): a job imports its own folder, the shared modules and
    the layers below, never another product's folder; a shared module imports no product."""
    jobs = ROOT / "phrasescore" / "jobs"
    products = {path.name for path in jobs.iterdir() if (path / "__init__.py").is_file()}
    assert {"rescore", "nbest", "tuning", "analysis", "training"} <= products
    for path in jobs.rglob("*.py"):
        own = path.parent.name if path.parent != jobs else None
        used = {n.split(".")[2] for n in _imports(path) if n.startswith("phrasescore.jobs.")}
        others = used & products - {own}
        assert not others, f"{path.relative_to(jobs)} imports the products {sorted(others)}"


def test_a_network_knows_ids_not_vocabularies_and_no_moses_file():
    """model/ holds the networks: they read and give ids, so no module of model/ imports text/
    (vocabularies, tokenisers), moses/ or the CLI; the special ids they share with text/ are
    phrasescore/special_ids.py's, below both."""
    for path in (ROOT / "phrasescore" / "model").rglob("*.py"):
        prefixes = ("phrasescore.text", "phrasescore.moses", "phrasescore.cli")
        bad = {n for n in _imports(path) if n.startswith(prefixes)}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_moses_formats_know_no_tensors_no_tokens_and_no_scoring():
    """moses/ reads and writes Moses' files as text and numbers: no module of it imports torch,
    a network, text/ or the engine."""
    for path in (ROOT / "phrasescore" / "moses").glob("*.py"):
        prefixes = ("torch", "phrasescore.model", "phrasescore.text", "phrasescore.engine")
        bad = {n for n in _imports(path, every=True) if n.startswith(prefixes)}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_every_commands_help_answers_without_importing_pytorch():
    """``--help`` of every command (bin/phrasescore-train-recipe probes ``train --help`` before
    each model) costs Python's start-up, not PyTorch's: the choices it lists (architectures,
    presets, optimisers) live in modules without torch."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from phrasescore.cli import cli\n"
        "names = sorted(cli.commands)\n"
        "for name in names:\n"
        "    result = CliRunner().invoke(cli, [name, '--help'])\n"
        "    assert result.exit_code == 0, (name, result.output)\n"
        "    assert 'torch' not in sys.modules, name\n"
        "print(' '.join(names))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {"train", "rescore", "nbest", "translate", "recipe"} <= set(proc.stdout.split())
