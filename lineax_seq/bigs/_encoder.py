"""The BiGS encoder (and its STACK / attention relatives) with named configurations."""

from typing import Any, Literal, SupportsIndex

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from beartype import beartype
from jaxtyping import Array, Bool, Float, Integer, PRNGKeyArray, jaxtyped

from .._checks import (
    IntLike,
    RealScalar,
    as_arrays,
    check_bool,
    check_choice,
    check_ids,
    check_int,
    check_key,
    check_mask_dtype,
    check_trailing_mask,
    host_arrays,
)
from ..ssm._kernel import check_kernel_options
from ._layers import (
    ARCHITECTURES,
    KERNELS,
    ROUTINGS,
    GatedLayer,
    StackLayer,
    apply_dropout,
    apply_norm,
    check_dropout,
    check_init_std,
    largest_rate,
    resolve_inference,
)

BIGS_CONFIGS: dict[str, dict[str, Any]] = {
    # Paper, Table 7 / section 5: 23 GATED layers, d 1024, inner 3072 (~350M parameters).
    "bigs-large": dict(dim=1024, num_layers=23, inner_dim=3072, architecture="gated", dropout=0.1),
    # Appendix A.1: the 12-layer BiGS used at 4,096 tokens (paper: 119M parameters, no
    # width given; d 768 here gives ~116M, and ~119M with 4,096 learned positions).
    "bigs-12": dict(dim=768, num_layers=12, inner_dim=2304, architecture="gated", dropout=0.1),
    # Table 7: 24 STACK layers, d 1024, inner 4096, attention; learned positions to 512.
    "bert-large": dict(
        dim=1024,
        num_layers=24,
        inner_dim=4096,
        architecture="stack",
        routing="attention",
        num_heads=16,
        max_length=512,
        num_token_types=2,
        dropout=0.1,
    ),
    # Small models for tests and CPU experiments, at the paper's initial scale for their
    # width (0.02 sqrt(1024 / 64); see `BiGS`'s "Initialisation").
    "bigs-tiny": dict(
        dim=64, num_layers=2, inner_dim=192, architecture="gated", dropout=0.1, init_std=0.08
    ),
    "bert-tiny": dict(
        dim=64,
        num_layers=2,
        inner_dim=256,
        architecture="stack",
        routing="attention",
        max_length=512,
        dropout=0.1,
        init_std=0.08,
    ),
}
"""Named configurations for [`lineax_seq.BiGS.from_config`][] (keyword arguments of
[`lineax_seq.BiGS`][] except `vocab_size` and `key`)."""


def _check_like_tokens(tokens: Array | np.ndarray, **others: Array | np.ndarray | None) -> None:
    """A `TypeError` unless `tokens` holds integers, a `ValueError` unless it is 1-d and
    each of `others` (if given) has its shape (a length-1 array would broadcast silently)."""
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"tokens must be integer ids, got tokens.dtype={tokens.dtype}")
    if tokens.ndim != 1:
        raise ValueError(f"tokens must have shape (length,), got tokens.shape={tokens.shape}")
    for name, a in others.items():
        if a is not None and a.shape != tokens.shape:
            raise ValueError(
                f"{name} must have shape {tokens.shape} like tokens, got {name}.shape={a.shape}"
            )


def _embedding(num: int, dim: int, std: float, key: PRNGKeyArray) -> eqx.nn.Embedding:
    return eqx.nn.Embedding(weight=std * jr.truncated_normal(key, -2.0, 2.0, (num, dim)))


@eqx.filter_jit
def _build(
    layer_cls: type,
    settings: tuple,
    vocab_size: int,
    dim: int,
    num_layers: int,
    max_length: int | None,
    num_token_types: int,
    final_norm: bool,
    key: PRNGKeyArray,
) -> tuple:
    """Every array of a `BiGS`, as ONE compiled program (op by op, building the stacked
    layers under `filter_vmap` would compile each primitive separately). Cached on the
    static arguments, so a second model of the same configuration does not recompile."""
    tok_key, pos_key, type_key, layer_key = jr.split(key, 4)
    make = lambda k: layer_cls(dim, key=k, **dict(settings))
    std = dict(settings)["init_std"]
    return (
        _embedding(vocab_size, dim, std, tok_key),
        None if max_length is None else _embedding(max_length, dim, std, pos_key),
        _embedding(num_token_types, dim, std, type_key) if num_token_types else None,
        eqx.nn.LayerNorm(dim, eps=1e-6),
        eqx.filter_vmap(make)(jr.split(layer_key, num_layers)),
        eqx.nn.LayerNorm(dim, eps=1e-6) if final_norm else None,
    )


