"""The train loop: progress bar, JSONL metrics, evaluation, checkpoints and resuming."""

from __future__ import annotations

import dataclasses
import functools as ft
import json
import math
import os
import pathlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import equinox as eqx
import grain
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, PRNGKeyArray, PyTree

if TYPE_CHECKING:  # imported where it plots: `import lineax_seq` loads no matplotlib
    from matplotlib.figure import Figure

from .._checks import (
    IntLike,
    check_bool,
    check_choice,
    check_int,
    check_key,
    check_optional_int,
    check_path,
    short_repr,
)
from ._checkpoint import (
    CHECKPOINT_DIR,
    list_checkpoints,
    load_latest_checkpoint,
    save_checkpoint,
)
from ._sharding import shard_batch, shard_params
from ._step import (
    UNITS,
    LossFn,
    _check_callable,
    _check_optimizer,
    _check_train_mesh,
    _indexed_train_step,
    _init,
    make_eval_step,
)

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "curves.png"


class NonFiniteError(FloatingPointError):
    """A training or evaluation quantity became NaN or infinite."""


def _iterable(x: object) -> bool:
    """Whether `iter(x)` can work, without calling it (a grain dataset may start workers)."""
    return hasattr(type(x), "__iter__") or hasattr(type(x), "__getitem__")


@dataclasses.dataclass
class TrainResult:
    """What [`lineax_seq.train`][] returns.

    **Fields:**

    - `model`: the trained model.
    - `opt_state`: the final optimiser state.
    - `step`: the number of train steps taken (including those before a resume).
    - `key`: the run's PRNG key.
    - `history`: every metrics record (dicts with `"step"`, `"split"` (`"train"` or
        `"eval"`), `"loss"`, ...), as also written to `metrics.jsonl`.
    - `resumed_from`: the step of the checkpoint the run resumed from, or `None`.
    """

    model: PyTree
    opt_state: PyTree
    step: int
    key: PRNGKeyArray
    history: list[dict]
    resumed_from: int | None = None


def _host(x: Any) -> float:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_data(0)
    return float(np.asarray(x))


def _schedule_count(opt_state: PyTree) -> Array | None:
    """The update count the optimiser's schedules read (the first
    `optax.ScaleByScheduleState` in `opt_state`), or `None` if it has none. It counts the
    updates of an `opt_state` passed in from an earlier run too, and an accumulating
    optimiser's updates (not its micro-batches)."""
    is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
    states = jax.tree.leaves(opt_state, is_leaf=is_schedule)
    return next((x.count for x in states if is_schedule(x)), None)


def _count(batch: Any, unit: str) -> int:
    """The leading size of the batch's first leaf (`"samples"`), or the largest product of
    a leaf's first two dimensions (`"tokens"`: a `(B, L)` token array; a classification
    batch's first leaf, in key order, is its `(B,)` labels)."""
    shapes = [np.shape(x) for x in jax.tree.leaves(batch)]
    if not shapes:
        return 0
    samples = int(shapes[0][0]) if shapes[0] else 1
    sequences = [int(s[0]) * int(s[1]) for s in shapes if len(s) >= 2]
    return max(sequences) if unit == "tokens" and sequences else samples


def _read_jsonl(path: pathlib.Path, max_step: float | int) -> list[dict]:
    """Records with step <= max_step; a line cut short by a crash is dropped."""
    records = []
    if not path.is_file():
        return records
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and r.get("step", math.inf) <= max_step:
            records.append(r)
    return records


