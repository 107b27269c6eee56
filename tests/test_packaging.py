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
