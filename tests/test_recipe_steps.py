"""The recipe's small make (phrasescore.jobs.recipe.steps) over steps that copy files: which steps
a run runs, their stamps and logs, staged outputs, a failed step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from phrasescore.errors import RunStopped
from phrasescore.jobs.recipe.steps import KILL_HOOK, Step, StepGraph


def two_steps(folder: Path, suffix: str = "!") -> list[Step]:
    """copy: input -> middle (a program, its output staged); shout: middle + suffix -> output."""
    source, middle, output = folder / "input.txt", folder / "middle.txt", folder / "output.txt"

    def shout() -> None:
        output.write_text(middle.read_text() + suffix, encoding="utf-8")

    return [
        Step(
            name="copy",
            kind="copy",
            inputs=[str(source)],
            outputs=[str(middle)],
            settings={"cp": []},
            command=["cp", str(source), str(middle) + ".tmp"],
            staged={str(middle) + ".tmp": str(middle)},
        ),
        Step(
            name="shout",
            kind="shout",
            inputs=[str(middle)],
            outputs=[str(output)],
            settings={"suffix": suffix},
            action=shout,
        ),
    ]


def run(folder: Path, steps: list[Step]) -> dict[str, str]:
    graph = StepGraph(steps, folder / "logs")
    plan = graph.run(graph.plan(), progress=lambda message: None)
    return {p.step.name: p.state for p in plan}


def test_a_step_runs_when_its_settings_or_inputs_change_and_only_then(tmp_path):
    (tmp_path / "input.txt").write_text("hello", encoding="utf-8")
    assert run(tmp_path, two_steps(tmp_path)) == {"copy": "run", "shout": "run"}
    assert (tmp_path / "output.txt").read_text() == "hello!"
    assert not (tmp_path / "middle.txt.tmp").exists()
    assert (tmp_path / "logs" / "copy.log").read_text().startswith("# cp ")
    assert run(tmp_path, two_steps(tmp_path)) == {"copy": "up to date", "shout": "up to date"}

    steps = two_steps(tmp_path, suffix="?")
    graph = StepGraph(steps, tmp_path / "logs")
    assert [p.reason for p in graph.plan()] == ["", "settings changed: suffix"]
    assert run(tmp_path, steps) == {"copy": "up to date", "shout": "run"}
    assert (tmp_path / "output.txt").read_text() == "hello?"

    (tmp_path / "input.txt").write_text("bye", encoding="utf-8")
    earlier = (tmp_path / "input.txt").stat().st_mtime_ns - 10_000_000_000
    for made in ("middle.txt", "output.txt"):  # made before the input changed
        os.utime(tmp_path / made, ns=(earlier, earlier))
    steps = two_steps(tmp_path, suffix="?")
    reasons = [p.reason for p in StepGraph(steps, tmp_path / "logs").plan()]
    assert reasons == [f"{tmp_path / 'input.txt'} is newer than its outputs", "after copy"]
    assert run(tmp_path, steps) == {"copy": "run", "shout": "run"}
    assert (tmp_path / "output.txt").read_text() == "bye?"

    (tmp_path / "output.txt").unlink()
    assert run(tmp_path, two_steps(tmp_path, "?")) == {"copy": "up to date", "shout": "run"}


def test_a_failed_step_stops_the_run_and_the_finished_steps_are_kept(tmp_path):
    (tmp_path / "input.txt").write_text("hello", encoding="utf-8")
    steps = two_steps(tmp_path)
    steps[1] = Step(
        name="shout",
        kind="shout",
        inputs=[str(tmp_path / "middle.txt")],
        outputs=[str(tmp_path / "output.txt")],
        settings={},
        command=["sh", "-c", "echo the tool says no >&2; exit 3"],
    )
    with pytest.raises(RunStopped, match="shout failed with exit code 3: the steps that finished"):
        run(tmp_path, steps)
    assert (tmp_path / "logs" / "copy.stamp").exists()
    assert not (tmp_path / "logs" / "shout.stamp").exists()
    assert "the tool says no" in (tmp_path / "logs" / "shout.log").read_text()
    assert run(tmp_path, two_steps(tmp_path)) == {"copy": "up to date", "shout": "run"}


def test_a_run_killed_after_a_step_wrote_its_output_redoes_that_step(tmp_path):
    (tmp_path / "input.txt").write_text("hello", encoding="utf-8")
    script = (
        "import sys; from pathlib import Path\n"
        "from phrasescore.jobs.recipe.steps import StepGraph\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from test_recipe_steps import two_steps\n"
        "folder = Path(sys.argv[1])\n"
        "graph = StepGraph(two_steps(folder), folder / 'logs')\n"
        "graph.run(graph.plan(), progress=print)\n"
    )
    env = {**os.environ, KILL_HOOK: "copy"}
    command = [sys.executable, "-c", script, str(tmp_path), str(Path(__file__).parent)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert (tmp_path / "middle.txt").read_text() == "hello"  # the output is there, the stamp not
    assert not (tmp_path / "logs" / "copy.stamp").exists()
    assert run(tmp_path, two_steps(tmp_path)) == {"copy": "run", "shout": "run"}
    assert (tmp_path / "output.txt").read_text() == "hello!"


COUNT = """\
import os, signal, sys
progress, output, resume = sys.argv[1], sys.argv[2], sys.argv[3] == "--resume"
start = int(open(progress).read()) if resume and os.path.exists(progress) else 0
for done in range(start + 1, 6):
    with open(progress, "w") as out:
        out.write(str(done))
    if str(done) == os.environ.get("STOP_AT"):
        os.kill(os.getpid(), signal.SIGKILL)
