"""Atomic checkpoints: arrays via `eqx.tree_serialise_leaves` plus a JSON manifest."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import time
import uuid
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jax.experimental import multihost_utils
from jaxtyping import PRNGKeyArray, PyTree

from .._checks import IntLike, check_int, check_optional_int, check_path, short_repr

FORMAT = "lineax_seq.checkpoint/1"
ARRAYS = "arrays.eqx"
MANIFEST = "manifest.json"
CHECKPOINT_DIR = "checkpoints"  # the folder of a `train` run's `out_dir` holding them
_STEP_DIR = re.compile(r"^step_(\d{8,})$")
# Leaf paths, as `jax.tree_util.keystr` writes them, of the saved tree's PRNG key and
# optimiser state (the tree is `{"model": ..., "opt_state": ..., "key": ...}`).
_KEY_PATH = jtu.keystr((jtu.DictKey("key"),))
_OPT_STATE_PATH = jtu.keystr((jtu.DictKey("opt_state"),))


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt, or does not match the model."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The contents of a loaded checkpoint.

    **Fields:**

    - `path`: the checkpoint directory.
    - `step`: number of train steps taken when it was written.
    - `model`: the model.
    - `opt_state`: the optimiser state (`None` when loaded without a template).
    - `key`: the run's PRNG key.
    - `data_state`: the data iterator's state (JSON-compatible), or `None`.
    - `extra`: user metadata saved with it (JSON-compatible dict).
    """

    path: pathlib.Path
    step: int
    model: PyTree
    opt_state: PyTree
    key: PRNGKeyArray | None
    data_state: Any
    extra: dict


# ---------------------------------------------------------------- JSON of iterator states


def _to_json(x: Any) -> Any:
    if isinstance(x, bytes):
        return {"__bytes__": base64.b64encode(x).decode("ascii")}
    if isinstance(x, dict):
        return {str(k): _to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_json(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return {"__ndarray__": x.tolist(), "dtype": str(x.dtype)}
    return x


def _check_json(name: str, value: Any) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be JSON-compatible: {e}") from e


def _from_json(x: Any) -> Any:
    if isinstance(x, dict):
        if set(x) == {"__bytes__"}:
            return base64.b64decode(x["__bytes__"])
        if set(x) == {"__ndarray__", "dtype"}:
            return np.asarray(x["__ndarray__"], dtype=x["dtype"])
        return {k: _from_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_from_json(v) for v in x]
    return x


# ---------------------------------------------------------------- helpers


def _leaf_specs(tree: PyTree) -> list[dict]:
    """Path, shape and dtype of every leaf that `tree_serialise_leaves` writes."""
    specs = []
    for path, leaf in jtu.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)):
            specs.append(
                {"path": jtu.keystr(path), "shape": list(leaf.shape), "dtype": str(leaf.dtype)}
            )
        elif eqx.is_array_like(leaf):
            specs.append({"path": jtu.keystr(path), "shape": [], "dtype": type(leaf).__name__})
    return specs


def _leaf_like(spec: dict) -> jax.ShapeDtypeStruct | bool | int | float | complex:
    """A template that `tree_deserialise_leaves` reads the leaf of `spec` into (an entry
    of `_leaf_specs`: an array's shape and dtype, or a Python scalar's type)."""
    scalar = {"bool": False, "int": 0, "float": 0.0, "complex": 0j}.get(spec["dtype"])
    if scalar is not None:
        return scalar
    return jax.ShapeDtypeStruct(tuple(spec["shape"]), np.dtype(spec["dtype"]))


def _plain(value: Any) -> bool:
    """Whether `value` is a hyper-parameter the manifest can hold and compare: a bool,
    int, finite float, string or `None`, or a tuple / list of them."""
    if isinstance(value, tuple | list):
        return all(_plain(v) for v in value)
    if isinstance(value, float):
        return bool(np.isfinite(value))
    return value is None or isinstance(value, bool | int | str)


