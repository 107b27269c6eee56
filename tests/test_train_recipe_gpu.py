"""bin/phrasescore-train-recipe on a machine with one GPU: the five models train at once, each
its own process on the one GPU (the CPU build here has no CUDA, so each training then stops
with its one-line error; what is checked is the plan the script carries out)."""

from __future__ import annotations

import re

from .test_bin_scripts import recipe_inputs, run_script

ONE_GPU = (
    "#!/bin/sh\n[ \"$1\" = -L ] && echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\nexit 0\n"
)


def test_train_recipe_on_one_gpu_starts_the_five_models_at_once_on_it(tmp_path):
    fake_bin = tmp_path / "gpu-machine"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text(ONE_GPU)
    smi.chmod(0o755)
    args = recipe_inputs(tmp_path)
    done = run_script(
        "phrasescore-train-recipe", *args, "--device", "cuda", "--", "--preset", "tiny",
        "--max-steps", "1", cwd=tmp_path, path_extra=[str(fake_bin)],
    )  # fmt: skip
    started = re.findall(r"training (\w+) \(.*, (cuda:\d+) slot (\d+)\)", done.stderr)
    assert sorted(name for name, _, _ in started) == sorted(
        ["column", "l2r", "r2l", "inverse", "lstm"]
    ), done.stderr
    assert {where for _, where, _ in started} == {"cuda:0"}
    assert sorted(int(slot) for _, _, slot in started) == [0, 1, 2, 3, 4]
    # all five were started before the first one ended
    lines = done.stderr.splitlines()
    first_end = next(i for i, ln in enumerate(lines) if re.search(r": (done|FAILED) ", ln))
    assert sum("training " in ln for ln in lines[:first_end]) == 5, done.stderr
