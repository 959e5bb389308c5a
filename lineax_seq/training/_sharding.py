"""Meshes, data-parallel batches and tensor-parallel parameters with `jax.sharding`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import equinox as eqx
import jax
import jax.core
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import PyTree

from .._checks import IntLike, check_int, short_repr

DATA = "data"
MODEL = "model"


def make_mesh(
    data: IntLike | None = None,
    model: IntLike = 1,
    *,
    # (jax.Device is bound to a compiled class by assignment, which pyright reads as a variable)
    devices: Sequence[jax.Device] | None = None,  # pyright: ignore[reportInvalidTypeForm]
) -> Mesh:
    """A 2-D device mesh with axes `("data", "model")`.

    Works unchanged on one CPU, a GPU node, or many hosts: the mesh spans the global
    devices (`jax.devices()`, every process's devices after
    `jax.distributed.initialize`).

    **Arguments:**

    - `data`: size of the data-parallel axis; `None` uses all devices left over by
        `model`.
    - `model`: size of the tensor-parallel axis (dividing the number of devices when
        `data` is `None`).
    - `devices`: the devices to use, distinct `jax.Device`s (default: `jax.devices()`).

    **Returns:**

    A `jax.sharding.Mesh` with `Auto` axis types (the compiler propagates shardings).
    """
    devices = list(jax.devices()) if devices is None else _check_devices(devices)
    model = check_int("model", model)
    if data is None and len(devices) % model != 0:
        raise ValueError(
            f"model={model!r} must be a positive integer dividing the {len(devices)} devices "
            "(or pass data, to use data * model of them)."
        )
    data = len(devices) // model if data is None else check_int("data", data)
    if data * model > len(devices):
        raise ValueError(
            f"data={data!r} must be a positive integer with data * model <= "
            f"{len(devices)} devices (model={model})."
        )
    return jax.make_mesh(
        (data, model),
        (DATA, MODEL),
        axis_types=(AxisType.Auto, AxisType.Auto),
        devices=devices[: data * model],
    )


def _check_devices(devices: object) -> list[jax.Device]:  # pyright: ignore[reportInvalidTypeForm]
    """`devices` as a list, or an error naming it unless it is a non-empty sequence of
    distinct `jax.Device`s."""
    if isinstance(devices, str) or not isinstance(devices, Iterable):
        raise TypeError(
            "devices must be a sequence of jax.Device (e.g. jax.devices('cpu')), "
            f"got devices={short_repr(devices)}"
        )
    devices = list(devices)
    for i, device in enumerate(devices):
        if not isinstance(device, jax.Device):
            raise TypeError(
                "devices must be a sequence of jax.Device (e.g. jax.devices('cpu')), got "
                f"devices[{i}]={short_repr(device)}"
            )
    if not devices:
        raise ValueError("devices must hold at least one device, got devices=[]")
    if len(set(devices)) != len(devices):
        twice = next(d for i, d in enumerate(devices) if d in devices[:i])
        raise ValueError(f"devices must be distinct, got {twice!r} twice")
    return devices


def check_mesh(mesh: object, name: str = "mesh") -> None:
    """A `TypeError` naming `mesh` unless it is a `jax.sharding.Mesh`, and a `ValueError`
    if it has `Explicit` axes (`jax.make_mesh`'s default), which the sharding
    constraints here (on `Auto` axes) cannot refer to."""
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"{name} must be a jax.sharding.Mesh (e.g. from lineax_seq.make_mesh), "
            f"got {name}={short_repr(mesh)}"
        )
    types = zip(mesh.axis_names, mesh.axis_types, strict=True)
    explicit = [axis for axis, kind in types if kind == AxisType.Explicit]
    if explicit:
        raise ValueError(
            f"{name} has Explicit axes {explicit} (jax.make_mesh's default); lineax_seq "
            "shards over Auto axes: use lineax_seq.make_mesh, or jax.make_mesh(..., "
            "axis_types=(jax.sharding.AxisType.Auto,) * len(axis_names))"
        )


def _check_axis(mesh: Mesh, axis: str, name: str) -> None:
    check_mesh(mesh)
    if axis not in mesh.shape:
        raise ValueError(f"{name}={axis!r} is not an axis of the mesh {tuple(mesh.axis_names)}.")


def shard_batch(batch: PyTree, mesh: Mesh, *, axis: str = DATA) -> PyTree:
    """Put a batch on the mesh, split along its leading (batch) axis over `axis`.

    In a single process every leaf is the global batch; in a multi-process run every
    process passes its own slice of the global batch (e.g. from a grain pipeline
    sharded with `ShardByJaxProcess`) and the result is one global array built with
    `jax.make_array_from_process_local_data`; each shard of `axis` must then lie on
    one process's devices, and every process own as many shards (a `ValueError`
    otherwise). Scalars are replicated.

    **Arguments:**

    - `batch`: a PyTree of arrays whose leading axes are the (process-local) batch.
    - `mesh`: the mesh, e.g. from [`lineax_seq.make_mesh`][].
    - `axis`: the mesh axis to split the batch over.

    **Returns:**

    The batch as global `jax.Array`s sharded `PartitionSpec(axis)`.
    """
    _check_axis(mesh, axis, "axis")
    split = mesh.shape[axis]
    local_split = max(1, split // jax.process_count())
    if jax.process_count() > 1:
        _check_own_shards(mesh, axis)

    def put(path, leaf):
        x = _batch_leaf(path, leaf)
        if x.ndim == 0:
            return jax.device_put(x, NamedSharding(mesh, P()))
        if x.shape[0] % local_split != 0:
            raise ValueError(
                f"batch leaf {jax.tree_util.keystr(path)} has leading (batch) size "
                f"{x.shape[0]}, which is not divisible by the {local_split} local shards of "
                f"mesh axis {axis!r}."
            )
        sharding = NamedSharding(mesh, P(axis))
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        return jax.make_array_from_process_local_data(sharding, np.asarray(x))

    return jax.tree_util.tree_map_with_path(put, batch)


def _batch_leaf(path: tuple, leaf: object) -> jax.Array | np.ndarray:
    """A batch leaf as an array (a Python or NumPy number as a 0-d NumPy array), or a
    `TypeError` naming it if it is not numeric or bool (a string, an object)."""
    x = leaf if isinstance(leaf, jax.Array) else np.asarray(leaf)
    if isinstance(x, np.ndarray) and x.dtype.kind in "OSU":  # objects, bytes, strings
        raise TypeError(
            f"batch leaf {jax.tree_util.keystr(path)} must be a numeric or bool array, "
            f"got {short_repr(leaf)} (dtype {x.dtype}); drop it from the batch (e.g. a text "
            "field)"
        )
    return x


def batch_arrays(batch: PyTree) -> PyTree:
    """`batch` with every leaf an array (see `_batch_leaf`), so that a jitted step traces
    numbers instead of compiling anew for each value, and names a leaf it cannot take."""
    return jax.tree_util.tree_map_with_path(_batch_leaf, batch)


def _check_own_shards(mesh: Mesh, axis: str) -> None:
    """A `ValueError` unless every shard of `axis` lies on the devices of one process and
    every process owns as many shards: each passes its own slice of the batch, so a
    shared shard would need identical data from its processes, and a process without
    shards (or with more than its share) would make a wrong global batch."""
    owners = np.vectorize(lambda d: d.process_index, otypes=[int])(mesh.devices)
    by_shard = np.moveaxis(owners, mesh.axis_names.index(axis), 0).reshape(mesh.shape[axis], -1)
    fix = (
        f"use a mesh whose {axis!r} axis gives each of the {jax.process_count()} processes "
        "its own, equal share of shards (lineax_seq.make_mesh over all devices, with each "
        f"process's devices filling whole {axis!r} shards), or build the global batch "
        "yourself with jax.make_array_from_process_local_data"
    )
    for index, processes in enumerate(by_shard):
        if len(set(processes.tolist())) > 1:
            raise ValueError(
                f"shard {index} of mesh axis {axis!r} (size {mesh.shape[axis]}) spans "
                f"processes {sorted(set(processes.tolist()))}, but every process passes "
                f"its own slice of the batch: {fix}"
            )
    counts = np.bincount(by_shard[:, 0], minlength=jax.process_count())
    if len(set(counts.tolist())) > 1:
        raise ValueError(
            f"the {mesh.shape[axis]} shards of mesh axis {axis!r} fall {counts.tolist()} on "
            f"the processes, but every process passes its own slice of the batch: {fix}"
        )


def param_sharding(
    tree: PyTree, mesh: Mesh, *, axis: str = MODEL, min_shard_size: int = 2**16
) -> PyTree:
    """Shardings for a model (or optimiser state): large matrices over `axis`.

    Every array with at least two dimensions and `min_shard_size` elements is split over
    the mesh axis `axis` along its last dimension divisible by the axis size, never the
    first of three or more (the layer axis of stacked layers, e.g. BiGS's: a scan over
    layers would gather it whole on every device); everything else is replicated. For
    an `eqx.nn.Linear` weight `(out, in)` that is the input features when they divide
    evenly (Megatron's row-parallel split: XLA completes each product with an
    all-reduce of partial sums), else the output ones.
    The rule depends on shapes only, so it gives the same answer for a model and for
    Adam's moment estimates of it.

    **Arguments:**

    - `tree`: any PyTree (model, optimiser state), concrete or abstract (e.g. from
        `eqx.filter_eval_shape`, to build a model too large for one device directly
        sharded: with `abstract = eqx.filter_eval_shape(make_model)`, `arrays =
        jax.jit(lambda: eqx.filter(make_model(), eqx.is_array),
        out_shardings=param_sharding(abstract, mesh))()` and then
        `model = eqx.combine(arrays, abstract)`).
    - `mesh`: the mesh.
    - `axis`: the tensor-parallel mesh axis.
    - `min_shard_size`: arrays smaller than this are replicated.

    **Returns:**

    A PyTree of `NamedSharding`s with the structure of
    `eqx.filter(tree, eqx.is_array)` (non-arrays are `None`; `jax.ShapeDtypeStruct`s
    count as arrays).
    """
    _check_axis(mesh, axis, "axis")
    min_shard_size = check_int("min_shard_size", min_shard_size, minimum=0)
    n = mesh.shape[axis]

    def rule(x):
        if n > 1 and x.ndim >= 2 and x.size >= min_shard_size:
            for d in reversed(range(x.ndim >= 3, x.ndim)):
                if x.shape[d] % n == 0:
                    spec = [None] * x.ndim
                    spec[d] = axis
                    return NamedSharding(mesh, P(*spec))
        return NamedSharding(mesh, P())

    is_array = lambda x: eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)
    return jax.tree.map(rule, eqx.filter(tree, is_array))


def shard_params(
    tree: PyTree, mesh: Mesh, *, axis: str = MODEL, min_shard_size: int = 2**16
) -> PyTree:
    """Place (or, inside `jit`, constrain) a model or optimiser state on the mesh.

    Like `eqx.filter_shard(tree, param_sharding(tree, mesh, ...))` (`device_put`
    outside `jit`, a sharding constraint inside): large matrices split over `axis`,
    everything else replicated.

    **Arguments:**

    - `tree`: any PyTree (model, optimiser state).
    - `mesh`, `axis`, `min_shard_size`: as for [`lineax_seq.param_sharding`][].

    **Returns:**

    `tree` with its arrays sharded. As with `jax.device_put`, buffers already in place
    may be reused, not copied (an array on one device, replicated over the mesh, keeps
    its buffer on that device): a step that donates the result (as
    [`lineax_seq.make_train_step`][] does by default) then deletes them in `tree` too.
    Keep only the returned tree (`model = shard_params(model, mesh)`), or pass
    `donate=False` to the step.
    """
    shardings = param_sharding(tree, mesh, axis=axis, min_shard_size=min_shard_size)
    dynamic, static = eqx.partition(tree, eqx.is_array)
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(dynamic)):
        dynamic = jax.lax.with_sharding_constraint(dynamic, shardings)
    else:  # also valid across processes when every process holds the same values
        dynamic = jax.device_put(dynamic, shardings)
    return eqx.combine(dynamic, static)
