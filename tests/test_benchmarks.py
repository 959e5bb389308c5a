"""The benchmark scripts redraw a results JSON's plot (`--plot-only`), and refuse a file
that is not one of theirs with a one-line error (it was a KeyError traceback)."""

import os
import pathlib
import shutil
import subprocess
import sys

RESULTS = pathlib.Path(__file__).parents[1] / "benchmarks" / "results"


def _plot_only(script: str, json_path: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RESULTS.parent / script), "--plot-only", str(json_path)],
        env={**os.environ, "MPLBACKEND": "Agg", "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_plot_only_redraws_its_json_and_refuses_others(tmp_path):
    for name in ("ssm.json", "bst.json"):
        shutil.copy(RESULTS / name, tmp_path / name)
    drawn = _plot_only("ssm.py", tmp_path / "ssm.json")
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert (tmp_path / "ssm.png").stat().st_size > 1000
    other = _plot_only("ssm.py", tmp_path / "bst.json")
    assert other.returncode == 1 and not (tmp_path / "bst.png").exists()
    assert other.stderr.strip().splitlines()[-1] == (
        f"error: --plot-only {tmp_path / 'bst.json'}: not a results JSON of this script "
        "(no 'results' entry)"
    )
    missing = _plot_only("ssm.py", tmp_path / "none.json")
    assert missing.returncode == 1
    assert "cannot read a results JSON" in missing.stderr.strip().splitlines()[-1]
