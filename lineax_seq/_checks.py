"""Input checks shared across subpackages."""

import functools
import math
import numbers
import os
import pathlib
from typing import Literal, TypeGuard, overload

import equinox.internal as eqxi
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from jaxtyping import Array, Real

RealLike = float | int
"""Hint of a real-valued argument: a `float` or an `int` (PEP 484's numeric tower),
written out so that every checker accepts `0` for a `float`, plain `beartype` (as the
test suite's jaxtyping import hook runs it) included."""

IntLike = int | np.integer
"""Hint of an integer argument: a Python or a NumPy integer. A `bool` passes it too (it
is an `int`): validate the value with `check_int`, which rejects bools."""

RealScalar = RealLike | np.integer | np.floating | Real[Array, ""]
"""Hint of a real number argument: a Python, NumPy or JAX real scalar. A `bool` passes it
too (it is an `int`): validate the value with `check_real`, which rejects bools."""

_SIGNS = {
    "positive": "a positive, finite",
    "nonnegative": "a finite, non-negative",
    "finite": "a finite",
}


def real_scalar(value: object) -> float | None:
    """`value` as a `float` if it is a real scalar (a Python or NumPy number, or a
    concrete 0-d JAX array of an integer or floating dtype; not a bool), else `None`."""
    if isinstance(value, jax.core.Tracer):
        return None
    array = np.asarray(value)
    dtype = array.dtype
    real = array.shape == () and (
        jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)
    )
    return float(array) if real else None


def check_real(name: str, value: object, sign: str = "positive") -> float:
    """`value` as a `float`, or a `ValueError` naming it: a real scalar (a Python or NumPy
    number or a concrete JAX scalar; not a bool), finite, and `> 0` (`sign="positive"`),
    `>= 0` (`"nonnegative"`) or of any sign (`"finite"`)."""
    expected = f"{_SIGNS[sign]} real number"
    if isinstance(value, jax.core.Tracer):
        raise ValueError(
            f"{name} must be {expected} known when tracing (a Python or NumPy number, not "
            f"a jit argument), got {name}={value}"
        )
    number = real_scalar(value)
    number = math.nan if number is None else number
    signed = {"positive": number > 0, "nonnegative": number >= 0, "finite": True}[sign]
    if not (math.isfinite(number) and signed):
        raise ValueError(f"{name} must be {expected}, got {name}={value!r}")
    return number


def as_arrays(
    first: Array | np.ndarray, *rest: Array | np.ndarray | None
) -> tuple[Array, *tuple[Array | None, ...]]:
    """`jnp.asarray` of each argument, `None` kept (after the first, which is required):
    the runtime-checked entry points take NumPy inputs (e.g. a tokenizer's ids), as
    Equinox's layers do."""
    return (jnp.asarray(first), *(None if a is None else jnp.asarray(a) for a in rest))


