"""`lineax_seq.systems`: the chapter-1 dynamical systems and their simulation.

Vector fields with the paper's parameters and initial-condition samplers (section
1.4.1), a torque-controlled pendulum for the control path, and `simulate` /
`sample_trajectories` (diffrax, adaptive Runge-Kutta at tight tolerance).
"""

from ._simulate import sample_trajectories, simulate
from ._systems import (
    SYSTEMS,
    ControlledPendulum,
    Duffing,
    DynamicalSystem,
    Lorenz63,
    LotkaVolterra,
    ParabolicAttractor,
    Pendulum,
    get_system,
)

__all__ = [
    "SYSTEMS",
    "ControlledPendulum",
    "Duffing",
    "DynamicalSystem",
    "Lorenz63",
    "LotkaVolterra",
    "ParabolicAttractor",
    "Pendulum",
    "get_system",
    "sample_trajectories",
    "simulate",
]
