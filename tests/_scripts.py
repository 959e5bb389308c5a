"""Run a Python script in a fresh process, as a reader would (README, docs, tutorials)."""

import os
import pathlib
import subprocess
import sys


def run_script(
    script: pathlib.Path, cwd: pathlib.Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python script` in `cwd` with this interpreter, the inherited environment plus
    `env` and `MPLBACKEND=Agg`; output captured as text, 600 s at most."""
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env={**os.environ, "MPLBACKEND": "Agg", **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
