"""Run Python scripts in fresh processes: as a reader would (README, docs, tutorials), or
as the hosts of a multi-process JAX job."""

import os
import pathlib
import socket
import subprocess
import sys
from importlib.metadata import distributions


def _cpu_only() -> bool:
    """No accelerator plugin for JAX is installed: JAX runs on the CPU."""
    names = ((d.metadata["Name"] or "").lower().replace("_", "-") for d in distributions())
    return not any(
        n.startswith(("jax-cuda", "jax-rocm", "libtpu", "jax-metal"))
        or (n.startswith("jax") and n.endswith(("-plugin", "-pjrt")))
        for n in names
    )


# XLA's classic CPU code generation: it compiles the suite's many small programs about a
# third faster than the default fusion emitters (compilation dominates the suite). It
# rounds differently in the last bit, so every process of a test must use it or none.
# Only where JAX runs on the CPU: an accelerator's jaxlib may be newer than the pinned
# one and not know the flag (XLA aborts on an unknown flag).
FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false" if _cpu_only() else ""


def xla_flags(devices: int) -> str:
    """`XLA_FLAGS` for a script the suite starts: this process's flags (the suite's, see
    conftest.py, or the user's), with `devices` host CPU devices."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    kept = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])


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


def free_port() -> int:
    """A free TCP port on loopback (for `jax.distributed.initialize`'s coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_processes(
    script: pathlib.Path, num_processes: int, *args: str, cwd: pathlib.Path
) -> list[subprocess.Popen]:
    """`num_processes` runs of `python script PROCESS_ID NUM_PROCESSES PORT *args`, as
    hosts of one JAX job on loopback: CPU devices (one each, unless the script sets
    `XLA_FLAGS` itself), even beside an accelerator. See `wait_for`."""
    port = free_port()
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": xla_flags(1),
    }
    return [
        subprocess.Popen(
            [sys.executable, str(script), str(i), str(num_processes), str(port), *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(num_processes)
    ]


def wait_for(procs: list[subprocess.Popen], timeout: float = 180) -> None:
    """Wait for `start_processes`'s processes; each must exit with 0 (its output is the
    assertion's message). On a timeout all are killed, so none is left waiting."""
    try:
        logs = [p.communicate(timeout=timeout)[0].decode() for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log


def join_processes() -> tuple[int, int, pathlib.Path]:
    """In a script started by `start_processes`: join the job (CPU collectives over gloo)
    and return `(process_id, num_processes, out_dir)` from the command line."""
    import jax

    process_id, num_processes, port = (int(a) for a in sys.argv[1:4])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=60,
    )
    return process_id, num_processes, pathlib.Path(sys.argv[4])
