"""Windows of T+1 states (and T actions) over trajectory arrays, split by trajectory."""

from __future__ import annotations

import grain
import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, Float, jaxtyped

from .._checks import IntLike, RealLike, check_int
from ._loader import batch_examples, check_split


class _TrajectoryWindows:
    """Random-access source: window `i` -> trajectory `i // w`, start `(i % w) * stride`."""

    def __init__(self, states, actions, trajectories, length, stride):
        self.states, self.actions = states, actions
        self.trajectories, self.length, self.stride = trajectories, length, stride
        self.per_trajectory = (states.shape[1] - length - 1) // stride + 1

    def __len__(self) -> int:
        return len(self.trajectories) * self.per_trajectory

    def __getitem__(self, index):
        i = int(index)
        n = int(self.trajectories[i // self.per_trajectory])
        s = (i % self.per_trajectory) * self.stride
        out = {"states": self.states[n, s : s + self.length + 1].copy()}
        if self.actions is not None:
            out["actions"] = self.actions[n, s : s + self.length].copy()
        return out


def split_trajectories(
    num_trajectories: IntLike,
    split: str,
    *,
    valid_fraction: RealLike,
    test_fraction: RealLike,
    split_seed: IntLike = 0,
) -> np.ndarray:
    """Sorted indices of the trajectories in `split`.

    A fixed permutation (`np.random.default_rng(split_seed)`) puts the first
    `round(valid_fraction * N)` trajectories in `"valid"`, the next
    `round(test_fraction * N)` in `"test"` and the rest in `"train"`.

    **Arguments:**

    - `num_trajectories`: `N`, the number of trajectories (>= 0).
    - `split`: `"train"`, `"valid"`, `"test"` or `"all"`.
    - `valid_fraction`, `test_fraction`: the held-out fractions, each in `[0, 1)`,
        summing to less than 1.
    - `split_seed`: seed of the permutation (>= 0).

    **Returns:**

    Integer indices, shape `(num_in_split,)`, sorted.

    **Raises:**

    `ValueError` for bad arguments, and for a split that gets no trajectory.
    """
    num_trajectories = check_int("num_trajectories", num_trajectories, minimum=0)
    split_seed = check_int("split_seed", split_seed, minimum=0)
    check_split(split, valid_fraction, test_fraction)
    perm = np.random.default_rng(split_seed).permutation(num_trajectories)
    nv = int(round(valid_fraction * num_trajectories))
    nt = int(round(test_fraction * num_trajectories))
    parts = {"valid": perm[:nv], "test": perm[nv : nv + nt], "train": perm[nv + nt :]}
    chosen = perm if split == "all" else parts[split]
    if chosen.size == 0:
        raise ValueError(
            f"split={split!r} has no trajectories out of {num_trajectories} "
            f"(valid_fraction={valid_fraction}, test_fraction={test_fraction})"
        )
    return np.sort(chosen)


def _as_finite(name, x, num: int | None = None):
    """`x` as a NumPy array of its own (later changes to the caller's array do not reach
    it), or a `ValueError` naming it unless it holds finite floats of shape
    `(num, time, features)` (checked here as well as by the hints, which
    `JAXTYPING_DISABLE=1` turns off)."""
    x = np.array(jax.device_get(x))
    if x.ndim != 3 or not jnp.issubdtype(x.dtype, jnp.floating) or x.shape[2] == 0:
        raise ValueError(
            f"{name} must be a floating array of shape (num, time, features), features at "
            f"least 1, got shape {x.shape} and dtype {x.dtype}"
        )
    if num is not None and x.shape[0] != num:
        raise ValueError(
            f"{name} must hold one row per trajectory of states ({num}), got {name}.shape={x.shape}"
        )
    bad = ~np.isfinite(x)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name} contains {int(bad.sum())} non-finite values (NaN/inf), first at index "
            f"{where}: {x[where]}"
        )
    return x


