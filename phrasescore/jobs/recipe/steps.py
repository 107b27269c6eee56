"""A small make: steps with declared inputs, outputs and settings, each run only when out of date.

A step is up to date, as make and Moses' EMS decide, when

- its stamp (``LOGS/NAME.stamp``, written only once the step has finished and its outputs are in
  place) records the settings, inputs and outputs it would run with now,
- every output exists, and the oldest output is at least as new as the newest input,
- and no step it reads from runs again in this run.

Otherwise it runs: its stamp is removed first, its tools' work folders emptied, its command (a
program, its stdout and stderr into ``LOGS/NAME.log``) or its in-process action runs, the outputs
that the command writes under temporary names (``staged``) take their final names, and the stamp
is written. A run killed at any point therefore leaves every finished step stamped and the step it
was in unstamped: running again redoes that step alone (and those after it). Steps run in the
order their inputs and outputs impose, up to ``jobs`` at a time; of the steps ready to start, the
one with the longest chain of steps after it goes first (list scheduling by critical path: the
column's training, which rescore, MERT and the decodes wait for, before a sentence model, which
only the n-best scoring waits for).

A step whose command keeps its own progress (a training's checkpoint: ``progress``) is not redone
from the beginning when it was stopped: its start is recorded (``LOGS/NAME.started``: its stamp's
record and each input's size and time), and when the next run finds that record equal to the
step's record now, the step continues with ``resume_command``. Any other run of the step removes
the progress files first, so a changed step never continues another run's work.

``PHRASESCORE_RECIPE_KILL_IN=NAME`` (for the tests of resumption) makes the runner kill itself
with SIGKILL once step NAME's command has finished and the first of its staged outputs has its
final name, before the stamp: a run killed as the system kills one, mid-way through writing a
step's outputs, at a point the tests can choose.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from phrasescore.errors import RunStopped
from phrasescore.files import AtomicOutput

log = logging.getLogger(__name__)

KILL_HOOK = "PHRASESCORE_RECIPE_KILL_IN"
POLL_SECONDS = 0.2


@dataclass
class Step:
    """One step: what it reads and writes, what decides its outputs besides its inputs' contents
    (``settings``), and how it runs (``command`` or ``action``)."""

    name: str
    kind: str
    inputs: list[str]
    outputs: list[str]
    settings: dict
    command: list[str] | None = None
    action: Callable[[], None] | None = None
    stdin: str | None = None
    stdout: str | None = None
    """An output written from the command's standard output (under a temporary name first)."""
    staged: dict[str, str] = field(default_factory=dict)
    """Temporary name the command writes -> the output it becomes once the command succeeded."""
    fresh_dirs: list[str] = field(default_factory=list)
    """Work folders of the step's tools, emptied before it runs (nothing stale is reused)."""
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    gpu: bool = False
    """Runs on a GPU: one of the machine's GPUs by slot (CUDA_VISIBLE_DEVICES)."""
    skip: str | None = None
    """Why the step cannot run here (a program that is missing), or None."""
    progress: list[str] = field(default_factory=list)
    """Files in which the command keeps its progress (a checkpoint)."""
    resume_command: list[str] | None = None
    """The command that continues a stopped run from ``progress``."""

    def stamp_record(self) -> dict:
        return {"settings": self.settings, "inputs": self.inputs, "outputs": self.outputs}

    def start_record(self) -> dict:
        """The stamp's record and each input's size and modification time: a stopped run
        continues only with the same inputs, unchanged."""
        seen = {}
        for path in self.inputs:
            try:
                info = os.stat(path)
                seen[path] = [info.st_size, info.st_mtime_ns]
            except OSError:
                seen[path] = None
        return {**self.stamp_record(), "input_files": seen}

    def command_line(self, command: list[str] | None = None) -> str:
        command = command or self.command
        if command is None:
            return f"(in process: {self.kind})"
        line = shlex.join(command)
        if self.stdin:
            line += f" < {shlex.quote(self.stdin)}"
        if self.stdout:
            line += f" > {shlex.quote(self.stdout)}"
        return line


@dataclass
class Planned:
    """A step and what this run does with it: ``run`` (and why), ``up to date`` or ``skipped``."""

    step: Step
    state: str
    reason: str
    seconds: float | None = None
    continues: bool = False
    """The step runs ``resume_command``: it continues its stopped run."""

    @property
    def command(self) -> list[str] | None:
        """What the step runs: its ``resume_command`` when it continues, else its command."""
        return self.step.resume_command if self.continues else self.step.command


