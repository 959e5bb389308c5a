"""diffrax plumbing shared by `simulate` and `unroll_continuous`: the input checks and
the default step-size controller and adjoint."""

import diffrax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._checks import check_finite, check_option


def check_x0(x0: Array, state_dim: int, owner: str) -> Array:
    """`x0`, checked to have shape `(state_dim,)` (a `ValueError` naming `owner`, whose
    state it is) and to be finite."""
    if x0.shape != (state_dim,):
        raise ValueError(
            f"x0 has shape {x0.shape}, but {owner}'s state_dim is {state_dim}: expected "
            f"shape ({state_dim},)"
        )
    return check_finite("x0", x0)


def check_actions(
    actions: Array | np.ndarray, steps: int, action_dim: int, steps_name: str = "steps"
) -> Array:
    """`actions` as a JAX array, checked to have shape `(steps, action_dim)` and to be
    finite; the message calls `steps` by `steps_name` (the caller's argument)."""
    if actions.shape != (steps, action_dim):
        raise ValueError(
            f"actions has shape {actions.shape}, expected ({steps_name}, action_dim) = "
            f"{(steps, action_dim)}"
        )
    return check_finite("actions", jnp.asarray(actions))


def check_solve_options(solver: object, stepsize_controller: object, adjoint: object) -> None:
    """A `TypeError` naming the first option that is neither `None` nor an instance of
    its diffrax type."""
    check_option("solver", solver, diffrax.AbstractSolver)
    check_option("stepsize_controller", stepsize_controller, diffrax.AbstractStepSizeController)
    check_option("adjoint", adjoint, diffrax.AbstractAdjoint)


def default_controller(
    solver: diffrax.AbstractSolver,
    rtol: float,
    atol: float,
    fixed: diffrax.AbstractStepSizeController,
) -> diffrax.AbstractStepSizeController:
    """The step-size controller when none is given: `PIDController(rtol, atol)` for a
    solver with an error estimate, else `fixed` (e.g. Euler's fixed steps)."""
    if isinstance(solver, diffrax.AbstractAdaptiveSolver):
        return diffrax.PIDController(rtol=rtol, atol=atol)
    return fixed


def solve_adjoint(adjoint: diffrax.AbstractAdjoint | None) -> diffrax.AbstractAdjoint:
    """`adjoint`, or for `None` the default of `diffrax.diffeqsolve`,
    `RecursiveCheckpointAdjoint()` (reverse mode only)."""
    return diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint
