"""Input checks shared across subpackages."""

import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array


def check_finite(name: str, a: Array) -> Array:
    """`a`, checked to hold no NaN or inf: at once if it is concrete, else at run time
    (`eqx.error_if`, so the returned array must be the one used)."""
    if isinstance(a, jax.core.Tracer):
        return eqx.error_if(a, ~jnp.all(jnp.isfinite(a)), f"{name} contains NaN or inf values")
    host = np.asarray(a)
    bad = np.argwhere(~np.isfinite(host))
    if bad.size:
        index = tuple(int(i) for i in bad[0])
        where = ", ".join(map(str, index))
        raise ValueError(
            f"{name} contains NaN or inf values ({bad.shape[0]} of {host.size}; the first is "
            f"{name}[{where}] = {host[index]}), expected finite values"
        )
    return a


def check_state_control(
    state: tuple[str, Array, int], control: tuple[str, Array | None, int], owner: str
) -> None:
    """A state of shape `(dim,)` and a control of shape `(control_dim,)`, or `None`
    exactly when `control_dim == 0` (`owner` is autonomous); each given as
    `(name, value, dim)`."""
    name, x, dim = state
    if x.shape != (dim,):
        raise ValueError(f"{name} must have shape ({dim},), got {name}.shape={x.shape}")
    name, c, dim = control
    if dim == 0 and c is not None:
        raise ValueError(f"{owner} is autonomous: pass {name}=None, got {name}.shape={c.shape}")
    if dim > 0 and (c is None or c.shape != (dim,)):
        got = f"{name}=None" if c is None else f"{name}.shape={c.shape}"
        raise ValueError(f"{name} must have shape ({dim},) (the {owner}'s control), got {got}")


def check_int(name: str, value: object, minimum: int = 1) -> int:
    """`value` as an `int` (NumPy integers accepted, bools not), `>= minimum`, or a
    `ValueError` naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {kind}, got {name}={value!r}")
    return int(value)