with open(output, "w") as out:
    out.write(f"counted from {start} to 5 in {open(sys.argv[4]).read()}")
"""
"""Counts to 5, its progress in a file (as a training keeps its checkpoint), with --resume from
where that file says; killed by SIGKILL at $STOP_AT."""


def counting_step(folder: Path, stop_at: int | None = None, unit: str = "ones") -> Step:
    progress, output, source = folder / "count.progress", folder / "count.txt", folder / "unit.txt"
    command = [sys.executable, "-c", COUNT, str(progress), str(output)]
    return Step(
        name="count",
        kind="count",
        inputs=[str(source)],
        outputs=[str(output)],
        settings={"unit": unit},
        command=[*command, "--from-zero", str(source)],
        progress=[str(progress)],
        resume_command=[*command, "--resume", str(source)],
        env={"STOP_AT": str(stop_at)} if stop_at else {},
    )


def test_a_stopped_step_with_progress_continues_from_it_and_a_changed_one_starts_again(tmp_path):
    (tmp_path / "unit.txt").write_text("ones", encoding="utf-8")
    with pytest.raises(RunStopped, match="count failed with exit code -9"):
        run(tmp_path, [counting_step(tmp_path, stop_at=3)])
    assert (tmp_path / "count.progress").read_text() == "3"
    assert not (tmp_path / "logs" / "count.stamp").exists()
    (planned,) = StepGraph([counting_step(tmp_path)], tmp_path / "logs").plan()
    assert (planned.reason, planned.continues) == ("stopped: continues from its progress", True)
    assert run(tmp_path, [counting_step(tmp_path)]) == {"count": "run"}
    assert (tmp_path / "count.txt").read_text() == "counted from 3 to 5 in ones"
    assert f"--resume {tmp_path / 'unit.txt'}" in (tmp_path / "logs" / "count.log").read_text()
    assert not (tmp_path / "logs" / "count.started").exists()
    assert run(tmp_path, [counting_step(tmp_path)]) == {"count": "up to date"}

    # stopped, then its settings change: the progress of the other run is removed, not continued
    (tmp_path / "count.txt").unlink()
    with pytest.raises(RunStopped):
        run(tmp_path, [counting_step(tmp_path, stop_at=2)])
    (planned,) = StepGraph([counting_step(tmp_path, unit="twos")], tmp_path / "logs").plan()
    assert (planned.reason, planned.continues) == ("not run yet", False)
    assert run(tmp_path, [counting_step(tmp_path, unit="twos")]) == {"count": "run"}
    assert (tmp_path / "count.txt").read_text() == "counted from 0 to 5 in ones"

    # stopped, then its input changes: likewise
    with pytest.raises(RunStopped):
        run(tmp_path, [counting_step(tmp_path, stop_at=4)])
    (tmp_path / "unit.txt").write_text("tens", encoding="utf-8")
    assert run(tmp_path, [counting_step(tmp_path)]) == {"count": "run"}
    assert (tmp_path / "count.txt").read_text() == "counted from 0 to 5 in tens"


def test_of_the_ready_steps_the_one_with_the_longest_chain_after_it_starts_first(tmp_path):
    """One job, steps listed short-chain first: 'model' (read by 'score' alone) before 'column'
    (then 'rescore', 'mert', which 'score' reads too): column and rescore start before model, as
    the recipe's column training and its MERT chain start before a sentence model; a tie (mert,
    model) goes in list order."""

    def step(name: str, inputs: list[str]) -> Step:
        out = tmp_path / f"{name}.txt"
        return Step(
            name=name,
            kind=name,
            inputs=[str(tmp_path / f"{i}.txt") for i in inputs],
            outputs=[str(out)],
            settings={},
            command=["sh", "-c", f"echo {name} > {out}"],
        )

    steps = [step("model", []), step("column", []), step("rescore", ["column"])]
    steps += [step("mert", ["rescore"]), step("score", ["model", "mert"])]
    started: list[str] = []
    graph = StepGraph(steps, tmp_path / "logs", jobs=1)
    graph.run(
        graph.plan(), progress=lambda m: started.append(m.split(":")[0]) if "running" in m else None
    )
    assert started == ["column", "rescore", "model", "mert", "score"]
    assert graph.plan()[0].state == "up to date"