def _rewrite_jsonl(path: pathlib.Path, records: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _Stateful(Protocol):
    """An iterator that saves and restores its position, as grain's do."""

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


class _DataIterator:
    """Wraps any iterable; checkpoints grain iterators exactly, others by replay."""

    def __init__(self, data: Iterable):
        self.it: Iterator = iter(data)
        self.one_shot = self.it is data  # an iterator, not a re-iterable
        self.consumed = 0
        stateful = hasattr(self.it, "get_state") and hasattr(self.it, "set_state")
        self.stateful = cast(_Stateful, self.it) if stateful else None

    def __next__(self):
        batch = next(self.it)
        self.consumed += 1
        return batch

    def get_state(self) -> dict:
        if self.stateful is not None:
            return {"grain": self.stateful.get_state(), "consumed": self.consumed}
        return {"consumed": self.consumed}

    def set_state(self, state: dict) -> None:
        if self.stateful is not None:
            if "grain" not in state:
                raise ValueError("the checkpoint holds no grain iterator state for `data`.")
            saved, now = _layout(state["grain"]), _layout(self.stateful.get_state())
            if saved != now:
                raise ValueError(
                    "the data pipeline's layout changed since the checkpoint (e.g. another "
                    f"num_workers): its iterator state has the layout {saved}, but `data` "
                    f"now has {now}. Resume with the pipeline the run was started with."
                )
            self.stateful.set_state(state["grain"])
            self.consumed = state["consumed"]
            return
        if self.one_shot and state["consumed"] > self.consumed:
            warnings.warn(
                f"Resuming: `data` is an iterator, whose next {state['consumed']} batches "
                "are skipped to replay the checkpoint's run; that is right only if it "
                "starts where the run started (a fresh one, not one an interrupted run "
                "advanced: pass a re-iterable, e.g. a list or a grain dataset, to be safe).",
                stacklevel=4,
            )
        for _ in range(state["consumed"] - self.consumed):  # replay a plain iterator
            try:
                next(self)
            except StopIteration:
                raise ValueError(
                    f"`data` ran out after {self.consumed} batches while replaying the "
                    f"{state['consumed']} the checkpoint's run had taken: resume with the "
                    "data the run was started with."
                ) from None


def _layout(state: Any) -> Any:
    """The layout of a grain iterator state: its keys and the lengths of its lists (one
    entry per worker with `num_workers > 0`), without the positions."""
    if not isinstance(state, Mapping):
        return type(state).__name__
    return {k: len(v) if isinstance(v, list | tuple) else None for k, v in state.items()}


def _repeats_forever(data: Any) -> bool:
    """Whether `data` is a grain dataset that repeats forever, e.g. a
    `lineax_seq.*_dataset` with the default `num_epochs=None`: a first map dataset
    reached through `parents` (or `mp_prefetch`'s per-worker datasets) has a length no
    finite data has (`repeat(None)` gives `sys.maxsize`, its batches half that)."""
    todo = [data]
    while todo:
        node = todo.pop()
        if isinstance(node, grain.MapDataset):  # its length says it all: stop here
            if len(node) > 2**40:
                return True
        elif isinstance(node, grain.IterDataset):
            todo.extend(node.parents)
            todo.extend(getattr(node, "_datasets", ()))  # `mp_prefetch` hides them here
    return False


def _restore(
    out: pathlib.Path,
    resume: bool,
    model: PyTree,
    opt_state: PyTree,
    key: PRNGKeyArray,
    steps: int,
    it: _DataIterator,
    is_main: bool,
) -> tuple[PyTree, PyTree, PRNGKeyArray, int, int | None, list[dict]]:
    """The run `out` holds: `(model, opt_state, key, start, resumed_from, history)` from
    its latest checkpoint (and `it` moved to that checkpoint's data position), or the
    arguments, step 0 and no history when it holds none. The metrics file keeps the
    records up to `start`; one without any checkpoint is moved aside."""
    metrics_path, ckpt_dir = out / METRICS_FILE, out / CHECKPOINT_DIR
    start, resumed_from = 0, None
    if not resume and (list_checkpoints(ckpt_dir) or metrics_path.exists()):
        raise ValueError(
            f"out_dir={str(out)!r} already holds a run (metrics or checkpoints) and "
            "resume=False; pass resume=True to continue it or choose a new out_dir."
        )
    ckpt = load_latest_checkpoint(ckpt_dir, model=model, opt_state=opt_state)
    if ckpt is not None:
        # Committed, as a fresh run's are: uncommitted ones compiled both steps again.
        model, opt_state = _own_arrays((ckpt.model, ckpt.opt_state), copy=False)
        key = key if ckpt.key is None else ckpt.key
        start = resumed_from = ckpt.step
        if start > steps:
            warnings.warn(
                f"{out} holds a checkpoint at step {start}, beyond steps={steps}: "
                "nothing to train; the result is that checkpoint.",
                stacklevel=3,
            )
        if ckpt.data_state is not None:
            it.set_state(ckpt.data_state)
    elif is_main and _read_jsonl(metrics_path, math.inf):
        # A run without any checkpoint restarts from step 0: keep its metrics aside.
        previous = metrics_path.with_name(METRICS_FILE + ".prev")
        n = 1
        while previous.exists():  # never overwrite an earlier run's metrics
            previous = metrics_path.with_name(f"{METRICS_FILE}.prev.{n}")
            n += 1
        os.replace(metrics_path, previous)
        warnings.warn(
            f"{out} holds metrics but no checkpoint: starting from step 0; the old "
            f"metrics were moved to {previous}.",
            stacklevel=3,
        )
    # Records past the restored step are replayed by this run: drop them.
    history = _read_jsonl(metrics_path, start)
    if is_main and metrics_path.exists():
        _rewrite_jsonl(metrics_path, history)
    return model, opt_state, key, start, resumed_from, history


def _check_train_args(
    *,
    optimizer,
    loss_fn,
    data,
    key,
    eval_data,
    eval_fn,
    eval_every: int,
    eval_batches: int | None,
    out_dir,
    checkpoint_every: int,
    resume,
    unit,
    mesh,
    progress,
    plot,
    callback,
) -> None:
    """`train`'s checks of its arguments and of how they combine."""
    for name, flag in (("resume", resume), ("progress", progress), ("plot", plot)):
        check_bool(name, flag)
    _check_optimizer(optimizer)
    _check_callable("loss_fn", loss_fn)
    _check_callable("eval_fn", eval_fn, optional=True)
    _check_callable("callback", callback, optional=True)
    for name, batches in (("data", data), ("eval_data", eval_data)):
        if isinstance(batches, Mapping):
            raise TypeError(
                f"{name} must be an iterable of batches (a list, a grain dataset, ...), got "
                f"a single batch (a {type(batches).__name__} with keys {list(batches)[:5]}): "
                "pass [batch] or an iterable of them"
            )
        if (batches is not None or name == "data") and not _iterable(batches):
            raise TypeError(
                f"{name} must be an iterable of batches (a list, a grain dataset, ...), "
                f"got {name}={short_repr(batches)}"
            )
    if out_dir is not None and not isinstance(out_dir, str | os.PathLike):
        raise TypeError(
            f"out_dir must be a path (str or os.PathLike) or None, got out_dir={out_dir!r}"
        )
    check_key("key", key)
    if mesh is not None:
        _check_train_mesh(mesh)
    if isinstance(eval_data, Iterator):
        raise ValueError(
            "eval_data must be re-iterable (a list, a grain dataset, ...): it is iterated "
            f"afresh at every evaluation, but got a one-shot iterator {type(eval_data).__name__}."
        )
    if eval_batches is None and eval_data is not None and _repeats_forever(eval_data):
        raise ValueError(
            "eval_data repeats forever (a grain dataset with num_epochs=None) and "
            "eval_batches=None asks for all of its batches: pass eval_batches=N, or build "
            "eval_data with num_epochs=1."
        )
    check_choice("unit", unit, UNITS)
    if checkpoint_every and out_dir is None:
        raise ValueError(f"checkpoint_every={checkpoint_every} needs out_dir to be set.")
    if plot and out_dir is None:
        raise ValueError("plot=True needs out_dir to be set.")
    if eval_data is None:
        for name, value in (("eval_every", eval_every), ("eval_batches", eval_batches)):
            if value:
                raise ValueError(f"{name}={value} needs eval_data.")
        if eval_fn is not None:
            raise ValueError("eval_fn needs eval_data: without it nothing is evaluated.")


def _loss_first(names: Iterable[str]) -> list[str]:
    """Metric names in the records' order: `"loss"` first, then the others sorted."""
    return sorted(names, key=lambda k: (k != "loss", k))


def _own_arrays(tree: PyTree, *, copy: bool = True) -> PyTree:
    """`tree` with its arrays as JAX arrays committed to their own shardings, as the
    train step's outputs are (an uncommitted input compiled the step again at step 2);
    with `copy`, copies, which donation to the train step leaves alone. (Each array's
    own sharding: without one, `device_put` refuses arrays that span processes.)"""

    def place(a):
        a = jnp.asarray(a)
        return jax.device_put(a, a.sharding, may_alias=False if copy else None)

    dynamic, static = eqx.partition(tree, eqx.is_array)
    return eqx.combine(jax.tree.map(place, dynamic), static)


def _prepare_state(
    model: PyTree,
    opt_state: PyTree,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh | None,
    min_shard_size: int,
) -> tuple[PyTree, PyTree]:
    """The run's own `model` and `opt_state` (copies, or `optimizer.init` on the model's
    inexact arrays), placed on `mesh` if given: before they are copied or the optimiser
    state is made (a model on one device, with its copy and Adam's two moments, took 4x
    its size there), and before a checkpoint is read (its arrays load sharded)."""
    if mesh is not None:
        model = shard_params(model, mesh, min_shard_size=min_shard_size)
        if opt_state is not None:
            opt_state = shard_params(opt_state, mesh, min_shard_size=min_shard_size)
    model = _own_arrays(model)
    if opt_state is None:
        params = eqx.filter(model, eqx.is_inexact_array)
        opt_state = _own_arrays(_init(optimizer, params, mesh, min_shard_size), copy=False)
    else:
        opt_state = _own_arrays(opt_state)
    return model, opt_state


def _last_eval(history: list[dict], start: int, resumed_from: int | None) -> int:
    """The step of an evaluation this run need not repeat, or -1.

    A fresh run evaluates at its end even without a step to take (steps=0: evaluate
    only). A resumed run has evaluated at its checkpoint's step when the metrics say
    so: a final checkpoint follows the final evaluation (see `train`), but a periodic
    one at the step where the data ran out precedes it.
    """
    evaluated = any(r.get("split") == "eval" and r.get("step") == start for r in history)
    if jax.process_count() > 1:  # every process takes process 0's reading
        evaluated = bool(multihost_utils.broadcast_one_to_all(np.int32(evaluated)))
    return start if resumed_from is not None and evaluated else -1


def _check_finite(step: int, metrics: dict[str, float], steps: int) -> None:
    """A `NonFiniteError` for the first non-finite metric of train step `step`, the loss
    first."""
    for k in _loss_first(metrics):
        v = metrics[k]
        if not math.isfinite(v):
            raise NonFiniteError(
                f"Non-finite {'loss' if k == 'loss' else repr(k)} = {v} at train "
                f"step {step} of {steps} (the batch at 0-based position {step - 1}, "
                f"key jr.fold_in(train_key, {step - 1})); stopping. The last "
                "checkpoint (if any) precedes this step."
            )


def _check_finite_params(model: PyTree, step: int, steps: int) -> None:
    """A `NonFiniteError` unless every parameter is finite after train step `step`: its
    loss and gradient norm, computed before the update, can be finite while the update
    overflows."""
    arrays = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))
    if arrays and not _host(_all_finite(arrays)):
        raise NonFiniteError(
            f"Non-finite parameters after train step {step} of {steps} (the update "
            "overflowed; its loss and gradient norm were finite); stopping without "
            "checkpointing them. The last checkpoint (if any) precedes this step."
        )


