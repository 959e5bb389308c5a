"""AdamW with learning-rate schedules, clipping, accumulation and parameter groups."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
import optax
from jaxtyping import PyTree

from .._checks import IntLike, RealScalar, check_choice, check_int, real_scalar

SCHEDULES = ("cosine", "linear", "constant")
DEFAULT_GROUP = "default"


def make_schedule(
    peak_lr: RealScalar,
    *,
    schedule: str | None = None,
    warmup_steps: IntLike = 0,
    total_steps: IntLike | None = None,
    init_lr: RealScalar = 0.0,
    end_lr: RealScalar = 0.0,
) -> optax.Schedule:
    """Learning-rate schedule: linear warmup to `peak_lr`, then a decay.

    **Arguments:**

    - `peak_lr`: learning rate reached at the end of the warmup.
    - `schedule`: shape of the decay after the warmup: `"cosine"` (cosine decay to
        `end_lr` at `total_steps`), `"linear"` (linear decay to `end_lr` at
        `total_steps`) or `"constant"` (stay at `peak_lr`). Default: `"cosine"` if
        `total_steps` is given, else `"constant"`.
    - `warmup_steps`: number of optimiser updates of linear warmup from `init_lr`.
    - `total_steps`: optimiser update at which the decay reaches `end_lr`; required
        for `"cosine"` and `"linear"`, ignored for `"constant"`.
    - `init_lr`: learning rate at update 0 (when `warmup_steps > 0`).
    - `end_lr`: final learning rate of the decaying schedules (with `"constant"`, an
        error unless 0 or `peak_lr`).

    **Returns:**

    An `optax.Schedule`, mapping the update count to a learning rate.

    **Raises:**

    `ValueError` for an unknown `schedule`, a negative `warmup_steps`, a missing or
    too small `total_steps`, a negative or non-finite `peak_lr`, `init_lr` or `end_lr`,
    or an `init_lr` or `end_lr` above `peak_lr`.
    """
    if schedule is None:
        schedule = "constant" if total_steps is None else "cosine"
    check_choice("schedule", schedule, SCHEDULES)
    warmup_steps = check_int("warmup_steps", warmup_steps, minimum=0)
    if total_steps is not None:  # checked even where the schedule ignores it
        total_steps = check_int("total_steps", total_steps)
    for name, value in (("peak_lr", peak_lr), ("init_lr", init_lr), ("end_lr", end_lr)):
        if not _finite(value) or value < 0:
            raise ValueError(f"{name}={value!r} must be a finite number >= 0.")
    for name, value, what in (("init_lr", init_lr, "warm up"), ("end_lr", end_lr, "decay")):
        if value > peak_lr:
            raise ValueError(
                f"{name}={value!r} must be <= peak_lr={peak_lr!r} (the schedule would {what} "
                "the wrong way)."
            )
    if schedule == "constant":
        if end_lr not in (0, peak_lr):
            raise ValueError(
                f"end_lr={end_lr!r} has no effect with schedule='constant' (the default "
                "without total_steps): leave end_lr at 0, or use a decaying schedule"
            )
        if warmup_steps == 0:
            return optax.constant_schedule(peak_lr)
        return optax.join_schedules(
            [
                optax.linear_schedule(init_lr, peak_lr, warmup_steps),
                optax.constant_schedule(peak_lr),
            ],
            [warmup_steps],
        )
    if total_steps is None:
        raise ValueError(
            f"schedule={schedule!r} decays until total_steps, but total_steps=None; pass "
            "total_steps, or schedule='constant'."
        )
    if total_steps <= warmup_steps:
        raise ValueError(
            f"total_steps={total_steps} must be an integer > warmup_steps={warmup_steps} "
            f"for schedule={schedule!r}."
        )
    if schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_lr, peak_lr, warmup_steps, total_steps, end_value=end_lr
        )
    decay = optax.linear_schedule(peak_lr, end_lr, total_steps - warmup_steps)
    if warmup_steps == 0:
        return decay
    return optax.join_schedules(
        [optax.linear_schedule(init_lr, peak_lr, warmup_steps), decay], [warmup_steps]
    )


@dataclasses.dataclass(frozen=True)
class ParamGroup:
    """A group of parameters with its own learning rate and weight decay.

    Select the members in exactly one of three ways:

    - `match`: a regular expression (a string or an `re.Pattern`) searched in the
        parameter's path (as written by `jax.tree_util.keystr`, e.g.
        `".layers[0].kernel.log_dt"`), or a predicate
        `(path: str, leaf: jax.ShapeDtypeStruct) -> bool` on the path and the leaf's
        shape and dtype (labels are recomputed inside `jit`, where values are unknown).
    - `where`: an `equinox.tree_at`-style selector, `lambda model: model.dynamics` or
        `lambda model: (model.encoder, model.decoder.bias)`; every array below the
        selected nodes belongs to the group.
    - `instance_of`: a module class (or tuple of classes), e.g. `lineax_seq.S4DKernel`;
        every array inside an instance belongs to the group.

    **Fields:**

    - `match`: regex or predicate, see above.
    - `where`: selector, see above.
    - `instance_of`: module class(es), see above.
    - `learning_rate`: peak learning rate of the group (the schedule's shape is shared
        by all groups); `None` keeps the optimiser's base learning rate.
    - `weight_decay`: decoupled weight decay of the group; `None` keeps the base one.
    """

    match: str | re.Pattern | Callable[[str, Any], bool] | None = None
    where: Callable[[PyTree], Any] | None = None
    instance_of: type | tuple[type, ...] | None = None
    learning_rate: RealScalar | None = None
    weight_decay: RealScalar | None = None

    def __post_init__(self):
        given = [self.match is not None, self.where is not None, self.instance_of is not None]
        if sum(given) != 1:
            raise ValueError(
                "ParamGroup needs exactly one of `match` (regex or predicate on the path), "
                "`where` (selector on the model) or `instance_of` (module class); got "
                f"match={self.match!r}, where={self.where!r}, "
                f"instance_of={self.instance_of!r}."
            )
        if isinstance(self.match, str):
            try:
                re.compile(self.match)
            except re.error as e:
                raise ValueError(f"match={self.match!r} is not a regular expression: {e}.") from e
        elif self.match is not None and not (
            isinstance(self.match, re.Pattern) or callable(self.match)
        ):
            raise ValueError(
                f"match={self.match!r} must be a regular expression or a predicate "
                "(path, leaf) -> bool."
            )
        if self.where is not None and not callable(self.where):
            raise ValueError(f"where={self.where!r} must be a selector, model -> nodes.")
        types = self.instance_of if isinstance(self.instance_of, tuple) else (self.instance_of,)
        if self.instance_of is not None and not all(isinstance(t, type) for t in types):
            raise ValueError(
                f"instance_of={self.instance_of!r} must be a class or a tuple of classes."
            )
        for name in ("learning_rate", "weight_decay"):
            value = getattr(self, name)
            if value is not None and (not _finite(value) or value < 0):
                raise ValueError(f"{name}={value!r} must be a finite number >= 0 or None.")


def _real(value: Any) -> bool:
    """Whether `value` is a real number, not a bool (see `real_scalar`; as optax takes)."""
    return real_scalar(value) is not None


def _finite(value: Any) -> bool:
    """Whether `value` is a real number (not a bool), neither NaN nor infinite."""
    number = real_scalar(value)
    return number is not None and math.isfinite(number)


def _check_groups(groups: Mapping[str, ParamGroup]) -> None:
    if not isinstance(groups, Mapping):
        raise ValueError(
            f"groups must be a mapping of group name to ParamGroup, got {type(groups).__name__}."
        )
    for name, group in groups.items():
        if not isinstance(name, str):
            raise ValueError(f"groups: group names must be strings, got {name!r}.")
        if name == DEFAULT_GROUP:
            raise ValueError(
                f"groups: the name {DEFAULT_GROUP!r} is reserved for the parameters that "
                "no group selects; choose another name."
            )
        if not isinstance(group, ParamGroup):
            raise ValueError(f"groups[{name!r}]={group!r} must be a ParamGroup.")


def param_labels(model: PyTree, groups: Mapping[str, ParamGroup]) -> PyTree:
    """Label every inexact-array leaf of a model with the name of its parameter group.

    Groups are tried in order and the first one that selects a leaf wins; leaves that
    no group selects get the label `"default"`. Leaves that are not inexact arrays
    (integers, static fields, functions) become `None` and are not optimised. A group
    that selects no leaf at all, or only leaves that earlier groups take, is an error
    (a typo in a regular expression would otherwise drop its learning rate silently).

    **Arguments:**

    - `model`: the model (any PyTree), or its `eqx.filter(model, eqx.is_inexact_array)`.
    - `groups`: mapping of group name to [`lineax_seq.ParamGroup`][].

    **Returns:**

    A PyTree with the structure of `eqx.filter(model, eqx.is_inexact_array)` whose
    leaves are group names: the `param_labels` of `optax.multi_transform`. Pass it
    wrapped, `optax.multi_transform(transforms, lambda params: labels)`: the labels are
    a copy of the model, and an Equinox module with a `__call__` would be taken for a
    label function. ([`lineax_seq.make_optimizer`][] does this for you.)

    **Raises:**

    `ValueError` naming the group for a group that selects no inexact array, or only
    ones that earlier groups take, and for a `where` that fails on the model.
    """
    _check_groups(groups)
    params = eqx.filter(model, eqx.is_inexact_array)
    paths_leaves, treedef = jtu.tree_flatten_with_path(params)
    paths = [jtu.keystr(p) for p, _ in paths_leaves]
    labels: list[str | None] = [None] * len(paths)
    # `where` groups: mark the selected subtrees of an index tree.
    index_tree = jtu.tree_unflatten(treedef, list(range(len(paths))))
    selected: dict[str, set[int]] = {}
    for name, group in groups.items():
        marker = object()
        mark = lambda node, marker=marker: jax.tree.map(lambda _: marker, node)
        if group.instance_of is not None:
            types = group.instance_of
            marked = jax.tree.map(
                lambda node, types=types, mark=mark: (
                    mark(node) if isinstance(node, types) else node
                ),
                index_tree,
                is_leaf=lambda node, types=types: isinstance(node, types),
            )
        elif group.where is not None:
            try:
                # `None`s (static fields, integer arrays) are leaves, so that selecting
                # one selects no parameter rather than failing in `tree_at`.
                marked = eqx.tree_at(
                    group.where, index_tree, replace_fn=mark, is_leaf=lambda x: x is None
                )
            except Exception as e:
                if not _holds_parameters(group.where, model):  # e.g. a static field
                    raise _selects_nothing(name, group, model, paths) from None
                raise ValueError(
                    f"groups[{name!r}].where could not select nodes of the model: {e}"
                ) from e
        else:  # a `match` group: selected below
            continue
        flat = jtu.tree_leaves(marked)
        if len(flat) != len(paths):
            raise ValueError(
                f"groups[{name!r}].where changed the number of parameters it selects "
                "(it must select existing nodes of the model)."
            )
        selected[name] = {i for i, x in enumerate(flat) if x is marker}
    for name, group in groups.items():
        if isinstance(group.match, str | re.Pattern):
            selected[name] = {i for i, p in enumerate(paths) if re.search(group.match, p)}
        elif group.match is not None:
            selected[name] = _predicate_selects(name, group.match, paths, paths_leaves)
        if not selected[name]:
            raise _selects_nothing(name, group, model, paths)
    for i in range(len(paths)):
        labels[i] = next((name for name in groups if i in selected[name]), DEFAULT_GROUP)
    names = list(groups)
    for k, name in enumerate(names):
        if name not in labels:
            earlier = [g for g in names[:k] if selected[g] & selected[name]]
            raise ValueError(
                f"groups[{name!r}] selects only parameters that earlier groups take "
                f"({', '.join(map(repr, earlier))}: the first group that selects a "
                "parameter wins), so it changes no learning rate or weight decay."
            )
    return jtu.tree_unflatten(treedef, labels)


def _predicate_selects(
    name: str, match: Callable[[str, Any], bool], paths: list[str], paths_leaves: list
) -> set[int]:
    """The indices of the parameters a `match` predicate selects; an exception it raises
    is re-raised as a `ValueError` naming the group and the parameter."""
    selected = set()
    for i, (p, (_, leaf)) in enumerate(zip(paths, paths_leaves, strict=True)):
        try:
            if match(p, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)):
                selected.add(i)
        except Exception as e:
            raise ValueError(
                f"groups[{name!r}].match raised {type(e).__name__}: {e} on the parameter "
                f"{p!r} (it gets the path and a jax.ShapeDtypeStruct)"
            ) from e
    return selected


def _holds_parameters(where: Callable[[PyTree], Any], model: PyTree) -> bool:
    """Whether the nodes `where` selects hold an inexact array (`True` if it fails)."""
    try:
        nodes = where(model)
    except Exception:
        return True
    return bool(jtu.tree_leaves(eqx.filter(nodes, eqx.is_inexact_array)))


def _selects_nothing(name: str, group: ParamGroup, model: PyTree, paths: list[str]) -> ValueError:
    """The error of a group that labels no parameter, saying what it selected instead."""
    shown = ", ".join(repr(p) for p in paths[:4]) + (", ..." if len(paths) > 4 else "")
    if group.where is not None:
        try:
            picked = repr(group.where(model))
        except Exception:  # pragma: no cover (it selected nodes of the index tree)
            picked = "nodes"
        picked = picked if len(picked) <= 60 else picked[:57] + "..."
        what = (
            f".where selects {picked}, which holds no inexact array (static fields and "
            "integer arrays are not optimised)"
        )
    elif group.instance_of is not None:
        what = f" (instance_of={group.instance_of!r}) selects no inexact array of the model"
    elif isinstance(group.match, str | re.Pattern):
        what = f" (match={group.match!r}) matches no parameter path (the paths: {shown})"
    else:
        what = (
            f" (match={group.match!r}) is false for every parameter (it gets the path "
            f"and a jax.ShapeDtypeStruct; the paths: {shown})"
        )
    return ValueError(
        f"groups[{name!r}]{what}; a group that selects nothing changes no learning rate "
        "or weight decay."
    )


def make_optimizer(
    learning_rate: RealScalar = 1e-3,
    *,
    schedule: str | None = None,
    warmup_steps: IntLike = 0,
    total_steps: IntLike | None = None,
    end_lr_ratio: RealScalar = 0.0,
    weight_decay: RealScalar = 0.01,
    b1: RealScalar = 0.9,
    b2: RealScalar = 0.999,
    eps: RealScalar = 1e-8,
    clip_norm: RealScalar | None = 1.0,
    accumulate_steps: IntLike = 1,
    groups: Mapping[str, ParamGroup] | None = None,
) -> optax.GradientTransformation:
    """AdamW with warmup + decay, global-norm clipping, accumulation and groups.

    The chain is `clip_by_global_norm(clip_norm)` (over all parameters), then one
    `optax.adamw` per parameter group (`optax.multi_transform`, labels from
    [`lineax_seq.param_labels`][]), all wrapped in `optax.MultiSteps` when
    `accumulate_steps > 1`. Initialise and update it on the inexact arrays of the
    model only, as [`lineax_seq.make_train_step`][] does:

    ```python
    opt = ls.make_optimizer(1e-3, warmup_steps=100, total_steps=10_000, groups={
        "ssm": ls.ParamGroup(instance_of=ls.S4DKernel, learning_rate=1e-3, weight_decay=0.0)})
    opt_state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    ```

    **Arguments:**

    - `learning_rate`: peak learning rate of the `"default"` group.
    - `schedule`, `warmup_steps`, `total_steps`: see [`lineax_seq.make_schedule`][]:
        by default a cosine decay to `total_steps` if it is given, else a constant
        learning rate (after the warmup), so `make_optimizer(1e-3)` is
        `optax.adamw(1e-3, weight_decay=0.01)` after `clip_by_global_norm(1.0)` (the
        defaults below; `clip_norm=None` leaves out the clipping).
        Counted in optimiser updates (one per `accumulate_steps` micro-batches).
    - `end_lr_ratio`: final learning rate of the decaying schedules as a fraction of
        each group's peak (an error with a constant one, unless 0 or 1).
    - `weight_decay`: decoupled weight decay of the `"default"` group: of every array in
        it, biases, norms and embeddings too (`optax.adamw` without a mask); a group with
        `weight_decay=0.0` exempts some, e.g.
        `ls.ParamGroup(match=r"\\.bias$", weight_decay=0.0)`.
    - `b1`, `b2`, `eps`: Adam hyper-parameters.
    - `clip_norm`: maximum global gradient norm, or `None` for no clipping.
    - `accumulate_steps`: number of micro-batch gradients averaged per update.
    - `groups`: mapping of group name to [`lineax_seq.ParamGroup`][] (each with its own
        learning rate and weight decay); the first matching group wins.

    **Returns:**

    An `optax.GradientTransformation` with two more attributes, from which
    [`lineax_seq.train`][] logs the learning rate:

    - `learning_rate_schedule`: the `"default"` group's schedule, a function of the
        optimiser update count.
    - `accumulate_steps`: the number of micro-batches per update.
    """
    groups = {} if groups is None else groups
    _check_groups(groups)
    groups = dict(groups)
    for name, value in (("learning_rate", learning_rate), ("end_lr_ratio", end_lr_ratio)):
        if not _real(value):
            raise ValueError(f"{name}={value!r} must be a number.")
    for name, value in (("learning_rate", learning_rate), ("weight_decay", weight_decay)):
        if not _finite(value) or value < 0:
            raise ValueError(f"{name}={value!r} must be a finite number >= 0.")
    for name, value in (("b1", b1), ("b2", b2)):
        if not _finite(value) or not 0 <= value < 1:
            raise ValueError(f"{name}={value!r} must be a number in [0, 1).")
    if not _finite(eps) or eps <= 0:
        raise ValueError(f"eps={eps!r} must be a finite number > 0.")
    if clip_norm is not None and (not _finite(clip_norm) or clip_norm <= 0):
        raise ValueError(f"clip_norm={clip_norm!r} must be a finite number > 0 or None.")
    accumulate_steps = check_int("accumulate_steps", accumulate_steps)
    if not 0.0 <= end_lr_ratio <= 1.0:
        raise ValueError(f"end_lr_ratio={end_lr_ratio} must be in [0, 1].")
    constant = schedule == "constant" or (schedule is None and total_steps is None)
    if constant and end_lr_ratio not in (0, 1):
        raise ValueError(
            f"end_lr_ratio={end_lr_ratio!r} has no effect with a constant learning rate "
            "(schedule='constant', the default without total_steps): leave end_lr_ratio at "
            "0, or use a decaying schedule (with total_steps)"
        )

    def _schedule(peak_lr: RealScalar) -> optax.Schedule:
        return make_schedule(
            peak_lr,
            schedule=schedule,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            end_lr=peak_lr * end_lr_ratio,
        )

    def _adamw(sched: optax.Schedule, wd: RealScalar) -> optax.GradientTransformation:
        # (optax's hint for weight_decay leaves out the NumPy scalars it takes)
        return optax.adamw(
            sched,
            b1=b1,
            b2=b2,
            eps=eps,
            weight_decay=wd,  # pyright: ignore[reportArgumentType]
        )

    default_schedule = _schedule(learning_rate)
    transforms: dict[Hashable, optax.GradientTransformation] = {
        DEFAULT_GROUP: _adamw(default_schedule, weight_decay)
    }
    for name, g in groups.items():
        transforms[name] = _adamw(
            _schedule(learning_rate if g.learning_rate is None else g.learning_rate),
            weight_decay if g.weight_decay is None else g.weight_decay,
        )
    if groups:
        inner = optax.multi_transform(transforms, lambda params: param_labels(params, groups))
    else:
        inner = transforms[DEFAULT_GROUP]
    chain: Sequence[optax.GradientTransformation] = (
        [inner] if clip_norm is None else [optax.clip_by_global_norm(clip_norm), inner]
    )
    opt = optax.chain(*chain)
    if accumulate_steps > 1:
        opt = optax.MultiSteps(opt, every_k_schedule=accumulate_steps).gradient_transformation()
    opt = _standard_promotion(opt)
    opt.learning_rate_schedule = default_schedule
    opt.accumulate_steps = accumulate_steps
    return opt


class _Optimizer(optax.GradientTransformation):
    """`make_optimizer`'s optimiser: an optax `GradientTransformation` that also carries
    what [`lineax_seq.train`][] logs the learning rate from (see `make_optimizer`).

    These are plain attributes, not tuple fields: optax and JAX see `(init, update)`
    only, and a copy rebuilt from those (e.g. by JAX inside `jit`) has the defaults.
    """

    learning_rate_schedule: optax.Schedule | None = None
    accumulate_steps: int = 1


def _standard_promotion(tx: optax.GradientTransformation) -> _Optimizer:
    """Run `tx` under standard dtype promotion.

    optax's Adam bias correction computes `b1 ** count` (Python float ** int32), which
    `jax_numpy_dtype_promotion="strict"` (as used in this project's tests, and by
    careful users) rejects; the optimiser's internals are not the user's concern.
    """

    def init(params):
        with jax.numpy_dtype_promotion("standard"):
            return tx.init(params)

    def update(updates, state, params=None):
        with jax.numpy_dtype_promotion("standard"):
            return tx.update(updates, state, params)

    return _Optimizer(init, update)