def _stacked(x: object) -> bool:
    """Whether `x` is one of the stacked layers' arrays (a leading layer axis; a
    `jax.ShapeDtypeStruct` in a model from `eqx.filter_eval_shape`), not a 0-d array that
    `jax.device_put` or `jax.jit` made of a scalar field (a dropout rate)."""
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct) and x.ndim > 0


def _scalar_fields(layers):
    """`layers` with concrete 0-d arrays (scalar fields, such as the dropout rates, that
    `jax.device_put` made arrays of) as Python scalars again, so that the jitted scan
    sees them as the constants they are (a rate of 0 needs no key)."""
    concrete = lambda x: eqx.is_array(x) and x.ndim == 0 and not isinstance(x, jax.core.Tracer)
    return jax.tree.map(lambda x: x.item() if concrete(x) else x, layers)


# Jitted, so that an eager call compiles the scan over the layers once per structure and
# shape (its body is a fresh closure, which eager JAX would compile anew on every call).
@eqx.filter_jit
def _run_layers(layers, h, mask, layer_keys, inference):
    """`h` through the stacked `layers` in order, one `lax.scan` over the stacked arrays
    (those with a leading layer axis; `jax.device_put` or `jax.jit` also turn scalars such
    as a dropout rate into 0-d arrays, which are shared, not scanned)."""
    params, static = eqx.partition(layers, _stacked)

    def step(h, xs):
        layer_params, layer_key = xs
        layer = eqx.combine(layer_params, static)
        return layer._masked_apply(h, mask, layer_key, inference), None

    return jax.lax.scan(step, h, (params, layer_keys))[0]