class StepGraph:
    """The steps of a run, their order and their stamps and logs under ``logs``."""

    def __init__(self, steps: list[Step], logs: Path, jobs: int = 1, gpus: int = 0):
        self.steps = steps
        self.logs = logs
        self.jobs = max(1, jobs)
        self.gpus = gpus
        self.by_name = {step.name: step for step in steps}
        made_by = {path: step.name for step in steps for path in step.outputs}
        self.after = {
            step.name: sorted({made_by[p] for p in step.inputs if p in made_by} - {step.name})
            for step in steps
        }
        self.chain = self._chains()

    def _chains(self) -> dict[str, int]:
        """Each step's number of steps on the longest path from it to the end (itself included)."""
        readers: dict[str, list[str]] = {step.name: [] for step in self.steps}
        for name, sources in self.after.items():
            for source in sources:
                readers[source].append(name)
        chain: dict[str, int] = {}

        def length(name: str) -> int:
            if name not in chain:
                chain[name] = 1 + max(map(length, readers[name]), default=0)
            return chain[name]

        for step in self.steps:
            length(step.name)
        return chain

    def stamp_path(self, step: Step) -> Path:
        return self.logs / f"{step.name}.stamp"

    def log_path(self, step: Step) -> Path:
        return self.logs / f"{step.name}.log"

    def started_path(self, step: Step) -> Path:
        return self.logs / f"{step.name}.started"

    # -- the plan --------------------------------------------------------------------------------
    def plan(self) -> list[Planned]:
        """What a run would do with each step, in the order the steps were given (which follows
        their inputs and outputs)."""
        planned: dict[str, Planned] = {}
        for step in self.steps:
            before = [planned[name] for name in self.after[step.name]]
            skipped = [p.step.name for p in before if p.state == "skipped"]
            if step.skip:
                planned[step.name] = Planned(step, "skipped", step.skip)
            elif skipped:
                planned[step.name] = Planned(step, "skipped", f"after {skipped[0]}, skipped")
            else:
                rerun = [p.step.name for p in before if p.state == "run"]
                reason = f"after {rerun[0]}" if rerun else self.out_of_date(step)
                planned[step.name] = Planned(step, "run" if reason else "up to date", reason or "")
                if reason and not rerun and self.was_stopped(step):
                    planned[step.name].reason = "stopped: continues from its progress"
                    planned[step.name].continues = True
        return [planned[step.name] for step in self.steps]

    def was_stopped(self, step: Step) -> bool:
        """Whether ``step`` can continue a run of itself that was stopped: it has a
        ``resume_command``, no stamp, and its start record is the one it would write now."""
        if step.resume_command is None or self.stamp_path(step).exists():
            return False
        try:
            started = json.loads(self.started_path(step).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return started == json.loads(json.dumps(step.start_record()))

    def out_of_date(self, step: Step) -> str | None:
        """Why ``step`` must run although nothing before it runs, or None (up to date)."""
        stamp = self.stamp_path(step)
        try:
            recorded = json.loads(stamp.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "not run yet" if not stamp.exists() else "its stamp is unreadable"
        if recorded.get("settings") != step.settings:
            changed = sorted(
                key
                for key in set(recorded.get("settings", {})) | set(step.settings)
                if recorded.get("settings", {}).get(key) != step.settings.get(key)
            )
            return "settings changed: " + ", ".join(changed)
        if recorded.get("inputs") != step.inputs or recorded.get("outputs") != step.outputs:
            return "other inputs or outputs"
        oldest_output = None
        for path in step.outputs:
            try:
                mtime = os.stat(path).st_mtime_ns
            except OSError:
                return f"{path} is missing"
            oldest_output = mtime if oldest_output is None else min(oldest_output, mtime)
        for path in step.inputs:
            with contextlib.suppress(OSError):
                if oldest_output is not None and os.stat(path).st_mtime_ns > oldest_output:
                    return f"{path} is newer than its outputs"
        return None

    # -- the run ---------------------------------------------------------------------------------
    def run(self, plan: list[Planned], progress: Callable[[str], None]) -> list[Planned]:
        """Run the steps the plan runs, up to ``jobs`` at once; a failed step stops the run once
        the steps running beside it are done (their work is kept)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        waiting = [p for p in plan if p.state == "run"]
        done = {p.step.name for p in plan if p.state == "up to date"}
        running: dict[str, tuple[Planned, subprocess.Popen, int, float]] = {}
        failed: list[str] = []
        try:
            while waiting or running:
                for name, (planned, process, _slot, started) in list(running.items()):
                    if process.poll() is None:
                        continue
                    del running[name]
                    planned.seconds = time.monotonic() - started
                    if process.returncode == 0:
                        self._finish(planned.step, planned.seconds)
                        done.add(name)
                        progress(f"{name}: done in {planned.seconds:.0f} s")
                    else:
                        failed.append(f"{name} failed with exit code {process.returncode}")
                        progress(failed[-1] + f" (log: {self.log_path(planned.step)})")
                ready = [p for p in waiting if all(a in done for a in self.after[p.step.name])]
                ready.sort(key=lambda p: -self.chain[p.step.name])  # stable: then list order
                while ready and len(running) < self.jobs and not failed:
                    planned = ready.pop(0)
                    waiting.remove(planned)
                    slot = min(set(range(self.jobs)) - {r[2] for r in running.values()})
                    started = time.monotonic()
                    progress(f"{planned.step.name}: running ({planned.reason})")
                    process = self._start(planned, slot)
                    if process is None:  # an in-process action: done already
                        planned.seconds = time.monotonic() - started
                        self._finish(planned.step, planned.seconds)
                        done.add(planned.step.name)
                        progress(f"{planned.step.name}: done in {planned.seconds:.0f} s")
                    else:
                        running[planned.step.name] = (planned, process, slot, started)
                if failed and not running:
                    break
                if running:
                    time.sleep(POLL_SECONDS)
        except BaseException:
            for _, process, _, _ in running.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
            for _, process, _, _ in running.values():
                process.wait()
            raise
        if failed:
            raise RunStopped(
                "; ".join(failed) + ": the steps that finished are kept, run again to resume "
                f"(logs in {self.logs})"
            )
        return plan

    def _start(self, planned: Planned, slot: int) -> subprocess.Popen | None:
        """Start the planned step's command (or run its action here, returning None)."""
        step, command = planned.step, planned.command
        with contextlib.suppress(FileNotFoundError):
            self.stamp_path(step).unlink()
        for folder in step.fresh_dirs:
            _remove_tree(Path(folder))
        if not planned.continues:
            for path in step.progress:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if step.resume_command is not None:
            with AtomicOutput(str(self.started_path(step))) as out:
                out.write(json.dumps(step.start_record(), indent=1, sort_keys=True) + "\n")
        for path in [*step.outputs, *step.staged]:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(step)
        if step.action is not None:
            with open(log_path, "w", encoding="utf-8") as out:
                out.write(f"# {step.command_line()}\n")
            step.action()
            return None
        env = {**os.environ, **step.env}
        if step.gpu and self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(slot % self.gpus)
        with contextlib.ExitStack() as files:
            log_file = files.enter_context(open(log_path, "wb"))
            log_file.write(f"# {step.command_line(command)}\n".encode())
            log_file.flush()
            stdin = files.enter_context(open(step.stdin, "rb")) if step.stdin else None
            stdout = log_file
            if step.stdout:
                stdout = files.enter_context(open(_partial(step.stdout), "wb"))
            return subprocess.Popen(
                command,
                cwd=step.cwd,
                env=env,
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=stdout,
                stderr=log_file,
                start_new_session=True,  # Ctrl-C reaches the runner, which stops each group
            )

    def _finish(self, step: Step, seconds: float) -> None:
        """The step's outputs under their final names, then its stamp."""
        renames = dict(step.staged)
        if step.stdout:
            renames[_partial(step.stdout)] = step.stdout
        for index, (temporary, final) in enumerate(renames.items()):
            os.replace(temporary, final)
            if index == 0:
                self._kill_hook(step)
        if not renames:
            self._kill_hook(step)
        missing = [path for path in step.outputs if not os.path.exists(path)]
        if missing:
            raise RunStopped(
                f"step {step.name} finished without writing {missing[0]} "
                f"(see {self.log_path(step)})"
            )
        record = {**step.stamp_record(), "seconds": round(seconds, 1)}
        with AtomicOutput(str(self.stamp_path(step))) as out:
            out.write(json.dumps(record, indent=1, sort_keys=True) + "\n")
        with contextlib.suppress(FileNotFoundError):
            self.started_path(step).unlink()

    @staticmethod
    def _kill_hook(step: Step) -> None:
        if os.environ.get(KILL_HOOK) == step.name:
            os.kill(os.getpid(), signal.SIGKILL)


def _partial(path: str) -> str:
    return path + ".partial"


def _remove_tree(folder: Path) -> None:
    """Remove a step's work folder (inside the recipe's own folder) and what it holds; a link
    in it is removed, never followed."""
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)
