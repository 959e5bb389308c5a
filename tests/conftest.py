"""Shared test configuration.

* 8 host CPU devices, so sharding tests can build meshes (must be set before JAX starts),
  and XLA's warnings on stderr (the mesh tests read them).
* The same suite runs on a GPU: float32 matrix products at full precision (GPUs round
  their operands to TF32 by default, 3e-4 off the float32 references of the oracle
  tests), and no memory preallocation, so that the scripts the tests start in
  subprocesses find GPU memory left. Both are environment variables, which those
  subprocesses inherit.
* XLA's optimisation passes are off (`JAX_DISABLE_MOST_OPTIMIZATIONS`): compilation,
  not execution, dominates the suite, and they cost a fifth of it. Results agree to the
  tests' tolerances either way; `JAX_DISABLE_MOST_OPTIMIZATIONS=0 make test` runs the
  suite on the optimised build. Benchmarks, the demo and the experiments keep them.
* Strict dtype promotion: implicit float32 -> complex64 / int -> float mixes are errors.
* Shared PRNG keys; keep shapes small, since compile time dominates the suite.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
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
