"""Counting XLA compilations (a check on retracing that needs no timing)."""

import contextlib
from collections.abc import Iterator

import jax


@contextlib.contextmanager
def compilations() -> Iterator[list[str]]:
    """The names (e.g. `"jit(_generate)"`) of the XLA compilations run in the block."""
    with _events("backend_compile") as names:
        yield names


@contextlib.contextmanager
def traces() -> Iterator[list[str]]:
    """The names of the functions traced to jaxprs in the block (by `jit`, or abstractly
    by `eval_shape`): Python work repeated on every call, even where nothing compiles."""
    with _events("jaxpr_trace") as names:
        yield names


@contextlib.contextmanager
def _events(kind: str) -> Iterator[list[str]]:
    names = []

    def listen(event, duration, fun_name="", **kwargs):
        names.extend([fun_name] if kind in event else [])

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