def _static_fields(tree: PyTree) -> dict[str, dict[str, Any]]:
    """The plain static fields (`eqx.field(static=True)`: sizes, windows, option
    strings...) of every module in `tree`, by the module's path: what the arrays do not
    record, but the computation depends on."""
    out: dict[str, dict[str, Any]] = {}

    def visit(path: tuple, node: eqx.Module) -> None:
        fields = {
            f.name: json.loads(json.dumps(getattr(node, f.name)))
            for f in dataclasses.fields(node)
            if f.metadata.get("static", False) and _plain(getattr(node, f.name, None))
        }
        if fields:
            out[jtu.keystr(path)] = fields
        is_child = lambda x: x is not node and isinstance(x, eqx.Module)
        for sub, child in jtu.tree_flatten_with_path(node, is_leaf=is_child)[0]:
            if is_child(child):
                visit(path + sub, child)

    is_module = lambda x: isinstance(x, eqx.Module)
    for path, leaf in jtu.tree_flatten_with_path(tree, is_leaf=is_module)[0]:
        if is_module(leaf):
            visit(path, leaf)
    return out


def _is_one_key(key: Any) -> bool:
    """Whether `key` is a single PRNG key: typed with shape `()`, or raw `uint32` `(n,)`
    (a batch of keys, or floats, would be saved and only fail at resume)."""
    if not isinstance(key, jax.Array | np.ndarray):
        return False
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key.shape == ()
    return key.dtype == np.uint32 and key.ndim == 1


def _key_impl(leaf: Any) -> str | None:
    """The implementation name of a typed PRNG key array (or of its
    `jax.ShapeDtypeStruct`), e.g. `"threefry2x32"`; `None` for any other leaf."""
    if not isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):
        return None
    if not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return None
    names = []
    jax.eval_shape(lambda k: names.append(str(jr.key_impl(k))), leaf)  # also when abstract
    return names[0]


def _unwrap_keys(tree: PyTree) -> tuple[PyTree, dict[str, str]]:
    """`tree` with every typed PRNG key leaf replaced by its raw `jax.random.key_data`
    (abstract for an abstract leaf), and the implementations of those leaves by path."""
    impls = {}

    def unwrap(path, leaf):
        impl = _key_impl(leaf)
        if impl is None:
            return leaf
        impls[jtu.keystr(path)] = impl
        if isinstance(leaf, jax.ShapeDtypeStruct):
            return jax.eval_shape(jr.key_data, leaf)
        return jr.key_data(leaf)

    return jtu.tree_map_with_path(unwrap, tree), impls


def _wrap_keys(tree: PyTree, impls: dict[str, str]) -> PyTree:
    """Inverse of `_unwrap_keys`: `jax.random.wrap_key_data` of the leaves in `impls`."""

    def wrap(path, leaf):
        impl = impls.get(jtu.keystr(path))
        return leaf if impl is None else jr.wrap_key_data(leaf, impl=impl)

    return jtu.tree_map_with_path(wrap, tree)


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


class _HashingWriter:
    def __init__(self, f):
        self.f = f
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, b) -> int:
        self.hash.update(b)
        self.size += len(b)
        return self.f.write(b)


