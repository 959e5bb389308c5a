"""Shared test configuration.

* 8 host CPU devices, so sharding tests can build meshes (must be set before JAX starts),
  and XLA's warnings on stderr (the mesh tests read them).
* The same suite runs on a GPU: float32 matrix products at full precision (GPUs round
  their operands to TF32 by default, 3e-4 off the float32 references of the oracle
  tests), and no memory preallocation, so that the scripts the tests start in
  subprocesses find GPU memory left. Both are environment variables, which those
  subprocesses inherit.
* Compilation, not execution, dominates the suite, so it compiles fast: XLA's
  optimisation passes are off (`JAX_DISABLE_MOST_OPTIMIZATIONS`, a fifth of the suite's
  time), and where JAX runs on the CPU, so are its fusion emitters (`FAST_COMPILE` in
  `_scripts.py`, a further third). Results agree to the tests' tolerances either way;
  `JAX_DISABLE_MOST_OPTIMIZATIONS=0 XLA_FLAGS=--xla_cpu_use_fusion_emitters=true make
  test` runs the suite compiled as the benchmarks, the demo and the experiments are.
* Strict dtype promotion: implicit float32 -> complex64 / int -> float mixes are errors.
* Shared PRNG keys; keep shapes small, since compile time dominates the suite.
"""

import os

from _scripts import FAST_COMPILE

# Added to the flags a user sets, unless they set these themselves.
flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    flags += " --xla_force_host_platform_device_count=8"
if FAST_COMPILE and "xla_cpu_use_fusion_emitters" not in flags:
    flags += " " + FAST_COMPILE
os.environ["XLA_FLAGS"] = flags.strip()
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# XLA's warnings reach stderr: tests/test_mesh_models.py fails on a resharding warning.
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"

import jax  # noqa: E402
import jax.random as jr  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture
def key():
    return jr.key(0)


@pytest.fixture
def getkey():
    """Return a function that yields a fresh key on every call."""
    keys = iter(jr.split(jr.key(1234), 10_000))
    return lambda: next(keys)


@pytest.fixture
def no_jaxtyping():
    """Turn jaxtyping's checks off for one test (as `JAXTYPING_DISABLE=1` does for a
    user), so that the library's own argument checks, not the annotations, are tested."""
    import jaxtyping

    before = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", before)
