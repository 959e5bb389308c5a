"""Every tutorial is a runnable script; run each at small size in a fresh process."""

import pathlib

import pytest
from _scripts import run_script

TUTORIALS = sorted((pathlib.Path(__file__).parents[1] / "tutorials").glob("*.py"))


def test_tutorials_exist():
    assert len(TUTORIALS) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("script", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(script, tmp_path):
    env = {"LINEAX_SEQ_SMALL": "1", "LINEAX_SEQ_OUT": str(tmp_path)}
    result = run_script(script, tmp_path, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert any(tmp_path.iterdir()), "a tutorial should save at least one figure or file"
