"""The benchmark scripts redraw a results JSON's plot (`--plot-only`), and refuse a file
that is not one of theirs with a one-line error (it was a KeyError traceback); their
partial results never replace complete ones."""

import json
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
    shutil.copy(RESULTS / "bst_decode.json", tmp_path / "bst_decode.json")
    drawn = _plot_only("bst_decode.py", tmp_path / "bst_decode.json")
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert (tmp_path / "bst_decode.png").stat().st_size > 1000
    missing = _plot_only("ssm.py", tmp_path / "none.json")
    assert missing.returncode == 1
    assert "cannot read a results JSON" in missing.stderr.strip().splitlines()[-1]


def test_partial_results_never_replace_a_complete_run(tmp_path, monkeypatch):
    """A run saved after each length writes `<name>_partial.json` until its last length,
    whose save replaces the partial files, never the committed ones before it."""
    sys.path.insert(0, str(RESULTS.parent))
    try:
        import _common
    finally:
        sys.path.remove(str(RESULTS.parent))
    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    (tmp_path / "ssm.json").write_text("committed")
    first = _common.save("ssm", {"lengths": [1]}, complete=False)
    assert first.name == "ssm_partial.json"
    assert (tmp_path / "ssm.json").read_text() == "committed"
    first.with_suffix(".png").write_bytes(b"plot")
    done = _common.save("ssm", {"lengths": [1, 2]})
    assert done.name == "ssm.json" and sorted(p.name for p in tmp_path.iterdir()) == ["ssm.json"]
    record = json.loads(done.read_text())
    assert record["complete"] and record["lengths"] == [1, 2]
    assert record["environment"]["versions"]["lineax_seq"] is not None
