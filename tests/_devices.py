"""Skip marks for tests that need several devices."""

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