def _host_tree(tree: PyTree) -> PyTree:
    """Bring every array to host memory (gathering shards across processes if needed)."""

    def get(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if not x.is_fully_replicated:
                return np.asarray(multihost_utils.process_allgather(x, tiled=True))
            return np.asarray(x.addressable_data(0))
        if isinstance(x, jax.Array):
            return np.asarray(x)
        return x

    return jax.tree.map(get, tree)


def _step_dirs(directory: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    if not directory.is_dir():
        return []
    out = []
    for p in directory.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def list_checkpoints(directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Checkpoint directories (`step_XXXXXXXX`) below `directory`, oldest first.

    **Arguments:**

    - `directory`: the directory given to [`lineax_seq.save_checkpoint`][], or a
        [`lineax_seq.train`][] run's `out_dir` (whose checkpoints are in its
        `checkpoints/` folder, read when `directory` itself holds none).

    **Returns:**

    A list of paths, sorted by step (empty if there are none).
    """
    directory = check_path("directory", directory)
    found = _step_dirs(directory)
    if not found:
        found = _step_dirs(directory / CHECKPOINT_DIR)
    return [p for _, p in found]


# ---------------------------------------------------------------- save


def save_checkpoint(
    directory: str | pathlib.Path,
    step: IntLike,
    *,
    model: PyTree,
    opt_state: PyTree = None,
    key: PRNGKeyArray | None = None,
    data_state: Any = None,
    extra: dict | None = None,
    keep: IntLike | None = 3,
) -> pathlib.Path:
    """Write a checkpoint atomically and keep only the last `keep`.

    The arrays (`eqx.tree_serialise_leaves` of model, optimiser state and key) and a
    JSON manifest (step, leaf paths/shapes/dtypes, SHA-256 of the arrays file, data
    iterator state, `extra`) are written into a temporary directory, fsync'ed, then
    renamed to `directory/step_XXXXXXXX` in one atomic step: a crash at any moment
    leaves either the complete new checkpoint or none, never a partial one. In a
    multi-process run every process must call this (sharded arrays are gathered),
    process 0 writes, and every process returns once the checkpoint is written.

    **Arguments:**

    - `directory`: where checkpoints live (created if needed).
    - `step`: the number of train steps taken.
    - `model`: the model (any PyTree; typed PRNG keys among its leaves are saved as
        their `jax.random.key_data` and restored as keys of the same implementation).
    - `opt_state`: the optimiser state.
    - `key`: the run's PRNG key (typed `jax.random.key` or raw `uint32` key).
    - `data_state`: the data iterator's `get_state()` (JSON-compatible; bytes and
        NumPy arrays allowed), or `None`.
    - `extra`: small JSON-compatible metadata (e.g. the config).
    - `keep`: number of most recent checkpoints to keep (`None`: keep all). Checkpoints
        of later steps than `step` (an abandoned continuation) are removed either way,
        so the one just written is always the latest.

    **Returns:**

    The path of the new checkpoint directory.
    """
    keep = check_optional_int("keep", keep)
    step = check_int("step", step, minimum=0)
    if key is not None and not _is_one_key(key):
        got = (
            f"dtype {key.dtype}, shape {key.shape}"
            if isinstance(key, jax.Array | np.ndarray)
            else short_repr(key)
        )
        raise ValueError(
            "key must be one jax.random.key (shape ()), one raw uint32 key (shape (n,)) "
            f"or None, got {got}."
        )
    # The metadata is checked before anything is written.
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(
            f"extra must be a dict (JSON-compatible) or None, got extra={extra!r} "
            f"({type(extra).__name__})"
        )
    _check_json("data_state", _to_json(data_state))
    _check_json("extra", extra or {})
    directory = check_path("directory", directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"directory={str(directory)!r} is a file, not a checkpoint directory.")
    tree, typed_keys = _unwrap_keys({"model": model, "opt_state": opt_state, "key": key})
    key_impl = typed_keys.pop(_KEY_PATH, None)
    tree = _host_tree(tree)
    if jax.process_index() != 0:
        _written(step)
        return directory / f"step_{step:08d}"

    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step_{step:08d}"
    tmp = directory / f".tmp-step_{step:08d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    with open(tmp / ARRAYS, "wb") as f:
        writer = _HashingWriter(f)
        eqx.tree_serialise_leaves(writer, tree)
        _fsync(f)
    manifest = {
        "format": FORMAT,
        "step": int(step),
        "time": time.time(),
        "arrays": ARRAYS,
        "bytes": writer.size,
        "sha256": writer.hash.hexdigest(),
        "key_impl": key_impl,
        "typed_keys": typed_keys,
        "leaves": _leaf_specs(tree),
        "static": _static_fields(tree),
        "data_state": _to_json(data_state),
        "extra": extra or {},
    }
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        _fsync(f)
    _fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): swap it out
        old = directory / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    _fsync_dir(directory)
    _prune(directory, step, keep)
    _written(step)
    return final


def _prune(directory: pathlib.Path, step: int, keep: int | None) -> None:
    """Remove the temporary directories of interrupted saves, the checkpoints after
    `step` and all but the `keep` latest up to it."""
    for p in directory.iterdir():
        if p.name.startswith((".tmp-step_", ".old-step_")) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
    # Later steps belong to an abandoned continuation (a run resumed from an earlier
    # checkpoint, e.g. past a corrupt one): the checkpoint just written is the latest.
    steps_dirs = _step_dirs(directory)
    for s, p in steps_dirs:
        if s > step:
            shutil.rmtree(p, ignore_errors=True)
    if keep is not None:
        kept = [p for s, p in steps_dirs if s <= step]
        for p in kept[:-keep]:
            shutil.rmtree(p, ignore_errors=True)


def _written(step: int) -> None:
    """In a multi-process run, wait until process 0 has written checkpoint `step`: the
    path every process returns exists then (another process loading it failed)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"lineax_seq.save_checkpoint: step {step}")


