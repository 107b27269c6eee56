"""The other tools of this folder as modules, for the tools that reuse their parts: a tool is a
script named without ``.py`` (``tools/NAME``), which ``import`` does not find by its name."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def load_tool(name: str):
    """``tools/NAME`` as a module (``plain-rnnsearch`` as ``plain_rnnsearch``), run once: later
    calls return the same module."""
    module_name = name.replace("-", "_")
    loader = importlib.machinery.SourceFileLoader(module_name, os.path.join(HERE, name))
    spec = importlib.util.spec_from_loader(module_name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