@jax.jit
def _all_finite(arrays: list[Array]) -> Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in arrays]))


def _evaluate(
    eval_step: Callable[[PyTree, Any, PRNGKeyArray], dict[str, Array]],
    eval_data: Iterable,
    eval_key: PRNGKeyArray,
    model: PyTree,
    step: int,
    *,
    eval_batches: int | None,
    mesh: jax.sharding.Mesh | None,
) -> dict:
    """The evaluation record after train step `step`: the metrics of (the first
    `eval_batches`) batches of `eval_data`, averaged with weights proportional to their
    sizes; batch `i` gets the key `jr.fold_in(jr.fold_in(eval_key, step), i)`."""
    sums: dict[str, float] = {}
    n = 0
    key = jr.fold_in(eval_key, step)
    for i, batch in enumerate(iter(eval_data)):
        if eval_batches is not None and i >= eval_batches:
            break
        if mesh is not None:
            batch = _place_eval_batch(batch, mesh)
        metrics = eval_step(model, batch, jr.fold_in(key, i))
        size = _count(batch, "samples")
        for name, v in metrics.items():
            sums[name] = sums.get(name, 0.0) + size * _host(v)
        n += size
    if n == 0:
        raise ValueError("eval_data yielded no batches (or only empty ones).")
    record = {"step": step, "split": "eval"}
    record.update({name: sums[name] / n for name in _loss_first(sums)})
    for name, v in record.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise NonFiniteError(f"Non-finite eval {name!r} = {v} at step {step}.")
    return record


