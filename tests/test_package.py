import subprocess
import sys
from types import ModuleType

import jax
import pytest

import lineax_seq
from lineax_seq.__main__ import main


def test_host_devices_available():
    assert len(jax.devices("cpu")) == 8


def test_public_names_documented():
    assert len(set(lineax_seq.__all__)) == len(lineax_seq.__all__)
    missing = [name for name in lineax_seq.__all__ if not getattr(lineax_seq, name).__doc__]
    assert missing == []
    # Every public name at the top level is listed (modules aside).
    public = {
        name
        for name in dir(lineax_seq)
        if not name.startswith("_") and not isinstance(getattr(lineax_seq, name), ModuleType)
    }
    assert public == set(lineax_seq.__all__)


def test_cli_help():
    out = subprocess.run(
        [sys.executable, "-m", "lineax_seq", "--help"], capture_output=True, text=True, check=True
    )
    assert "demo" in out.stdout


@pytest.mark.slow
def test_demo_runs_twice_into_the_same_directory(tmp_path):
    # The second run must replace the first one's outputs, not refuse to start (the BiGS
    # section trains with a metrics file in its directory).
    argv = ["demo", "--small", "--only", "bigs", "--out", str(tmp_path)]
    (tmp_path / "bigs").mkdir()
    (tmp_path / "bigs" / "stale.txt").write_text("from an earlier run")
    for _ in range(2):
        assert main(argv) == 0
        assert (tmp_path / "bigs" / "metrics.jsonl").exists()
    assert not (tmp_path / "bigs" / "stale.txt").exists()