# ---------------------------------------------------------------- load


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _is_impl(x: Any) -> bool:
    """Whether `x` names a PRNG implementation (`"threefry2x32"`, `"rbg"`, ...)."""
    try:
        jax.eval_shape(lambda: jr.key(0, impl=x))
    except (TypeError, ValueError):
        return False
    return True


def _is_leaf_spec(x: Any) -> bool:
    return (
        isinstance(x, dict)
        and isinstance(x.get("path"), str)
        and isinstance(x.get("shape"), list)
        and all(_is_count(n) for n in x["shape"])
        and isinstance(x.get("dtype"), str)
    )


def _is_dtype(x: Any) -> bool:
    try:
        np.dtype(x)
    except TypeError:
        return False
    return True


# The manifest's fields: (check, what it must be). `typed_keys` may be missing (it came
# with typed PRNG keys inside the model; older manifests have none).
_MANIFEST_FIELDS: dict[str, tuple[Any, str]] = {
    "format": (lambda x: isinstance(x, str), "a string"),
    "step": (_is_count, "an integer >= 0"),
    "arrays": (
        lambda x: isinstance(x, str) and x not in ("", ".", "..") and pathlib.PurePath(x).name == x,
        "a file name in the checkpoint directory",
    ),
    "bytes": (_is_count, "an integer >= 0"),
    "sha256": (lambda x: isinstance(x, str), "a string"),
    "key_impl": (lambda x: x is None or _is_impl(x), "null or a PRNG implementation name"),
    "typed_keys": (
        lambda x: isinstance(x, dict) and all(_is_impl(v) for v in x.values()),
        "an object of PRNG implementation names",
    ),
    "leaves": (
        lambda x: isinstance(x, list) and all(_is_leaf_spec(s) for s in x),
        "a list of {path, shape, dtype} objects",
    ),
    "data_state": (lambda x: True, "JSON"),
    "extra": (lambda x: isinstance(x, dict), "an object"),
}