class _Recorder:
    """The run's records: kept in `history`, appended to the metrics file, shown on the
    progress bar and, for train records, passed to the callback.

    Train metrics stay on the device until `flush`, which checks them and writes their
    average with the learning rate and the throughput of the window since the last
    train record (the compilation of the first step, evaluations and checkpoints
    excluded).
    """

    def __init__(
        self,
        history: list[dict],
        *,
        metrics_path: pathlib.Path | None,
        progress: bool,
        start: int,
        steps: int,
        unit: str,
        optimizer: optax.GradientTransformation,
        callback: Callable[[int, PyTree, dict[str, float]], None] | None,
    ):
        self.history = history
        self.log_file = None if metrics_path is None else open(metrics_path, "a")  # noqa: SIM115
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=steps, initial=start, desc="train", dynamic_ncols=True)
        self.start = start
        self.steps = steps
        self.unit = unit
        # `make_optimizer`'s attributes (see `train`): other optimisers log no "lr".
        self.lr_schedule = getattr(optimizer, "learning_rate_schedule", None)
        self.accumulate_steps = getattr(optimizer, "accumulate_steps", 1)
        self.callback = callback
        self.pending: list[tuple[int, dict[str, Array]]] = []
        # The throughput window: items fed since the last train record, and since when.
        self.window_items = 0
        self.window_start = time.perf_counter()

    def restart_window(self) -> None:
        """Start the throughput window now: what came before is not train steps' time."""
        self.window_start = time.perf_counter()

    def add(self, step: int, metrics: dict[str, Array], items: int) -> None:
        """Hold the metrics of train step `step`, which fed `items` samples or tokens."""
        self.window_items += items
        self.pending.append((step, metrics))
        if step == self.start + 1:  # throughput excludes the compilation of the first step
            jax.block_until_ready(metrics)
            self.window_items = 0
            self.restart_window()
        if self.bar is not None:
            self.bar.update(1)

    def write(self, record: dict) -> None:
        self.history.append(record)
        if self.log_file is not None:
            self.log_file.write(json.dumps(record) + "\n")
            self.log_file.flush()

    def flush(self, model: PyTree, opt_state: PyTree) -> None:
        """Fetch pending metrics, check them, write one averaged train record."""
        if not self.pending:
            return
        fetched = [(s, {k: _host(v) for k, v in m.items()}) for s, m in self.pending]
        self.pending.clear()
        for s, m in fetched:
            _check_finite(s, m, self.steps)
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        last = fetched[-1][0]
        record = {"step": last, "split": "train"}
        for k in _loss_first(fetched[-1][1]):
            record[k] = float(np.mean([m[k] for _, m in fetched]))
        if self.lr_schedule is not None:  # learning rate of the next update
            count = _schedule_count(opt_state)
            updates = last // self.accumulate_steps if count is None else int(_host(count))
            record["lr"] = float(self.lr_schedule(updates))
        if self.window_items:  # (none yet right after the first, compiling, step)
            record[f"{self.unit}_per_s"] = self.window_items / elapsed
        self.window_items = 0
        self.write(record)
        if self.bar is not None:
            self.bar.set_postfix(self._postfix(record))
        if self.callback is not None:
            self.callback(last, model, record)
        # The next window starts now: the schedule, the record and the callback (which
        # may compile, or take long) are not the train steps' time.
        self.restart_window()

    def _postfix(self, record: dict) -> dict[str, str]:
        """The progress bar's summary of a train record."""
        postfix = {"loss": f"{record['loss']:.4g}"}
        if "lr" in record:
            postfix["lr"] = f"{record['lr']:.2e}"
        if f"{self.unit}_per_s" in record:
            postfix[f"{self.unit}/s"] = f"{record[f'{self.unit}_per_s']:.3g}"
        return postfix

    def write_eval(self, record: dict) -> None:
        """Write an evaluation record, and print it above the progress bar."""
        self.write(record)
        if self.bar is not None:
            shown = (f"{k}={v:.4g}" for k, v in record.items() if k not in ("step", "split"))
            self.bar.write(f"step {record['step']}: eval " + ", ".join(shown))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.log_file is not None:
            self.log_file.close()


