"""Kill a training subprocess with SIGKILL (mid-run, then mid-save), resume, and
check the loss curve is identical to an uninterrupted run and no checkpoint is corrupt."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import _training_worker as worker
import jax
import numpy as np
import pytest
from _scripts import xla_flags

import lineax_seq as ls

WORKER = pathlib.Path(worker.__file__)
ROOT = WORKER.parents[1]


def _launch(out_dir, *extra):
    # The three runs share a persistent compilation cache: only the first compiles.
    env = dict(
        os.environ,
        XLA_FLAGS=xla_flags(8),
        JAX_COMPILATION_CACHE_DIR=str(out_dir.parent / "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(out_dir), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _train_losses(out_dir):
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    return [r["step"] for r in train], [r["loss"] for r in train]


def _last_step(out_dir):
    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [0]
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            pass
    return max(steps)


def _template():
    model = worker.make_model()
    return model, worker.optimizer().init(worker.eqx.filter(model, worker.eqx.is_inexact_array))


def _check_all_checkpoints_load(ckpt_dir):
    model, opt_state = _template()
    paths = ls.list_checkpoints(ckpt_dir)
    assert paths
    for p in paths:
        ls.load_checkpoint(p, model=model, opt_state=opt_state)
    return paths


@pytest.mark.slow
def test_sigkill_mid_run_and_mid_save_then_resume_is_exact(tmp_path):
    reference = worker.run(tmp_path / "reference")
    ref_steps, ref_losses = _train_losses(tmp_path / "reference")
    assert ref_steps == list(range(1, worker.STEPS + 1))

    out = tmp_path / "interrupted"
    # 1. SIGKILL from outside, in the middle of the run (after a checkpoint exists).
    proc = _launch(out, "--sleep", "0.1")
    deadline = time.time() + 60
    while _last_step(out) < 10:
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.time() < deadline, "worker made no progress"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = _last_step(out)
    assert killed_at < worker.STEPS, "the run finished before it was killed"
    saved = _check_all_checkpoints_load(out / "checkpoints")

    # 2. Resume, and SIGKILL during the save of step 20 (arrays written, not renamed).
    proc = _launch(out, "--kill-in-save", "20")
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == -signal.SIGKILL, output
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert "step_00000020" not in names
    assert any(n.startswith(".tmp-step_00000020") for n in names), names
    saved = _check_all_checkpoints_load(out / "checkpoints")
    assert saved[-1].name == "step_00000016"

    # 3. Resume again and finish.
    proc = _launch(out)
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 0, output
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["step_00000016", "step_00000020", "step_00000024"]  # tmp cleaned up
    _check_all_checkpoints_load(out / "checkpoints")

    steps, losses = _train_losses(out)
    assert steps == ref_steps  # every step logged exactly once
    np.testing.assert_array_equal(losses, ref_losses)
    model, opt_state = _template()
    final = ls.load_checkpoint(out / "checkpoints", model=model, opt_state=opt_state)
    assert final.step == worker.STEPS
    for a, b in zip(jax.tree.leaves(final.model), jax.tree.leaves(reference.model), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