def short_repr(value: object, width: int = 40) -> str:
    """`repr(value)`, cut to `width` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


@overload
def as_array(name: str, a: object, *, optional: Literal[False] = False) -> Array: ...
@overload
def as_array(name: str, a: object, *, optional: bool) -> Array | None: ...
def as_array(name: str, a: object, *, optional: bool = False) -> Array | None:
    """`jnp.asarray(a)` for a JAX or NumPy array (and `None` kept, if `optional`), else a
    `TypeError` naming it: what the `Float[Array | np.ndarray, ...]` hints promise, also
    where jaxtyping's checks are off (a list or `None` would fail deep inside, by an
    attribute the error does not name)."""
    if a is None and optional:
        return None
    if not isinstance(a, jax.Array | np.ndarray):
        expected = "a JAX or NumPy array" + (" or None" if optional else "")
        raise TypeError(f"{name} must be {expected}, got {name}={short_repr(a)}")
    return jnp.asarray(a)


def check_key(name: str, key: object) -> None:
    """A `TypeError` naming `key` unless it is one PRNG key: a typed key of
    `jax.random.key` (shape `()`) or a raw `uint32` key of `jax.random.PRNGKey`
    (1-d)."""
    if not isinstance(key, jax.Array | np.ndarray):
        got = f"{name}={short_repr(key)}"
    elif jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.ndim == 0:
        return
    elif key.dtype == np.uint32 and key.ndim == 1:
        return
    else:
        got = f"an array of shape {key.shape} and dtype {key.dtype}"
    raise TypeError(
        f"{name} must be one JAX PRNG key, jax.random.key(seed) (or a raw uint32 key of "
        f"jax.random.PRNGKey), got {got}"
    )


def check_instance(name: str, value: object, *classes: type) -> None:
    """A `TypeError` naming `name` unless `value` is an instance of one of `classes`."""
    if not isinstance(value, classes):
        expected = " or ".join(cls.__name__ for cls in classes)
        raise TypeError(
            f"{name} must be an instance of {expected}, got an instance of {type(value).__name__}"
        )


def check_option(name: str, value: object, cls: type) -> None:
    """A `TypeError` naming the option `name` (a diffrax solver, controller...) unless it
    is `None` or an instance of `cls`."""
    if value is not None and not isinstance(value, cls):
        module = cls.__module__.split(".")[0]
        raise TypeError(
            f"{name} must be None or an instance of {module}.{cls.__name__}, got "
            f"{name}={short_repr(value)}"
        )


@overload
def host_arrays(
    first: ArrayLike, /, *rest: ArrayLike | None
) -> tuple[Array | np.ndarray, *tuple[Array | np.ndarray | None, ...]]: ...
@overload
def host_arrays(*arrays: ArrayLike | None) -> tuple[Array | np.ndarray | None, ...]: ...
def host_arrays(*arrays: ArrayLike | None) -> tuple[Array | np.ndarray | None, ...]:
    """Each argument as an array without converting it to JAX: NumPy inputs (and Python
    scalars or lists) become NumPy arrays, JAX arrays and `None` are kept. Integer ids are
    range-checked in this form: `jnp.asarray` would wrap int64 ids into int32 silently
    when JAX runs in 32 bits (its default)."""
    return tuple(a if a is None or isinstance(a, jax.Array) else np.asarray(a) for a in arrays)


def _on_host(*arrays: Array | np.ndarray | None) -> bool:
    """Whether `arrays` can be read here: none traced, all on this process's devices."""
    return all(
        not isinstance(a, jax.core.Tracer) and getattr(a, "is_fully_addressable", True)
        for a in arrays
        if a is not None
    )


def _first(name: str, bad: np.ndarray | np.bool_) -> tuple[tuple[int, ...], str] | None:
    """The index of the first True of `bad` and its text `name[i, j]`, or `None`."""
    if not bad.any():  # (np.argwhere of a 0-d array is empty even where it is True)
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return index, f"{name}[{', '.join(map(str, index))}]"


def _raise(pred: Array | np.ndarray, *, message: str) -> None:
    if np.any(pred):
        raise ValueError(message)


TRACED_CHECKS = os.environ.get("EQX_ON_ERROR", "raise") not in ("nan", "off")
"""Whether `fail_if` checks traced values. Off with the environment variable
`EQX_ON_ERROR=nan` or `off`, read at import as Equinox reads it for its own checks
(whose `nan` and `off` modes hold no host callback either): then programs hold no
callback, e.g. for `jax.export`, and bad traced input goes unreported."""


def fail_if(pred: ArrayLike, message: str) -> None:
    """Raise `ValueError(message)` if any element of `pred` is true: at once if `pred`
    is concrete once reduced over `vmap` (eager calls), else at run time (an effect, like
    `jax.debug.print`: nothing needs to use a returned value).

    Mesh-safe, unlike `eqx.error_if`: that check's callback runs on one device, so when
    it raises, the other devices wait in their next collective until XLA aborts the
    process. Here `pred` is reduced over `vmap`, `shard_map` and mesh axes first, and
    every device raises. Under `jit` the error surfaces as a `jax.errors.JaxRuntimeError`
    whose message ends with `ValueError: message`. Where dispatch is asynchronous (GPU,
    TPU), a `jax.jit` call may return before the check runs: the error is raised once
    the result is read or awaited, or else by a later call that waits on the device (a
    top-level `eqx.filter_jit` call awaits its results, so it raises itself).

    A traced check is a host callback, which `jax.export` cannot serialise: see
    `TRACED_CHECKS` (concrete checks always raise)."""
    with jax.ensure_compile_time_eval():  # eager `vmap`: the reduced `pred` is concrete
        pred = jnp.any(eqxi.unvmap_any(jnp.asarray(pred)))
    if not isinstance(pred, jax.core.Tracer):
        if pred:
            raise ValueError(message)
        return
    if not TRACED_CHECKS:
        return
    manual = tuple(jax.sharding.get_abstract_mesh().manual_axes)
    if manual:  # under `shard_map` each device holds its own part of `pred`
        pred = jax.lax.pmax(pred.astype(jnp.int32), manual) > 0
    callback = functools.partial(_raise, message=message)
    jax.lax.cond(pred, lambda: jax.debug.callback(callback, pred, partitioned=True), lambda: None)