def _read_manifest(path: pathlib.Path) -> dict:
    """The manifest of the checkpoint at `path`, every field checked, `data_state`
    decoded; a `CheckpointError` for anything missing or damaged."""
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"Checkpoint {path}: manifest file {mpath} is missing.")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"Checkpoint manifest {mpath} is truncated or corrupt: {e}") from e
    corrupt = f"Checkpoint manifest {mpath} is corrupt: expected"
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{corrupt} a JSON object, got {type(manifest).__name__}.")
    manifest.setdefault("typed_keys", {})
    for name, (check, what) in _MANIFEST_FIELDS.items():
        if name not in manifest:
            raise CheckpointError(f"{corrupt} field {name!r} ({what}), which is missing.")
        if not check(manifest[name]):
            shown = repr(manifest[name])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise CheckpointError(f"{corrupt} field {name!r} to be {what}, got {shown}.")
    if manifest["format"] != FORMAT:
        raise CheckpointError(
            f"Checkpoint manifest {mpath} has format {manifest['format']!r}, expected {FORMAT!r}."
        )
    for spec in manifest["leaves"]:
        if spec["path"] == _KEY_PATH and not _is_dtype(spec["dtype"]):
            raise CheckpointError(f"{corrupt} a dtype for leaf {_KEY_PATH}, got {spec['dtype']!r}.")
    try:
        manifest["data_state"] = _from_json(manifest["data_state"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{corrupt} field 'data_state' to be an iterator state: {e}") from e
    return manifest


def _verify_arrays(path: pathlib.Path, manifest: dict) -> pathlib.Path:
    apath = path / manifest["arrays"]
    if not apath.is_file():
        raise CheckpointError(f"Checkpoint {path}: arrays file {apath} is missing.")
    size = apath.stat().st_size
    if size != manifest["bytes"]:
        raise CheckpointError(
            f"Checkpoint arrays file {apath} is truncated or corrupt: {size} bytes on disk, "
            f"{manifest['bytes']} expected."
        )
    h = hashlib.sha256()
    with open(apath, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != manifest["sha256"]:
        raise CheckpointError(
            f"Checkpoint arrays file {apath} is corrupt: its SHA-256 does not match the manifest."
        )
    return apath


def _check_structure(path: pathlib.Path, manifest: dict, like: PyTree) -> None:
    saved = manifest["leaves"]
    expected = _leaf_specs(like)
    mfile = path / MANIFEST
    saved_by_path = {s["path"]: s for s in saved}
    expected_by_path = {s["path"]: s for s in expected}
    for s in expected:
        other = saved_by_path.get(s["path"])
        if other is None:
            raise CheckpointError(
                f"Checkpoint {mfile} does not match the model/optimiser given: leaf "
                f"{s['path']} (shape {tuple(s['shape'])}) is not in the checkpoint."
            )
        if other["shape"] != s["shape"] or other["dtype"] != s["dtype"]:
            raise CheckpointError(
                f"Checkpoint {mfile} does not match the model/optimiser given: leaf "
                f"{s['path']} has shape {tuple(other['shape'])} dtype {other['dtype']} in "
                f"the checkpoint but shape {tuple(s['shape'])} dtype {s['dtype']} in the "
                "model/optimiser given."
            )
    for s in saved:
        if s["path"] not in expected_by_path:
            raise CheckpointError(
                f"Checkpoint {mfile} does not match the model/optimiser given: the "
                f"checkpoint has leaf {s['path']} (shape {tuple(s['shape'])}) that the "
                "model/optimiser given lacks."
            )
    if [s["path"] for s in saved] != [s["path"] for s in expected]:
        raise CheckpointError(
            f"Checkpoint {mfile} does not match the model/optimiser given: same leaves "
            "but in a different order."
        )


def _warn_static(path: pathlib.Path, saved: dict, given: dict) -> None:
    """Warn once, naming each one, about static fields of the templates' modules that
    differ from those saved: the arrays fit, but the model may compute differently (another
    window, another kernel option...; a setting only its initialisation read, such as
    `dt_min`, does not). Manifests from before this record have none."""
    changed = [
        f"{module}.{name}: {saved[module][name]!r} in the checkpoint, {value!r} given"
        for module, fields in given.items()
        if module in saved
        for name, value in fields.items()
        if name in saved[module] and saved[module][name] != value
    ]
    if changed:
        warnings.warn(
            f"Checkpoint {path / MANIFEST}: the model given differs from the saved one in "
            f"static fields (its arrays fit, but it may compute differently, unless only its "
            f"initialisation read them): {'; '.join(changed)}",
            stacklevel=3,
        )


def _given_numbers(path: pathlib.Path, loaded: PyTree, given: PyTree) -> PyTree:
    """`loaded` with the template's Python numbers (not arrays: e.g. `Dropout.p`, which
    training never changes) in place of the saved ones, as its static fields are; a
    warning names each one that differs (but the `inference` flags that
    `eqx.nn.inference_mode` sets)."""
    # NumPy scalars are saved as arrays (np.float64 is also a Python float).
    is_number = lambda x: (
        isinstance(x, bool | int | float | complex) and not isinstance(x, np.generic)
    )
    same = lambda a, b: a == b or (a != a and b != b)  # NaN is NaN
    changed = []

    def pick(key: tuple, saved: object, now: object) -> object:
        if not is_number(now):
            return saved
        flag = bool(key) and getattr(key[-1], "name", None) == "inference"
        if not same(saved, now) and not flag:
            changed.append(f"model{jtu.keystr(key)}: {saved!r} in the checkpoint, {now!r} given")
        return now

    tree = jtu.tree_map_with_path(pick, loaded, given)
    if changed:
        warnings.warn(
            f"Checkpoint {path / MANIFEST}: the model given differs from the saved one in "
            f"Python numbers (kept as given): {'; '.join(changed)}",
            stacklevel=3,
        )
    return tree


def _check_typed_keys(path: pathlib.Path, saved: dict, expected: dict) -> None:
    describe = lambda impl: "an array" if impl is None else f"a {impl} PRNG key"
    for leaf in sorted(set(saved) | set(expected)):
        if saved.get(leaf) != expected.get(leaf):
            raise CheckpointError(
                f"Checkpoint {path / MANIFEST} does not match the model/optimiser given: "
                f"leaf {leaf} is {describe(saved.get(leaf))} in the checkpoint but "
                f"{describe(expected.get(leaf))} in the model/optimiser given."
            )


def load_checkpoint(
    path: str | pathlib.Path,
    *,
    model: PyTree,
    opt_state: PyTree = None,
) -> Checkpoint:
    """Load and verify a checkpoint written by [`lineax_seq.save_checkpoint`][].

    The arrays file is checked against the manifest (size and SHA-256) and every leaf
    path, shape and dtype against the templates before anything is deserialised. Static
    fields of the templates' modules (sizes, windows, option strings: nothing the arrays
    record) that differ from the saved model's are named in a warning: the weights fit,
    but the model given may compute differently (a setting that only initialisation
    reads, such as a `dt_min` that a module keeps for its `config()`, does not).

    **Arguments:**

    - `path`: a checkpoint directory (`.../step_XXXXXXXX`), or the directory holding
        them (or a [`lineax_seq.train`][] run's `out_dir`), in which case the newest one
        is loaded.
    - `model`: a model of the same structure (values are ignored;
        `eqx.filter_eval_shape(Model, ...)` avoids allocating one). An array whose
        template is sharded over several devices (e.g. by [`lineax_seq.shard_params`][],
        or a `jax.ShapeDtypeStruct` with such a sharding) is loaded onto that sharding;
        the others onto the default device.
    - `opt_state`: an optimiser state of the same structure (placed likewise), or `None`
        to load the model only (a saved optimiser state is skipped; the result's
        `opt_state` is `None`).

    **Returns:**

    A [`lineax_seq.Checkpoint`][].

    **Raises:**

    [`lineax_seq.CheckpointError`][] naming the file and the problem when the
    checkpoint is missing, truncated, corrupt or of a different model shape.
    """
    path = check_path("path", path)
    if not _STEP_DIR.match(path.name):
        dirs = list_checkpoints(path)
        if not dirs:
            raise CheckpointError(f"No checkpoint (step_XXXXXXXX directory) found in {path}.")
        path = dirs[-1]
    if not path.is_dir():
        raise CheckpointError(f"Checkpoint directory {path} does not exist.")
    manifest = _read_manifest(path)
    return _load_verified(path, manifest, _verify_arrays(path, manifest), model, opt_state)


def _placed_like(f, like: object) -> object:
    """Deserialise one leaf (`eqx.default_deserialise_filter_spec`), straight onto the
    template's sharding where it spans several devices: each device gets its own shards
    (nothing is gathered on one device, and no process waits for another)."""
    sharding = getattr(like, "sharding", None)
    if (
        not isinstance(like, jax.Array | jax.ShapeDtypeStruct)
        or not isinstance(sharding, jax.sharding.Sharding)
        or isinstance(sharding, jax.sharding.SingleDeviceSharding)
    ):
        return eqx.default_deserialise_filter_spec(f, like)
    host = np.load(f)
    if host.dtype.kind == "V":  # how NumPy reads bfloat16 and the other ml_dtypes
        host = host.view(like.dtype)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _load_verified(
    path: pathlib.Path, manifest: dict, apath: pathlib.Path, model: PyTree, opt_state: PyTree
) -> Checkpoint:
    """`load_checkpoint` once the arrays file `apath` has been verified."""
    key_like = None
    for spec in manifest["leaves"]:
        if spec["path"] == _KEY_PATH:
            key_like = jax.ShapeDtypeStruct(tuple(spec["shape"]), np.dtype(spec["dtype"]))
    # Typed PRNG keys of the templates are compared as their raw key data.
    like, typed_keys = _unwrap_keys({"model": model, "opt_state": opt_state, "key": key_like})
    if opt_state is None:  # the model only: a saved optimiser state is read and dropped
        in_state = lambda leaf_path: leaf_path.startswith(_OPT_STATE_PATH)
        skipped = [_leaf_like(s) for s in manifest["leaves"] if in_state(s["path"])]
        checked = {
            "leaves": [s for s in manifest["leaves"] if not in_state(s["path"])],
            "typed_keys": {k: v for k, v in manifest["typed_keys"].items() if not in_state(k)},
        }
        read = {**like, "opt_state": skipped or None}
    else:
        checked, read = manifest, like
    _check_typed_keys(path, checked["typed_keys"], typed_keys)
    _check_structure(path, checked, like)
    if isinstance(manifest.get("static"), dict):
        _warn_static(path, manifest["static"], _static_fields(like))
    try:
        tree = eqx.tree_deserialise_leaves(apath, read, filter_spec=_placed_like)
        if opt_state is None:
            tree = {**tree, "opt_state": None}
    except Exception as e:  # defensive: hashes matched, so this is a format mismatch
        raise CheckpointError(f"Checkpoint arrays file {apath} could not be read: {e}") from e
    tree = {**tree, "model": _given_numbers(path, tree["model"], like["model"])}
    if manifest["key_impl"] is not None:
        typed_keys[_KEY_PATH] = manifest["key_impl"]
    tree = _wrap_keys(tree, typed_keys)
    return Checkpoint(
        path=path,
        step=manifest["step"],
        model=tree["model"],
        opt_state=tree["opt_state"],
        key=tree["key"],
        data_state=manifest["data_state"],
        extra=manifest["extra"],
    )


def load_latest_checkpoint(
    directory: str | pathlib.Path,
    *,
    model: PyTree,
    opt_state: PyTree = None,
) -> Checkpoint | None:
    """Load the newest intact checkpoint in `directory`, skipping corrupt ones.

    A truncated or corrupt checkpoint is skipped with a warning and the previous one
    is loaded; a checkpoint of a different model shape raises (an older one would not
    match either).

    **Arguments:**

    - `directory`: the directory given to [`lineax_seq.save_checkpoint`][], or a
        [`lineax_seq.train`][] run's `out_dir` (see [`lineax_seq.list_checkpoints`][]).
    - `model`, `opt_state`: templates, as for [`lineax_seq.load_checkpoint`][].

    **Returns:**

    A [`lineax_seq.Checkpoint`][], or `None` if the directory holds none.
    """
    for path in reversed(list_checkpoints(check_path("directory", directory))):
        try:
            manifest = _read_manifest(path)
            apath = _verify_arrays(path, manifest)
        except CheckpointError as e:
            warnings.warn(f"Skipping checkpoint: {e}", stacklevel=2)
            continue
        return _load_verified(path, manifest, apath, model, opt_state)
    return None