def train(
    model: PyTree,
    optimizer: optax.GradientTransformation,
    loss_fn: LossFn,
    data: Iterable,
    *,
    steps: IntLike,
    key: PRNGKeyArray,
    opt_state: PyTree = None,
    eval_data: Iterable | None = None,
    eval_fn: LossFn | None = None,
    eval_every: IntLike = 0,
    eval_batches: IntLike | None = None,
    log_every: IntLike = 10,
    out_dir: str | os.PathLike | None = None,
    checkpoint_every: IntLike = 0,
    keep_checkpoints: IntLike | None = 3,
    resume: bool = True,
    unit: str = "samples",
    mesh: jax.sharding.Mesh | None = None,
    min_shard_size: int = 2**16,
    progress: bool = True,
    plot: bool = False,
    callback: Callable[[int, PyTree, dict[str, float]], None] | None = None,
) -> TrainResult:
    """Train a model: jitted steps, progress bar, JSONL metrics, eval, checkpoints.

    With `train_key, eval_key = jax.random.split(key)`, step `s` (0-based) uses the PRNG
    key `jr.fold_in(train_key, s)` and batch `i` of the evaluation after `n` steps (the
    `"step"` `metrics.jsonl` records) `jr.fold_in(jr.fold_in(eval_key, n), i)`, so a
    resumed run draws exactly the keys an uninterrupted one would. Before the first
    step, `eval_data`'s first batch is traced through `eval_fn` (nothing runs), so that
    an empty `eval_data` or a failing `eval_fn` stops the run at its start, not after it.
    With `out_dir` set, metrics go to `out_dir/metrics.jsonl` (one JSON record per line),
    checkpoints to `out_dir/checkpoints/step_XXXXXXXX` (atomic, last `keep_checkpoints`
    kept) and, with `plot=True`, the curves to `out_dir/curves.png`. With `resume=True`
    (default) a run finding a checkpoint there restores model, optimiser state, key and
    the data iterator's position, rewinds `metrics.jsonl` to that step and continues
    exactly (an `out_dir` holding metrics but no checkpoint starts again from step 0,
    moving the old metrics to `metrics.jsonl.prev`, or `.prev.1`, `.prev.2`... if that
    exists).

    The train and evaluation steps are compiled once per `loss_fn`, `eval_fn` and
    `optimizer`, compared by identity (and per shape of the model and batches): a later
    call, e.g. a resume in the same process, reuses the compilation only when passed the
    same function and optimiser objects (a new `make_optimizer(...)` compiles again).

    **Arguments:**

    - `model`: the model (any PyTree; it is copied, so the caller's arrays stay valid).
        Not one holding an `eqx.nn.State` (BatchNorm's): its updates have no way back
        from the loss, so it is refused.
    - `optimizer`: an optax optimiser, e.g. from [`lineax_seq.make_optimizer`][] (see
        [`lineax_seq.make_train_step`][] for those taking the loss). The train records
        hold the learning rate `"lr"` of the next update for an optimiser with the
        attributes of `make_optimizer`'s: `learning_rate_schedule` evaluated at the
        count of the first `optax.ScaleByScheduleState` in the optimiser state, or at
        `step // accumulate_steps` (default 1) without one; others log no `"lr"`.
    - `loss_fn`: `loss_fn(model, batch, key) -> (loss, aux)`, see
        [`lineax_seq.make_train_step`][].
    - `data`: an iterable of batches (a grain dataset or iterator from
        `lineax_seq.data`, or any Python iterable). Grain iterators are checkpointed
        with `get_state`/`set_state`; other iterables are re-iterated and fast-forwarded
        on resume, so they must be deterministic. Resume with the pipeline the run was
        started with: a changed worker layout is an error, but a grain state is a
        position in the pipeline, which another batch size or shuffle seed reads as
        another place in the data, silently. A batch is a PyTree of numeric or bool
        arrays: Python and NumPy numbers are taken as arrays (traced, so a new value
        compiles nothing), and a string or object leaf is a `TypeError` naming it.
    - `steps`: total number of train steps (micro-batches) of the run.
    - `key`: PRNG key of the run, `jax.random.key(seed)` (or a raw `uint32` key of
        `jax.random.PRNGKey`); ignored on resume: the checkpoint's key is used (this
        one if the checkpoint holds none, as `save_checkpoint(key=None)` writes).
    - `opt_state`: initial optimiser state (default `optimizer.init` on the inexact
        arrays of `model`).
    - `eval_data`: an iterable of evaluation batches; `iter(eval_data)` is called
        afresh at every evaluation. An evaluation record holds the batches' metrics
        averaged with weights proportional to their sizes (the leading size of the first
        batch leaf), so a shorter last batch counts for what it holds: exact for
        metrics that are means over a batch's examples, approximate for means over
        other units (e.g. masked tokens) and for maxima.
    - `eval_fn`: the evaluation loss, same signature as `loss_fn` (default `loss_fn`),
        called on the model in inference mode (dropout off; see
        [`lineax_seq.make_eval_step`][]).
    - `eval_every`: evaluate every this many steps and at the end (0: only at the end,
        if `eval_data` is given).
    - `eval_batches`: number of evaluation batches per evaluation (default: all, which
        needs a finite `eval_data`, e.g. a `lineax_seq.*_dataset` with `num_epochs=1`).
    - `log_every`: write a train record and refresh the progress bar every this many
        steps, and also before every evaluation and checkpoint; a record averages the
        metrics of the steps since the previous one. The first record after a start or
        resume leaves out the compiling step's time: if it holds only that step, it has
        no throughput field.
    - `out_dir`: directory for metrics, checkpoints and plots (`None`: nothing written).
    - `checkpoint_every`: checkpoint every this many steps and at the end (0: never).
    - `keep_checkpoints`: number of checkpoints kept (`None`: all).
    - `resume`: continue from the newest intact checkpoint in `out_dir` if any.
    - `unit`: throughput unit: `"samples"` (leading size of the first batch leaf) or
        `"tokens"` (the largest product of a batch leaf's first two dimensions, e.g.
        `B * L` of `(B, L)` token ids).
    - `mesh`: if given, batches are split over its `"data"` axis
        ([`lineax_seq.shard_batch`][]) and large weights over `"model"`
        ([`lineax_seq.shard_params`][]); every process feeds its own slice of the
        global batch. In a one-process run an evaluation batch whose size does not
        divide the `"data"` axis (a finite `eval_data`'s last one) is replicated instead.
    - `min_shard_size`: smaller arrays are replicated, not split over `"model"`.
    - `progress`: show a tqdm progress bar with the loss and the throughput.
    - `plot`: save the loss curves to `out_dir/curves.png` at the end.
    - `callback`: called as `callback(step, model, record)` after every train record.
        The model's arrays are donated to the next step: copy what you keep
        (`jax.tree.map(jnp.copy, eqx.filter(model, eqx.is_array))`).

    **Returns:**

    A [`lineax_seq.TrainResult`][].

    **Raises:**

    [`lineax_seq.NonFiniteError`][] naming the step and the quantity when the loss
    (or any metric, or the gradient norm) becomes NaN or infinite, or an update leaves a
    parameter so (checked before each checkpoint and at the end); no checkpoint is
    written after that point. Metrics are fetched from the device at every train record
    (every `log_every` steps, and before evaluations and checkpoints), so the run stops
    at the first record after the step, at most `log_every - 1` steps later.
    """
    steps = check_int("steps", steps, minimum=0)
    eval_every = check_int("eval_every", eval_every, minimum=0)
    checkpoint_every = check_int("checkpoint_every", checkpoint_every, minimum=0)
    log_every = check_int("log_every", log_every)
    keep_checkpoints = check_optional_int("keep_checkpoints", keep_checkpoints)
    eval_batches = check_optional_int("eval_batches", eval_batches)
    min_shard_size = check_int("min_shard_size", min_shard_size, minimum=0)
    _check_train_args(
        optimizer=optimizer,
        loss_fn=loss_fn,
        data=data,
        key=key,
        eval_data=eval_data,
        eval_fn=eval_fn,
        eval_every=eval_every,
        eval_batches=eval_batches,
        out_dir=out_dir,
        checkpoint_every=checkpoint_every,
        resume=resume,
        unit=unit,
        mesh=mesh,
        progress=progress,
        plot=plot,
        callback=callback,
    )

    is_main = jax.process_index() == 0
    out = None if out_dir is None else pathlib.Path(out_dir)
    if out is not None and out.exists() and not out.is_dir():
        raise ValueError(f"out_dir={str(out)!r} is a file, not a directory for the run.")
    if out is not None and is_main:
        out.mkdir(parents=True, exist_ok=True)
    metrics_path = None if out is None or not is_main else out / METRICS_FILE
    ckpt_dir = None if out is None else out / CHECKPOINT_DIR

    is_state = lambda x: isinstance(x, eqx.nn.State)
    if any(is_state(x) for x in jax.tree.leaves(model, is_leaf=is_state)):
        raise ValueError(
            "model holds an eqx.nn.State (BatchNorm's, or another stateful layer's): train "
            "optimises arrays and has no way to carry the state's updates, so its running "
            "statistics would be trained as weights; use a stateless model (e.g. LayerNorm)"
        )
    model, opt_state = _prepare_state(model, opt_state, optimizer, mesh, min_shard_size)
    it = _DataIterator(data)
    start, resumed_from, history = 0, None, []
    if out is not None:
        model, opt_state, key, start, resumed_from, history = _restore(
            out, resume, model, opt_state, key, steps, it, is_main
        )
    if jax.process_count() > 1:
        # Every process reads `out_dir` before process 0 writes its metrics: one that came
        # later took process 0's new metrics file for an earlier run (resume=False).
        multihost_utils.sync_global_devices("lineax_seq.train: out_dir read")

    train_key, eval_key = jr.split(key)
    step_fn = _indexed_train_step(loss_fn, optimizer, mesh, min_shard_size, donate=True)
    eval_step = make_eval_step(loss_fn if eval_fn is None else eval_fn)
    evaluate = None
    if eval_data is not None:  # before the metrics file is opened (or created)
        _check_eval(eval_data, eval_step, model, eval_key, mesh)
        evaluate = ft.partial(
            _evaluate, eval_step, eval_data, eval_key, eval_batches=eval_batches, mesh=mesh
        )
    checkpoint = None
    if checkpoint_every and ckpt_dir is not None:
        checkpoint = ft.partial(save_checkpoint, ckpt_dir, key=key, keep=keep_checkpoints)
    step = start
    last_eval = _last_eval(history, start, resumed_from)
    last_ckpt = start
    recorder = _Recorder(
        history,
        metrics_path=metrics_path,
        progress=progress and is_main,
        start=start,
        steps=steps,
        unit=unit,
        optimizer=optimizer,
        callback=callback,
    )  # (opens the metrics file: closed in the `finally` below)
    try:
        while step < steps:
            try:
                batch = next(it)
            except StopIteration:
                warnings.warn(
                    f"`data` ran out after {it.consumed} batches, at step {step} of {steps}.",
                    stacklevel=2,
                )
                break
            # Each process feeds its own slice of the global batch.
            items = _count(batch, unit) * (1 if mesh is None else jax.process_count())
            if mesh is not None:
                batch = shard_batch(batch, mesh)
            # The key of step s is jr.fold_in(train_key, s), computed inside the step.
            model, opt_state, metrics = step_fn(model, opt_state, batch, train_key, np.int32(step))
            step += 1
            recorder.add(step, metrics, items)
            if step % log_every == 0:
                recorder.flush(model, opt_state)
            if evaluate is not None and eval_every and step % eval_every == 0:
                recorder.flush(model, opt_state)
                recorder.write_eval(evaluate(model, step))
                last_eval = step
                recorder.restart_window()  # throughput excludes evaluation
            if checkpoint is not None and step % checkpoint_every == 0 and step < steps:
                recorder.flush(model, opt_state)  # never checkpoint a non-finite state
                _check_finite_params(model, step, steps)
                checkpoint(step, model=model, opt_state=opt_state, data_state=it.get_state())
                last_ckpt = step
                recorder.restart_window()
        recorder.flush(model, opt_state)
        if step > start:
            _check_finite_params(model, step, steps)
        # The final evaluation comes before the final checkpoint, so that a run killed
        # between the two evaluates again when resumed.
        if evaluate is not None and last_eval != step:
            recorder.write_eval(evaluate(model, step))
        if checkpoint is not None and last_ckpt != step:
            checkpoint(step, model=model, opt_state=opt_state, data_state=it.get_state())
    finally:
        recorder.close()
    if plot and is_main and out is not None:
        plot_metrics(history, out / PLOT_FILE)
    return TrainResult(model, opt_state, step, key, history, resumed_from)