def check_real_traced(*checks: tuple[str, Array, str]) -> None:
    """`check_real` for traced values (parameters given as `jit` arguments, or batches of
    them under `vmap`), each a `(name, value, sign)`: a real dtype now, and finite, of
    that sign, at run time, every entry of an array; one `fail_if` for all of them."""
    bad = []
    for name, value, sign in checks:
        if not any(jnp.issubdtype(value.dtype, kind) for kind in (jnp.floating, jnp.integer)):
            raise ValueError(
                f"{name} must be {_SIGNS[sign]} real number, got a traced array of dtype "
                f"{value.dtype}"
            )
        signed = {"positive": value > 0, "nonnegative": value >= 0, "finite": True}[sign]
        bad.append(jnp.any(~(jnp.isfinite(value) & signed)))
    if bad:
        wanted = "; ".join(f"{name} must be {_SIGNS[sign]} real number" for name, _, sign in checks)
        fail_if(functools.reduce(jnp.logical_or, bad), f"{wanted} (traced, checked at run time)")


def check_real_or_traced(name: str, value: object, sign: str = "positive") -> float | Array:
    """`check_real` of a concrete `value` (a `float`), or `check_real_traced` of a traced
    one (returned as it is, checked at run time)."""
    if isinstance(value, jax.core.Tracer):
        check_real_traced((name, value, sign))
        return value
    return check_real(name, value, sign)


def check_mask_dtype(mask: Array | np.ndarray | None) -> None:
    """A `TypeError` unless `mask` (if given) is boolean: a float mask, e.g. an additive
    one (0 where tokens are kept), would be read as `True` wherever it is non-zero."""
    if mask is not None and mask.dtype != np.bool_:
        raise TypeError(f"mask must be boolean (True at real tokens), got mask.dtype={mask.dtype}")


def check_trailing_mask(mask: Array | np.ndarray | None) -> None:
    """A `ValueError` unless `mask` (a boolean `(length,)` array or `None`) is trailing
    padding: `True` at the real tokens, then `False` to the end. At once, naming the first
    real token after a pad, if `mask` is concrete, else at run time ([`fail_if`][])."""
    expected = "mask must be trailing padding (True at real tokens, then False to the end)"
    if mask is None:
        return
    if not _on_host(mask):
        fail_if(mask[1:] & ~mask[:-1], expected)
        return
    host = np.asarray(mask).astype(bool)
    first = _first("mask", host[1:] & ~host[:-1])
    if first is not None:
        (i,), _ = first
        raise ValueError(f"{expected}, got mask[{i}]=False before mask[{i + 1}]=True")


def check_finite(name: str, a: Array) -> Array:
    """`a`, checked to hold no NaN or inf: at once if it is concrete, else at run time
    ([`fail_if`][])."""
    if not _on_host(a):
        fail_if(~jnp.isfinite(a), f"{name} contains NaN or inf values, expected finite values")
        return a
    host = np.asarray(a)
    bad = ~np.isfinite(host)
    first = _first(name, bad)
    if first is not None:
        index, at = first
        raise ValueError(
            f"{name} contains NaN or inf values ({int(bad.sum())} of {host.size}; the first "
            f"is {at} = {host[index]}), expected finite values"
        )
    return a


def check_float_dtype(name: str, a: Array | np.ndarray | None) -> None:
    """A `TypeError` naming `name` unless `a` (if given) has a real floating dtype (an
    integer or complex input would compute silently in the wrong type)."""
    if a is not None and not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(f"{name} must have a real floating dtype, got {name}.dtype={a.dtype}")


@overload
def as_float_array(name: str, a: object, *, optional: Literal[False] = False) -> Array: ...
@overload
def as_float_array(name: str, a: object, *, optional: bool) -> Array | None: ...
def as_float_array(name: str, a: object, *, optional: bool = False) -> Array | None:
    """[`as_array`][], then [`check_float_dtype`][]."""
    a = as_array(name, a, optional=optional)
    check_float_dtype(name, a)
    return a


