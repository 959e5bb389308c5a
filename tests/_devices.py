"""Skip marks for tests that need several devices or a GPU, and a check of errors that
asynchronous dispatch (on a GPU) delays."""

import re
from collections.abc import Callable

import jax
import pytest

# (data, model) meshes of 8 devices: the host CPU devices tests/conftest.py asks for. On a
# machine with one accelerator, JAX's default devices are the accelerator's.
needs_8_devices = pytest.mark.skipif(
    jax.device_count() < 8,
    reason=f"needs 8 devices, JAX has {jax.device_count()} ({jax.default_backend()}); "
    "on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=8 provides them",
)

# cuDNN's fused attention (`implementation="cudnn"`): NVIDIA GPUs only.
needs_cuda = pytest.mark.skipif(
    jax.default_backend() != "gpu" or "cuda" not in jax.devices()[0].client.platform_version,
    reason=f"needs an NVIDIA GPU (cuDNN), JAX runs on {jax.default_backend()}",
)


def assert_check_fails(match: str, fn: Callable[..., object], *args: object) -> None:
    """Assert that `fn(*args)` fails one of the library's value checks with a message
    matching `match`: a `ValueError` where the check is concrete, or under `jit` a traced
    check's run-time error, a `JaxRuntimeError` that ends with the check's `ValueError`.

    The result is awaited: on a GPU, dispatch is asynchronous, so the call returns and
    the error surfaces only once the result is read. An error raised by something else
    (e.g. jaxtyping's `TypeCheckError` inside the check's callback) fails the assertion,
    even if its message quotes `match`."""
    with pytest.raises((ValueError, jax.errors.JaxRuntimeError)) as info:
        jax.block_until_ready(fn(*args))
    text = str(info.value)
    if isinstance(info.value, jax.errors.JaxRuntimeError):
        match = f"ValueError: [^\\n]*(?:{match})"
    assert re.search(match, text), f"{match!r} not found in {text!r}"