def _check_eval(eval_data, eval_step, model, key, mesh) -> None:
    """Trace the evaluation on `eval_data`'s first batch before any training, so that an
    empty `eval_data` or a failing `eval_fn` is found at the start, not after the run."""
    batch = next(iter(eval_data), None)
    if batch is None:
        raise ValueError("eval_data yielded no batches: it must hold at least one.")
    if mesh is not None:
        batch = _place_eval_batch(batch, mesh)
    eqx.filter_eval_shape(eval_step, model, batch, key)


def _place_eval_batch(batch: Any, mesh: jax.sharding.Mesh) -> Any:
    """An evaluation batch split over the mesh's `"data"` axis or, in a one-process run,
    replicated when its size does not divide that axis (the shorter last batch of a
    finite `eval_data`, which would otherwise fail the run at its first evaluation)."""
    if jax.process_count() == 1 and _count(batch, "samples") % mesh.shape["data"]:
        return jax.device_put(batch, NamedSharding(mesh, P()))
    return shard_batch(batch, mesh)


def plot_metrics(
    history: list[dict] | str | os.PathLike,
    path: str | os.PathLike | None = None,
    *,
    keys: str | tuple[str, ...] | None = None,
) -> Figure:
    """Plot train and eval curves, one panel per metric.

    **Arguments:**

    - `history`: a list of records ([`lineax_seq.TrainResult`][]`.history`: each a
        dict with `"step"`, `"split"` and metrics; the `"train"` and `"eval"` splits are
        drawn) or the path of a `metrics.jsonl` file.
    - `path`: the file to save the figure to (PNG unless its suffix names another
        format), leaving pyplot's backend and figures alone; `None` only returns it, as
        a pyplot figure (for `plt.show()`).
    - `keys`: metrics to plot, a name or a tuple of names (default: `"loss"` then every
        other metric found, except throughputs); each must be in some record.

    **Returns:**

    The `matplotlib.figure.Figure`.
    """
    if not isinstance(history, list):
        if not check_path("history", history).is_file():
            raise FileNotFoundError(f"history={str(history)!r} is not a metrics.jsonl file.")
        history = _read_jsonl(pathlib.Path(history), math.inf)
    if path is not None and check_path("path", path).is_dir():
        raise ValueError(
            f"path={str(path)!r} is a directory; expected a file name, e.g. "
            f"{str(pathlib.Path(path) / 'curves.png')!r}."
        )
    for i, record in enumerate(history):
        if "step" not in record or "split" not in record:
            raise ValueError(
                f"history[{i}] needs a 'step' and a 'split' (the curves drawn are 'train' "
                f"and 'eval'), got the keys {sorted(record)}."
            )
    available = list(dict.fromkeys(k for r in history for k in r if k not in ("step", "split")))
    if isinstance(keys, str):  # one metric, not its letters
        keys = (keys,)
    if keys is not None and not (
        isinstance(keys, tuple | list) and all(isinstance(k, str) for k in keys)
    ):
        raise TypeError(f"keys must be a metric name or a tuple of them, got keys={keys!r}")
    if keys is None:
        found = [k for k in available if k != "lr" and not k.endswith("_per_s")]
        keys = tuple(_loss_first(found))
    for k in keys:
        if k not in available:
            raise ValueError(f"keys: no record has the metric {k!r}; the history has {available}.")
    if not keys:
        raise ValueError("history holds no metrics to plot.")
    figsize = (4 * len(keys), 3)
    if path is None:  # a pyplot figure, for the caller's backend (plt.show, notebooks)
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=figsize)
    else:  # saved only: no pyplot, whose backend and open figures are global state
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize)
    axes = fig.subplots(1, len(keys), squeeze=False)
    for ax, k in zip(axes[0], keys, strict=True):
        for split, style in (("train", "-"), ("eval", "o-")):
            pts = [(r["step"], r[k]) for r in history if r.get("split") == split and k in r]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, style, label=split, markersize=3)
        ax.set_xlabel("step")
        ax.set_title(k)
        ax.legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