def check_state_control(
    state: tuple[str, object, int], control: tuple[str, object, int], owner: str
) -> tuple[Array, Array | None]:
    """A state of shape `(dim,)` and a control of shape `(control_dim,)`, or `None`
    exactly when `control_dim == 0` (`owner` is autonomous); each given as
    `(name, value, dim)`, a JAX or NumPy array of a real floating dtype. Returns both as
    JAX arrays."""
    name, x, dim = state
    x = as_float_array(name, x)
    if x.shape != (dim,):
        raise ValueError(f"{name} must have shape ({dim},), got {name}.shape={x.shape}")
    name, c, dim = control
    c = as_float_array(name, c, optional=True)
    if dim == 0 and c is not None:
        raise ValueError(f"{owner} is autonomous: pass {name}=None, got {name}.shape={c.shape}")
    if dim > 0 and (c is None or c.shape != (dim,)):
        got = f"{name}=None" if c is None else f"{name}.shape={c.shape}"
        raise ValueError(f"{name} must have shape ({dim},) (the {owner}'s control), got {got}")
    return x, c


def _is_int(value: object, minimum: int) -> TypeGuard[numbers.Integral]:
    return (
        not isinstance(value, bool)
        and isinstance(value, numbers.Integral)
        and int(value) >= minimum
    )


def _int_kind(minimum: int) -> str:
    return "a positive integer" if minimum == 1 else f"an integer >= {minimum}"


def _int_error(name: str, value: object, kind: str) -> ValueError:
    if isinstance(value, jax.Array):  # concrete or traced: either way not a static size
        return ValueError(
            f"{name} must be {kind} known when the program is traced (a Python or NumPy "
            f"int: it fixes array shapes), got a JAX array {name}={value!r}; pass "
            "int(...) outside jit, or mark it static"
        )
    return ValueError(f"{name} must be {kind}, got {name}={value!r}")


def check_int(name: str, value: object, minimum: int = 1) -> int:
    """`value` as an `int` (NumPy integers accepted, bools and JAX arrays not),
    `>= minimum`, or a `ValueError` naming it."""
    if not _is_int(value, minimum):
        raise _int_error(name, value, _int_kind(minimum))
    return int(value)


def check_choice(name: str, value: object, allowed: tuple) -> None:
    """A `ValueError` naming `name` unless `value` is one of the options `allowed`."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {name}={value!r}")


def check_bool(name: str, value: object) -> bool:
    """`value` if it is a Python `bool`, else a `TypeError` naming it (a truthy string or
    an integer is not a flag)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {name}={value!r}")
    return value


def check_path(name: str, value: object) -> pathlib.Path:
    """`value` as a `pathlib.Path` if it is a `str` or `os.PathLike`, else a `TypeError`
    naming it (`pathlib` names neither the argument nor its value)."""
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {name}={value!r}")
    return pathlib.Path(value)


def check_optional_int(name: str, value: object, minimum: int = 1) -> int | None:
    """`None`, or `value` as an `int` as for `check_int`."""
    if value is None:
        return None
    if not _is_int(value, minimum):
        raise _int_error(name, value, f"None or {_int_kind(minimum)}")
    return int(value)


def check_ids(
    name: str,
    ids: Array | np.ndarray,
    upper: int,
    upper_name: str,
    where: Array | np.ndarray | None = None,
) -> Array | np.ndarray:
    """`ids` (an integer array), checked to lie in `[0, upper)` (at the positions where
    `where` is True, if given): at once with the first offending id and its position if
    `ids` is concrete, else at run time ([`fail_if`][]). Compared in at least int32, so
    narrow dtypes (`uint8` cannot hold 256) do not wrap the bound."""
    expected = f"{name}: ids must be in [0, {upper_name}={upper})"
    if where is not None and where.shape != ids.shape:
        raise ValueError(f"the mask of {name} must have its shape {ids.shape}, got {where.shape}")
    if _on_host(ids, where):
        host = np.asarray(ids)  # compared in its own type: no wrapping, uint64 included
        bad = (host < 0) | (host >= upper)
        if where is not None:
            bad &= np.asarray(where).astype(bool)
        first = _first(name, bad)
        if first is not None:
            index, at = first
            raise ValueError(f"{expected}, got id {host[index]}{f' at {at}' if index else ''}")
        return ids
    signed = ids.dtype in (jnp.int32, jnp.int64)
    wide = ids if signed else ids.astype(jax.dtypes.canonicalize_dtype(jnp.int64))
    bad = (wide < 0) | (wide >= upper)
    fail_if(bad if where is None else bad & where.astype(bool), expected)
    return ids
