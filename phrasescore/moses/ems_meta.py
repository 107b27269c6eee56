"""Moses' ``experiment.meta``: the step definitions of its Experiment Management System (EMS),
read and written back line for line, so that steps can be added and inputs changed in place.

The format, as ``experiment.perl``'s ``read_meta`` reads it: ``[MODULE] single|multiple``
headers; a step's name at the start of a line; its attributes on indented ``key: value`` lines
(``in:``, ``out:``, ``template:``, ``ignore-unless:``...); ``#`` starts a comment; a trailing
backslash continues a line. Text this module does not change comes back byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from phrasescore.errors import InputError

_HEADER = re.compile(r"\[(\S+)\]\s+(\S+)")
_ATTRIBUTE = re.compile(r"\s+(\S+):\s(.*\S)\s*$")


@dataclass
class MetaStep:
    """One step: its name line and the lines below it (attributes, continuations, blanks)."""

    name: str
    lines: list[str]
    """The step's text, its name line first, each line with its newline."""

    def attributes(self) -> dict[str, str]:
        """``key -> value`` of its attribute lines (continuations joined, as read_meta does)."""
        found = {}
        for line in _logical_lines(self.lines[1:]):
            match = _ATTRIBUTE.match(line)
            if match:
                found[match.group(1)] = match.group(2)
        return found

    def inputs(self) -> list[str]:
        return self.attributes().get("in", "").split()

    def set_attribute(self, key: str, value: str) -> None:
        """Replace the ``key:`` line (one physical line), or add one after the last attribute."""
        for i, line in enumerate(self.lines[1:], start=1):
            match = _ATTRIBUTE.match(line)
            if match and match.group(1) == key:
                if line.rstrip().endswith("\\"):
                    raise InputError(f"step {self.name}: its {key}: line continues, not changed")
                indent = line[: len(line) - len(line.lstrip())]
                self.lines[i] = f"{indent}{key}: {value}\n"
                return
        last = max((i for i, line in enumerate(self.lines) if _ATTRIBUTE.match(line)), default=0)
        self.lines.insert(last + 1, f"\t{key}: {value}\n")


@dataclass
class MetaModule:
    """A ``[MODULE] type`` section: its header line, the lines before its first step, steps."""

    name: str
    header: list[str]
    steps: list[MetaStep] = field(default_factory=list)

    def step(self, name: str) -> MetaStep:
        for step in self.steps:
            if step.name == name:
                return step
        raise InputError(f"experiment.meta has no step {name} in [{self.name}]")

    def insert_after(self, after: str, steps: list[MetaStep]) -> None:
        index = self.steps.index(self.step(after))
        self.steps[index + 1 : index + 1] = steps


@dataclass
class Meta:
    """A whole meta file: the lines before the first module, then the modules in order."""

    preamble: list[str]
    modules: list[MetaModule]

    def module(self, name: str) -> MetaModule:
        for module in self.modules:
            if module.name == name:
                return module
        raise InputError(f"experiment.meta has no [{name}] module")

    def text(self) -> str:
        parts = list(self.preamble)
        for module in self.modules:
            parts += module.header
            for step in module.steps:
                parts += step.lines
        return "".join(parts)

    def outputs(self) -> dict[str, list[str]]:
        """``MODULE:out-name -> [steps that produce it]`` over every module."""
        made: dict[str, list[str]] = {}
        for module in self.modules:
            for step in module.steps:
                out = step.attributes().get("out")
                if out:
                    made.setdefault(f"{module.name}:{out}", []).append(step.name)
        return made


def _code(line: str) -> str:
    """A line without its comment."""
    return line.split("#", 1)[0]


def _logical_lines(lines: list[str]) -> list[str]:
    """Physical lines joined where one ends with a backslash (comments dropped)."""
    joined, pending = [], ""
    for line in lines:
        code = _code(line).rstrip("\r\n")
        if code.rstrip().endswith("\\"):
            pending += code.rstrip()[:-1] + " "
            continue
        joined.append(pending + code)
        pending = ""
    if pending:
        joined.append(pending)
    return joined


def parse_meta(text: str, path: str = "experiment.meta") -> Meta:
    """Split a meta file into modules and steps; a line read_meta would refuse is refused here,
    naming it."""
    meta = Meta(preamble=[], modules=[])
    lines = text.splitlines(keepends=True)
    target = meta.preamble
    step: MetaStep | None = None
    continued = False
    for number, line in enumerate(lines, start=1):
        code = _code(line)
        if continued or not code.strip():
            target.append(line)
            continued = code.rstrip().endswith("\\")
            continue
        continued = code.rstrip().endswith("\\")
        header = _HEADER.match(code)
        if header:
            meta.modules.append(MetaModule(header.group(1), [line]))
            target, step = meta.modules[-1].header, None
        elif not code[0].isspace():
            if not meta.modules:
                raise InputError("a step before the first [MODULE] line", path, number)
            step = MetaStep(code.split()[0], [line])
            meta.modules[-1].steps.append(step)
            target = step.lines
        elif _ATTRIBUTE.match(code.rstrip("\r\n")) or continued:
            if step is None:
                raise InputError("an attribute line before the module's first step", path, number)
            target.append(line)
        else:
            raise InputError(f"not a meta line: {line.strip()!r}", path, number)
    if not meta.modules:
        raise InputError("no [MODULE] line: not an EMS meta file", path)
    return meta


def new_step(name: str, attributes: list[tuple[str, str]]) -> MetaStep:
    """A step written as experiment.meta writes its own: the name, then tab-indented lines."""
    return MetaStep(name, [f"{name}\n", *(f"\t{key}: {value}\n" for key, value in attributes)])


def replace_input(step: MetaStep, old: str, new: str) -> None:
    """In ``step``'s ``in:`` line, the input ``old`` becomes ``new`` (e.g. ``A=OR=old``)."""
    inputs = step.inputs()
    if old not in inputs:
        raise InputError(f"step {step.name} does not read {old} (its inputs: {' '.join(inputs)})")
    step.set_attribute("in", " ".join(new if name == old else name for name in inputs))


def add_to_list(step: MetaStep, key: str, setting: str) -> None:
    """Add ``setting`` to ``step``'s ``key:`` list (``ignore-if:``), creating the line."""
    values = step.attributes().get(key, "").split()
    if setting not in values:
        step.set_attribute(key, " ".join([*values, setting]))
