import subprocess
import sys

import jax

import lineax_seq


def test_host_devices_available():
    assert len(jax.devices("cpu")) == 8


def test_public_names_documented():
    missing = [
        name
        for name in dir(lineax_seq)
        if not name.startswith("_")
        and callable(getattr(lineax_seq, name))
        and not getattr(lineax_seq, name).__doc__
    ]
    assert missing == []


def test_cli_help():
    out = subprocess.run(
        [sys.executable, "-m", "lineax_seq", "--help"], capture_output=True, text=True, check=True
    )
    assert "demo" in out.stdout