class BiGS(eqx.Module):
    """Bidirectional encoder: BiGS (GATED/SSM), STACK/SSM, GATED/ATT or BERT (STACK/ATT).

    ```
    h = Dropout(LN(E_tok[tokens] (+ E_pos[0..L-1]) (+ E_type[token_types])))
    h = layer_{num_layers}( ... layer_1(h, mask) ... )      # GatedLayer or StackLayer
    h = LN(h)                                               # if final_norm
    ```

    `architecture` picks [`lineax_seq.GatedLayer`][] or [`lineax_seq.StackLayer`][] and
    `routing` the SSM or attention routing, so the paper's Table 1 ablation is one loop.
    Without absolute positions (`max_length=None`, the default) the model accepts any
    sequence length at call time (the SSM kernels are generated for it): a model
    pretrained at 128 tokens runs at 512 or 4,096 unchanged. Attention routing has no
    other source of order, so BERT needs `max_length` (the named BERT configurations
    set it); without it the attention model sees a bag of tokens.

    The layers are stored stacked (every array has a leading `num_layers` axis) and run
    with `jax.lax.scan`, so compile time does not grow with depth; `model.layer(i)` is
    the `i`-th layer as an ordinary module.

    Works on one example; `jax.vmap` over a batch. With `mask` (`True` at real tokens,
    padding trailing) outputs at real positions do not depend on padding, and padded
    positions of the output are zero.

    **Initialisation.** Every weight is truncated normal with std `init_std` (BERT's
    0.02, the paper's), biases zero. 0.02 is tuned to widths near 1,024: a pre-activation
    `W x` of a unit-variance `x` has std `init_std * sqrt(d)`, and the GATED layer
    multiplies several such small branches, so at `d = 64` a fresh BiGS layer changes its
    input by ~1e-7 of its norm and GATED/ATT by ~1e-10 (its attention then hardly
    trains), against ~5e-3 and ~1e-4 at `d = 1024`. `init_std = 0.02 * sqrt(1024 / d)`
    gives a small model the paper's scales (0.08 at `d = 64`).
    """

    token_embedding: eqx.nn.Embedding
    position_embedding: eqx.nn.Embedding | None
    token_type_embedding: eqx.nn.Embedding | None
    embedding_norm: eqx.nn.LayerNorm
    dropout: eqx.nn.Dropout
    layers: GatedLayer | StackLayer
    final_norm: eqx.nn.LayerNorm | None
    dim: int = eqx.field(static=True)
    architecture: str = eqx.field(static=True)
    routing: str = eqx.field(static=True)
    inner_dim: int = eqx.field(static=True)
    num_heads: int | None = eqx.field(static=True)
    max_length: int | None = eqx.field(static=True)
    num_token_types: int = eqx.field(static=True)
    state_size: int = eqx.field(static=True)
    kernel: str = eqx.field(static=True)
    ssm_init: str = eqx.field(static=True)
    dt_min: float = eqx.field(static=True)
    dt_max: float = eqx.field(static=True)
    dropout_rate: float = eqx.field(static=True)
    init_std: float = eqx.field(static=True)

    def __init__(
        self,
        vocab_size: IntLike,
        dim: IntLike = 1024,
        num_layers: IntLike = 23,
        *,
        architecture: Literal["gated", "stack"] = "gated",
        routing: Literal["ssm", "attention"] = "ssm",
        inner_dim: IntLike | None = None,
        num_heads: IntLike | None = None,
        max_length: IntLike | None = None,
        num_token_types: IntLike = 0,
        state_size: IntLike = 64,
        kernel: Literal["shared", "per_channel"] = "shared",
        ssm_init: Literal["lin", "inv", "real", "legs"] = "legs",
        dt_min: RealScalar = 0.01,
        dt_max: RealScalar = 1.0,
        dropout: RealScalar = 0.0,
        final_norm: bool = True,
        init_std: RealScalar = 0.02,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `vocab_size`: number of token ids; ids must lie in `[0, vocab_size)`.
        - `dim`: model width `d`.
        - `num_layers`: number of layers.
        - `architecture`: `"gated"` ([`lineax_seq.GatedLayer`][]) or `"stack"`
            ([`lineax_seq.StackLayer`][]).
        - `routing`: `"ssm"` or `"attention"`.
        - `inner_dim`: gated `V`/`U` width (default `3 d`) or stack feed-forward width
            (default `4 d`).
        - `num_heads`: attention heads (default `max(1, d // 64)`, or the largest count
            below it that divides `d`).
        - `max_length`: if given, learned absolute position embeddings up to this length
            (and calls are limited to it); `None` (default): no absolute positions.
        - `num_token_types`: if positive, learned token-type (segment) embeddings.
        - `state_size`, `kernel`, `ssm_init`, `dt_min`, `dt_max`: the SSMs, see
            [`lineax_seq.DirectionalSSM`][].
        - `dropout`: dropout rate after the embeddings and on every residual branch
            (default 0, as Equinox's layers: calls need no key; the paper trains with
            0.1, which the named configurations set).
        - `final_norm`: a LayerNorm after the last (pre-LN) layer.
        - `init_std`: std of the truncated-normal weights and embeddings (BERT's 0.02;
            see "Initialisation" above for small widths).
        - `key`: a `jax.random.key`.
        """
        check_key("key", key)
        vocab_size = check_int("vocab_size", vocab_size)
        dim = check_int("dim", dim)
        num_layers = check_int("num_layers", num_layers)
        check_choice("architecture", architecture, ARCHITECTURES)
        check_choice("routing", routing, ROUTINGS)
        check_choice("kernel", kernel, KERNELS)
        if max_length is not None:
            max_length = check_int("max_length", max_length)
        num_token_types = check_int("num_token_types", num_token_types, minimum=0)
        final_norm = check_bool("final_norm", final_norm)
        dropout = check_dropout(dropout)
        init_std = check_init_std(init_std)
        dt_min, dt_max = check_kernel_options(
            state_size, ssm_init, "zoh", dt_min, dt_max, init_name="ssm_init"
        )
        # Plain Python numbers: `_build` traces NumPy scalars, and `config()` is JSON.
        state_size = int(state_size)
        if num_heads is not None:
            num_heads = check_int("num_heads", num_heads)
        layer_cls = GatedLayer if architecture == "gated" else StackLayer
        if inner_dim is None:
            inner_dim = layer_cls._inner_factor * dim
        inner_dim = check_int("inner_dim", inner_dim)
        settings = dict(
            inner_dim=inner_dim,
            routing=routing,
            num_heads=num_heads,
            state_size=state_size,
            kernel=kernel,
            ssm_init=ssm_init,
            dt_min=dt_min,
            dt_max=dt_max,
            dropout=dropout,
            init_std=init_std,
        )
        (
            self.token_embedding,
            self.position_embedding,
            self.token_type_embedding,
            self.embedding_norm,
            self.layers,
            self.final_norm,
        ) = _build(
            layer_cls,
            tuple(settings.items()),
            vocab_size,
            dim,
            num_layers,
            max_length,
            num_token_types,
            final_norm,
            key,
        )
        self.dropout = eqx.nn.Dropout(dropout)
        self.dim = dim
        self.architecture = architecture
        self.routing = routing
        self.inner_dim = inner_dim
        self.num_heads = num_heads
        self.max_length = max_length
        self.num_token_types = num_token_types
        self.state_size = state_size
        self.kernel = kernel
        self.ssm_init = ssm_init
        self.dt_min = dt_min
        self.dt_max = dt_max
        self.dropout_rate = dropout
        self.init_std = init_std

    @classmethod
    def from_config(
        cls, name: str, *, vocab_size: IntLike = 30522, key: PRNGKeyArray, **overrides: Any
    ) -> "BiGS":
        """Build a named configuration from [`lineax_seq.BIGS_CONFIGS`][].

        `"bigs-large"` (23 GATED/SSM layers, d 1024, inner 3072: ~345M parameters with
        BERT's 30,522-token vocabulary), `"bigs-12"` (12 layers, d 768: ~116M),
        `"bert-large"` (24 STACK/ATT layers, d 1024, inner 4096, 16 heads, positions to
        512, 2 token types: ~334M), `"bigs-tiny"` and `"bert-tiny"` (2 layers, d 64,
        `init_std` 0.08; positions to 512 for `"bert-tiny"` only); all five with the
        paper's dropout 0.1 (on the embeddings and the residual branches; there is no
        dropout on attention probabilities, which BERT also has).

        Overrides keep the other settings: `routing="attention"` on `"bigs-large"` has
        ~490M parameters (`19 d^2` per layer); match sizes with a smaller `inner_dim`.
        The BiGS configurations have no absolute positions (`max_length=None`): with
        `routing="attention"` pass `max_length=` too, or the model sees a bag of tokens.

        **Arguments:**

        - `name`: a key of `BIGS_CONFIGS`.
        - `vocab_size`: vocabulary size (default BERT's 30,522).
        - `key`: a `jax.random.key`.
        - `**overrides`: any other [`lineax_seq.BiGS`][] argument (e.g. `routing=`).

        **Returns:**

        The model.
        """
        check_choice("name", name, tuple(sorted(BIGS_CONFIGS)))
        return cls(vocab_size, key=key, **{**BIGS_CONFIGS[name], **overrides})

    @property
    def num_layers(self) -> int:
        """The number of layers: the stacked layers' axis (so it follows an `eqx.tree_at`
        that cuts or stacks layers), read before a layer's own axes, so that the models of
        an `eqx.filter_vmap` ensemble give theirs, not the ensemble's size."""
        return self._layer_weight().shape[-3]

    def _layer_weight(self) -> Array | jax.ShapeDtypeStruct:
        """A stacked weight of every layer, `(..., num_layers, out, in)`."""
        layers = self.layers
        return (layers.v_proj if isinstance(layers, GatedLayer) else layers.mlp_in).weight

    @property
    def vocab_size(self) -> int:
        """The number of token ids: the token embedding's rows (so it follows an
        `eqx.tree_at` that resizes the vocabulary)."""
        return self.token_embedding.weight.shape[-2]

    def config(self) -> dict[str, Any]:
        """The constructor arguments (plain ints/floats/strings, JSON-serialisable), so
        that `BiGS(**model.config(), key=key)` rebuilds the same structure; `dropout` is
        the largest rate of the model's dropout modules (as `eqx.tree_at` left them)."""
        return dict(
            vocab_size=self.vocab_size,
            dim=self.dim,
            num_layers=self.num_layers,
            architecture=self.architecture,
            routing=self.routing,
            inner_dim=self.inner_dim,
            num_heads=self.num_heads,
            max_length=self.max_length,
            num_token_types=self.num_token_types,
            state_size=self.state_size,
            kernel=self.kernel,
            ssm_init=self.ssm_init,
            dt_min=self.dt_min,
            dt_max=self.dt_max,
            dropout=largest_rate(self._dropouts(), self.dropout_rate),  # as `tree_at` left it
            final_norm=self.final_norm is not None,
            init_std=self.init_std,
        )

    def _dropouts(self) -> list[eqx.nn.Dropout]:
        """The model's dropout modules, the embedding's first."""
        is_dropout = lambda x: isinstance(x, eqx.nn.Dropout)
        return [x for x in jax.tree.leaves(self, is_leaf=is_dropout) if is_dropout(x)]

    def layer(self, i: SupportsIndex) -> GatedLayer | StackLayer:
        """The `i`-th layer as an ordinary module (`-num_layers <= i < num_layers`;
        negative `i` counts from the last layer, as Python indexing does)."""
        if self._layer_weight().ndim != 3:
            raise ValueError(
                "layer(i) of an ensemble of models (eqx.filter_vmap) would index the "
                "ensemble: call it under eqx.filter_vmap, once per model"
            )
        n = self.num_layers
        index = None if isinstance(i, bool) else getattr(i, "__index__", None)
        if index is None or not -n <= index() < n:
            raise ValueError(f"i must be an integer in [-{n}, {n}), got i={i!r}")
        i = index()  # also NumPy integers
        return jax.tree.map(lambda x: x[i] if _stacked(x) else x, self.layers)

    def kernels(self, length: IntLike) -> Float[Array, "layers 2 kc {length}"]:
        """Every layer's forward and backward SSM kernels (`routing="ssm"` only).

        **Arguments:**

        - `length`: kernel length.

        **Returns:**

        Shape `(num_layers, 2, kc, length)`: `[:, 0]` forward (weight of the input `j`
        positions before), `[:, 1]` backward (`j` positions after); `kc` = 1 for the
        shared kernel, `dim` per channel.
        """
        if self.routing != "ssm":
            raise ValueError(f"kernels() needs routing='ssm', the model has {self.routing!r}")
        params, static = eqx.partition(self.layers, _stacked)
        return jax.vmap(lambda p: jnp.stack(eqx.combine(p, static).kernels(length)))(params)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self,
        tokens: Integer[Array | np.ndarray, " length"],
        mask: Bool[Array | np.ndarray, " length"] | None = None,
        token_types: Integer[Array | np.ndarray, " length"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> Float[Array, "length {self.dim}"]:
        """Encode one sequence.

        **Arguments:**

        - `tokens`: token ids in `[0, vocab_size)`, shape `(length,)`, `length >= 1`.
            Out-of-range ids raise an error (at once, or at run time under `jit`: a
            `jax.errors.JaxRuntimeError` with the message, on a mesh too) instead of
            being clamped; at padded positions any id is accepted.
        - `mask`: optional, shape `(length,)`, `True` at real tokens, then `False` at
          trailing padding (any other mask is an error: at once, or at run time under
          `jit` or `jax.vmap`).
        - `token_types`: optional segment ids in `[0, num_token_types)`, shape `(length,)`.
        - `key`: dropout key (needed when `dropout > 0` and not `inference`).
        - `inference`: disable dropout; `None` (default) defers to the dropout modules'
          own flag, which `eqx.nn.inference_mode` sets (the flags of one model must agree).

        **Returns:**

        Hidden states, shape `(length, dim)`; zero at padded positions.
        """
        tokens, mask, token_types = host_arrays(tokens, mask, token_types)
        _check_like_tokens(tokens, mask=mask, token_types=token_types)
        check_mask_dtype(mask)
        length = tokens.shape[0]
        if length == 0:
            raise ValueError("tokens must contain at least one token, got length 0")
        if self.max_length is not None and length > self.max_length:
            raise ValueError(
                f"tokens has length {length} > max_length={self.max_length} "
                "(the absolute position embeddings)"
            )
        # One decision for every layer (`None`: the embedding dropout's own flag), on the
        # rates of all the dropout modules; the static rate stands in for traced ones.
        inference = resolve_inference(self._dropouts(), key, inference, rate=self.dropout_rate)
        # Padded positions may hold any id (their outputs are zeroed): only real tokens
        # are range-checked, and pads are read as id 0.
        tokens = check_ids("tokens", tokens, self.vocab_size, "vocab_size", where=mask)
        check_trailing_mask(mask)
        tokens, mask = as_arrays(tokens, mask)
        if mask is not None:
            tokens = jnp.where(mask, tokens, 0)
        h = self.token_embedding.weight[tokens]
        if self.position_embedding is not None:
            h = h + self.position_embedding.weight[:length]
        if token_types is not None:
            if self.token_type_embedding is None:
                raise ValueError("token_types given but the model has num_token_types=0")
            token_types = check_ids(
                "token_types", token_types, self.num_token_types, "num_token_types", mask
            )
            (token_types,) = as_arrays(token_types)
            if mask is not None:
                token_types = jnp.where(mask, token_types, 0)
            h = h + self.token_type_embedding.weight[token_types]
        elif self.token_type_embedding is not None:
            h = h + self.token_type_embedding.weight[0]
        keys = (None, None) if key is None else tuple(jr.split(key))
        h = apply_dropout(self.dropout, apply_norm(self.embedding_norm, h), keys[0], inference)
        if mask is not None:
            h = jnp.where(mask[:, None], h, 0)
        layer_keys = None if keys[1] is None else jr.split(keys[1], self.num_layers)
        h = _run_layers(_scalar_fields(self.layers), h, mask, layer_keys, inference)
        if self.final_norm is not None:
            h = apply_norm(self.final_norm, h)
            if mask is not None:
                h = jnp.where(mask[:, None], h, 0)
        return h