@jaxtyped(typechecker=beartype)
def trajectory_windows(
    states: Float[np.ndarray, "num time state_dim"] | Float[Array, "num time state_dim"],
    actions: Float[np.ndarray, "num time_a action_dim"]
    | Float[Array, "num time_a action_dim"]
    | None = None,
    *,
    length: IntLike,
    stride: IntLike = 1,
    split: str = "train",
    valid_fraction: RealLike = 0.1,
    test_fraction: RealLike = 0.1,
    split_seed: IntLike = 0,
) -> grain.MapDataset:
    """Windows of `length + 1` consecutive states (and `length` actions) per trajectory.

    Window `(n, s)` is `states[n, s : s + T + 1]` with `actions[n, s : s + T]`, where
    action `t` drives the step from state `t` to state `t + 1`. Windows start every
    `stride` steps. Trajectories (not windows) are split into train/valid/test by
    [`lineax_seq.split_trajectories`][], so no trajectory is in two splits. Use
    `length = T_total - 1` for whole trajectories.

    **Arguments:**

    - `states`: `(N, T_total, d)` floats, all finite.
    - `actions`: optional `(N, T_total, m)` or `(N, T_total - 1, m)` floats, all finite.
    - `length`: `T`, the number of transitions per window (`1 <= T < T_total`).
    - `stride`: distance between window starts.
    - `split`, `valid_fraction`, `test_fraction`, `split_seed`: the trajectory split.

    **Returns:**

    A `grain.MapDataset` of `{"states": (T + 1, d)}` (plus `"actions": (T, m)`), in the
    arrays' dtype: fresh arrays cut from a copy of `states` / `actions` taken here, so
    neither later changes to those arrays nor in-place edits of an example reach the
    dataset.

    **Raises:**

    `ValueError` for NaN/inf values, a bad `length`/`stride`, mismatched `actions`, or
    an empty split.
    """
    states = _as_finite("states", states)
    total = states.shape[1]
    if actions is not None:
        actions = _as_finite("actions", actions, num=states.shape[0])
        if actions.shape[1] not in (total, total - 1):
            raise ValueError(
                f"actions must have T_total={total} or T_total - 1={total - 1} steps, got "
                f"actions.shape={actions.shape} for states.shape={states.shape}"
            )
    if isinstance(length, bool) or not 1 <= length <= total - 1:
        raise ValueError(
            f"length must be in [1, T_total - 1] = [1, {total - 1}] for states of shape "
            f"{states.shape}, got length={length}"
        )
    length = check_int("length", length)
    stride = check_int("stride", stride)
    trajectories = split_trajectories(
        states.shape[0],
        split,
        valid_fraction=valid_fraction,
        test_fraction=test_fraction,
        split_seed=split_seed,
    )
    return grain.MapDataset.source(
        _TrajectoryWindows(states, actions, trajectories, length, stride)
    )


@jaxtyped(typechecker=beartype)
def trajectory_dataset(
    states: Float[np.ndarray, "num time state_dim"] | Float[Array, "num time state_dim"],
    actions: Float[np.ndarray, "num time_a action_dim"]
    | Float[Array, "num time_a action_dim"]
    | None = None,
    *,
    length: IntLike,
    batch_size: IntLike,
    stride: IntLike = 1,
    split: str = "train",
    valid_fraction: RealLike = 0.1,
    test_fraction: RealLike = 0.1,
    split_seed: IntLike = 0,
    seed: IntLike = 0,
    shuffle: bool = True,
    num_epochs: IntLike | None = None,
    drop_remainder: bool = True,
    shard_options: grain.sharding.ShardOptions | None = None,
    num_workers: IntLike = 0,
    num_threads: IntLike = 0,
) -> grain.IterDataset:
    """Batches of trajectory windows: [`lineax_seq.trajectory_windows`][] +
    [`lineax_seq.batch_examples`][].

    **Arguments:** as for those two functions.

    **Returns:**

    A `grain.IterDataset` of `{"states": (B, T + 1, d)}` (plus `"actions": (B, T, m)`).
    """
    windows = trajectory_windows(
        states,
        actions,
        length=length,
        stride=stride,
        split=split,
        valid_fraction=valid_fraction,
        test_fraction=test_fraction,
        split_seed=split_seed,
    )
    return batch_examples(
        windows,
        batch_size=batch_size,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        shard_options=shard_options,
        num_workers=num_workers,
        num_threads=num_threads,
    )
