"""Counting XLA compilations (a check on retracing that needs no timing)."""

import contextlib
from collections.abc import Iterator

import jax


@contextlib.contextmanager
def compilations() -> Iterator[list[str]]:
    """The names (e.g. `"jit(_generate)"`) of the XLA compilations run in the block."""
    names = []

    def listen(event, duration, fun_name="", **kwargs):
        names.extend([fun_name] if "backend_compile" in event else [])

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
