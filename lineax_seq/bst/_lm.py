"""Block-State Transformer language model and the SLIDE / BRECT baselines."""

import math
import numbers
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from beartype import beartype
from jaxtyping import Array, Float, Int, Integer, PRNGKeyArray, jaxtyped

from .._checks import (
    IntLike,
    RealScalar,
    check_bool,
    check_choice,
    check_ids,
    check_instance,
    check_int,
    check_key,
    check_real_or_traced,
    host_arrays,
)
from .._nn import apply_linear, varying_like
from .._numerics import work_dtype
from ..attention import MultiHeadAttention
from ..attention._core import check_implementation
from ..attention._window import check_blocks, check_window
from ..ssm import HyenaFilter
from ..ssm._kernel import check_kernel_options
from ._layers import (
    CONTEXTS,
    BlockRecurrentTransformerLayer,
    BlockStateTransformerLayer,
    SlidingWindowLayer,
    _norm,
)
from ._ssm import SSMS, check_cache, check_position, expected_cache, held_positions

PAPER_BST_LAYERS = (1, 7, 9)
VARIANTS = (
    "SLIDE",
    "BRECT",
    "BRECT:FIXED:SKIP",
    "BST:SH:S4",
    "BST:MH:S4",
    "BST:MF:S4",
    "BST:SH:UNSTRUCT",
    "BST:MH:UNSTRUCT",
    "BST:MF:UNSTRUCT",
)

Layer = SlidingWindowLayer | BlockStateTransformerLayer | BlockRecurrentTransformerLayer


def _scaled_paper_layers(num_layers: int) -> tuple[int, ...]:
    """The paper's BST placement {1, 7, 9} of 12, rescaled to `num_layers` (rounded half
    up: three distinct layers from 4 layers on, e.g. `(1, 4, 5)` of 6)."""
    scaled = {min(num_layers - 1, math.floor(i * num_layers / 12 + 0.5)) for i in PAPER_BST_LAYERS}
    return tuple(sorted(scaled))


def _check_indices(name: str, indices: object, num_layers: int) -> tuple[int, ...]:
    if isinstance(indices, str) or not isinstance(indices, Sequence | np.ndarray):
        raise TypeError(f"`{name}` must be a sequence of layer indices, got {name}={indices!r}.")
    indices = tuple(indices)
    ok = lambda i: isinstance(i, numbers.Integral) and not isinstance(i, bool)
    bad = [i for i in indices if not (ok(i) and 0 <= i < num_layers)]
    if bad or len(set(indices)) != len(indices):
        raise ValueError(
            f"`{name}` must be distinct layer indices in [0, {num_layers}), got {name}={indices}."
        )
    return tuple(int(i) for i in indices)


def variant_config(variant: str, num_layers: IntLike = 12) -> dict:
    """Constructor keywords of [`lineax_seq.BlockStateTransformerLM`][] for a paper variant.

    **Arguments:**

    - `variant`: one of `"SLIDE"`, `"BRECT:FIXED:SKIP"` (alias `"BRECT"`), or
      `"BST:{SH,MH,MF}:{S4,UNSTRUCT}"` (case-insensitive).
    - `num_layers`: depth of the stack (BST layer indices are the paper's `(1, 7, 9)` of
      12, rescaled and rounded half up: `(1, 4, 5)` of 6, `(0, 2, 3)` of 4, fewer than
      three below 4 layers; the BRECT recurrent layer is the third from the top, index
      `num_layers - 3` (0 below 3 layers), 9 of 12, as in the Block-Recurrent
      Transformer's reference code, google-research/meliad).

    **Returns:**

    A dict with `bst_layers` and `recurrent_layers`, and for BST variants `context` and
    `ssm`.
    """
    num_layers = check_int("num_layers", num_layers)
    name = variant.upper() if isinstance(variant, str) else variant
    if name not in VARIANTS:
        raise ValueError(f"unknown `variant`={variant!r}; expected one of {VARIANTS}.")
    if name == "SLIDE":
        return {"bst_layers": (), "recurrent_layers": ()}
    if name.startswith("BRECT"):
        return {"bst_layers": (), "recurrent_layers": (max(num_layers - 3, 0),)}
    _, context, ssm = name.split(":")
    return {
        "bst_layers": _scaled_paper_layers(num_layers),
        "recurrent_layers": (),
        "context": context.lower(),
        "ssm": ssm.lower(),
    }


def _check_rank(tokens: Array | np.ndarray) -> None:
    """A `ValueError` unless `tokens` is 1-d (one sequence: a batch is `jax.vmap`'s)."""
    if tokens.ndim != 1:
        raise ValueError(
            f"`tokens` must have shape (length,) (one sequence: jax.vmap over a batch), "
            f"got shape {tokens.shape}."
        )


class BlockStateTransformerLM(eqx.Module):
    """Block-State Transformer language model (and the SLIDE / BRECT baselines).

    Token embedding, `num_layers` block transformer layers, final LayerNorm and an LM
    head (tied to the embedding by default). There are no absolute position embeddings:
    every layer has a T5 relative position bias and the SSM layers carry position.

    - Layers listed in `bst_layers` are [`lineax_seq.BlockStateTransformerLayer`][]s
      (SSM + context states, `context=` / `ssm=`); the paper uses `(1, 7, 9)` of 12.
    - Layers listed in `recurrent_layers` are
      [`lineax_seq.BlockRecurrentTransformerLayer`][]s (BRECT:FIXED:SKIP).
    - All others are [`lineax_seq.SlidingWindowLayer`][]s.

    So `bst_layers=()` is SLIDE, `bst_layers=(), recurrent_layers=(9,)` is BRECT, and
    [`lineax_seq.BlockStateTransformerLM.from_variant`][] builds the paper's named
    variants. The model runs on any length that is a multiple of `window` (the SSM
    kernels are generated for the actual length).
    """

    embedding: eqx.nn.Embedding
    layers: tuple[Layer, ...]
    final_norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear | None
    dim: int = eqx.field(static=True)
    window: int = eqx.field(static=True)
    dt_min: float = eqx.field(static=True)
    dt_max: float = eqx.field(static=True)

    def __init__(
        self,
        vocab_size: IntLike,
        dim: IntLike = 1024,
        num_layers: IntLike = 12,
        *,
        num_heads: IntLike = 8,
        window: IntLike = 512,
        mlp_dim: IntLike | None = None,
        bst_layers: Sequence[IntLike] | np.ndarray | None = None,
        context: str = "sh",
        ssm: str = "s4",
        state_size: IntLike = 16,
        dt_min: RealScalar = 1e-3,
        dt_max: RealScalar = 1e-1,
        ssm_features: IntLike | None = None,
        num_filters: IntLike = 32,
        recurrent_layers: Sequence[IntLike] | np.ndarray = (),
        num_states: IntLike | None = None,
        max_length: IntLike | None = None,
        tie_embeddings: bool = True,
        attention_implementation: str | None = None,
        key: PRNGKeyArray,
    ):
        """The defaults are the paper's language models (Table 2.1): 12 layers, width
        1024, 8 heads of 128, MLP 4096, `W = 512` (with its 32k vocabulary, SLIDE has
        184M parameters and BRECT 193M; the paper: 190M, 196M).

        **Arguments:**

        - `vocab_size`: number of tokens.
        - `dim`: model width; divisible by `num_heads` (the SSM width defaults to
          `dim // 4`, `dim // 8` for `"mf"`: use `dim >= 8` or give `ssm_features`).
        - `num_layers`: number of layers.
        - `num_heads`: attention heads.
        - `window`: block / window size `W`.
        - `mlp_dim`: MLP hidden size (default `4 * dim`).
        - `bst_layers`: 0-based indices of the BST layers; `None` means the paper's
          `(1, 7, 9)` of 12 (sections 2.4.1 and A) rescaled to `num_layers` (as in
          [`lineax_seq.bst_variant_config`][]); `()` gives
          SLIDE. The paper is not consistent about where it counts from: it also puts an
          SSM "at the first layer, right after the word embedding layer" and its
          ablations (Tables 2.3, 2.4) use indices `(0, 7, 9)`; pass that for this
          reading.
        - `context`, `ssm`, `state_size`, `dt_min`, `dt_max`, `ssm_features`,
          `num_filters`: of the BST layers (see [`lineax_seq.BlockStateTransformerLayer`][]);
          checked also where the model has none.
        - `recurrent_layers`: indices of BRECT:FIXED:SKIP layers.
        - `num_states`: recurrent states of BRECT layers (default `window`); checked also
          where the model has none.
        - `max_length`: training length, by which the UNSTRUCT filters normalise
          positions; required for `ssm="unstruct"`, and otherwise `None` or a positive
          integer (unused by `ssm="s4"`: S4D kernels have no length scale).
        - `tie_embeddings`: use the embedding matrix as the LM head (the embedding is
          initialised with standard deviation 0.02, as in GPT-2).
        - `attention_implementation`: the attention kernel of the parallel forward pass,
          `None` / `"xla"` or `"cudnn"` (cuDNN flash attention: NVIDIA GPUs, float16 /
          bfloat16 weights; see [`lineax_seq.MultiHeadAttention`][]), also in `prefill`;
          `step` and `generate`'s decoding steps always use XLA.
        - `key`: PRNG key.
        """
        check_key("key", key)
        vocab_size = check_int("vocab_size", vocab_size)
        dim = check_int("dim", dim)
        num_layers = check_int("num_layers", num_layers)
        num_heads = check_int("num_heads", num_heads)
        window = check_window(window)
        check_bool("tie_embeddings", tie_embeddings)
        check_implementation(attention_implementation, "attention_implementation")
        if dim % num_heads:
            raise ValueError(f"`num_heads`={num_heads} must divide `dim`={dim}.")
        check_choice("context", context, CONTEXTS)
        check_choice("ssm", ssm, SSMS)
        if ssm == "unstruct" and max_length is None and (bst_layers is None or len(bst_layers)):
            raise ValueError('`max_length` (the training length) is required for ssm="unstruct".')
        dt_min, dt_max = check_kernel_options(state_size, "lin", "zoh", dt_min, dt_max)
        check_int("num_filters", num_filters)
        for name, size in [
            ("mlp_dim", mlp_dim),
            ("ssm_features", ssm_features),
            ("num_states", num_states),
            ("max_length", max_length),
        ]:
            if size is not None:
                check_int(name, size)
        bst = (
            _scaled_paper_layers(num_layers)
            if bst_layers is None
            else _check_indices("bst_layers", bst_layers, num_layers)
        )
        rec = _check_indices("recurrent_layers", recurrent_layers, num_layers)
        if set(bst) & set(rec):
            raise ValueError(f"`bst_layers`={bst} and `recurrent_layers`={rec} must not overlap.")
        ke, kh, *kl = jr.split(key, num_layers + 2)
        # GPT-2 style: small embeddings, so that the tied head starts near uniform.
        self.embedding = eqx.nn.Embedding(weight=0.02 * jr.normal(ke, (vocab_size, dim)))
        layers: list[Layer] = []
        for i in range(num_layers):
            if i in bst:
                layer = BlockStateTransformerLayer(
                    dim,
                    num_heads,
                    window,
                    context=context,
                    ssm=ssm,
                    state_size=state_size,
                    dt_min=dt_min,
                    dt_max=dt_max,
                    ssm_features=ssm_features,
                    num_filters=num_filters,
                    mlp_dim=mlp_dim,
                    max_length=max_length,
                    attention_implementation=attention_implementation,
                    key=kl[i],
                )
            elif i in rec:
                layer = BlockRecurrentTransformerLayer(
                    dim,
                    num_heads,
                    window,
                    num_states=num_states,
                    mlp_dim=mlp_dim,
                    attention_implementation=attention_implementation,
                    key=kl[i],
                )
            else:
                layer = SlidingWindowLayer(
                    dim,
                    num_heads,
                    window,
                    mlp_dim=mlp_dim,
                    attention_implementation=attention_implementation,
                    key=kl[i],
                )
            layers.append(layer)
        self.layers = tuple(layers)
        self.final_norm = eqx.nn.LayerNorm(dim)
        self.head = None if tie_embeddings else eqx.nn.Linear(dim, vocab_size, key=kh)
        self.dim = dim
        self.window = window
        self.dt_min, self.dt_max = dt_min, dt_max

    @property
    def vocab_size(self) -> int:
        """The number of tokens: the embedding's rows (so it follows an `eqx.tree_at`
        that resizes the vocabulary; with an untied `head`, resize that too)."""
        return self.embedding.weight.shape[-2]

    def config(self) -> dict[str, Any]:
        """The constructor arguments (plain ints/floats/strings/bools and lists of ints,
        JSON-serialisable), read off the model's layers, so that
        `BlockStateTransformerLM(**model.config(), key=key)` rebuilds its structure (with
        new weights): e.g. a template for [`lineax_seq.load_checkpoint`][]. Options of a
        kind of layer the model has none of are their defaults."""
        layers = self.layers
        first = layers[0]
        attention = (
            first.attention if isinstance(first, SlidingWindowLayer) else first.self_attention
        ).attention
        bst = {i: x for i, x in enumerate(layers) if isinstance(x, BlockStateTransformerLayer)}
        rec = {i: x for i, x in enumerate(layers) if isinstance(x, BlockRecurrentTransformerLayer)}
        out = dict(
            vocab_size=self.vocab_size,
            dim=self.dim,
            num_layers=len(layers),
            num_heads=attention.num_heads,
            window=self.window,
            mlp_dim=first.mlp.up.out_features,
            bst_layers=list(bst),
            context="sh",
            ssm="s4",
            state_size=16,
            dt_min=self.dt_min,
            dt_max=self.dt_max,
            ssm_features=None,
            num_filters=32,
            recurrent_layers=list(rec),
            num_states=next(iter(rec.values())).initial_state.shape[-2] if rec else None,
            max_length=None,
            tie_embeddings=self.head is None,
            attention_implementation=attention.implementation,
        )
        if bst:
            layer = next(iter(bst.values()))
            ssm, kernel = layer.ssm, layer.ssm.kernel
            out |= dict(context=layer.context_kind, ssm=ssm.ssm, ssm_features=ssm.features)
            if isinstance(kernel, HyenaFilter):
                out["max_length"] = kernel.max_length
            else:
                out["state_size"] = kernel.state_size
            if layer.context_kind == "mf":
                out["num_filters"] = ssm.streams
        return out

    @classmethod
    def from_variant(
        cls,
        variant: str,
        vocab_size: IntLike,
        dim: IntLike = 1024,
        num_layers: IntLike = 12,
        *,
        key: PRNGKeyArray,
        **kwargs,
    ) -> "BlockStateTransformerLM":
        """Build a paper variant by name.

        **Arguments:**

        - `variant`: `"SLIDE"`, `"BRECT:FIXED:SKIP"` (or `"BRECT"`),
          `"BST:SH:S4"`, `"BST:MH:S4"`, `"BST:MF:UNSTRUCT"`, ... (see
          [`lineax_seq.bst_variant_config`][]).
        - `vocab_size`, `dim`, `num_layers`, `key`, `**kwargs`: as for the constructor;
          `kwargs` override the variant's defaults.

        **Returns:**

        The model.
        """
        config = variant_config(variant, num_layers) | kwargs
        return cls(vocab_size, dim, num_layers, key=key, **config)

    def _check_tokens(
        self, tokens: Integer[Array | np.ndarray, "*length"], name: str = "tokens"
    ) -> Integer[Array, "*length"]:
        """`tokens` as a JAX array, checked to be ids in `[0, vocab_size)` before the
        conversion (in their own type: `jnp.asarray` wraps int64 ids in 32-bit JAX)."""
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise TypeError(f"`{name}` must hold integer tokens, got dtype {tokens.dtype}.")
        return jnp.asarray(check_ids(name, tokens, self.vocab_size, "vocab_size"))

    def _logits(self, x: Float[Array, "*batch dim"]) -> Float[Array, "*batch vocab"]:
        x = _norm(self.final_norm, x)
        if self.head is None:
            return x @ self.embedding.weight.T
        return apply_linear(self.head, x)

    @jaxtyped(typechecker=beartype)
    def __call__(
        self, tokens: Integer[Array | np.ndarray, " length"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "length vocab"]:
        """Next-token logits.

        **Arguments:**

        - `tokens`: integer tokens in `[0, vocab_size)`, shape `(length,)`, `length` a
          multiple of `window`. Out-of-range ids raise an error (at once, or at run time
          under `jit`: a `jax.errors.JaxRuntimeError` with the message, on a mesh too)
          instead of being clamped.
        - `key`: ignored (the model is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        Logits of shape `(length, vocab_size)`; row `t` depends on `tokens[: t + 1]`:
        exactly for SLIDE, BRECT and S4 SH / MF layers; through the FFT convolutions of
        `ssm="unstruct"` and `context="mh"`, later tokens move earlier rows by rounding
        (~1e-7 in float32), as [`lineax_seq.fft_conv`][] documents.
        """
        (tokens,) = host_arrays(tokens)
        _check_rank(tokens)
        check_blocks(tokens.shape[0], self.window, "tokens")
        x = self.embedding.weight[self._check_tokens(tokens)]
        for layer in self.layers:
            x = layer(x)
        return self._logits(x)

    def prefill(
        self, tokens: Integer[Array | np.ndarray, " length"], max_length: IntLike
    ) -> tuple[dict, Float[Array, "length vocab"]]:
        """Feed a prompt in one parallel pass: the decoding cache and logits as `step`
        would give them token by token, at the cost of the forward pass.

        **Arguments:**

        - `tokens`: integer tokens in `[0, vocab_size)`, shape `(length,)`, `length` a
          multiple of `window`.
        - `max_length`: the cache's capacity, as in `init_cache`; at least `length`.

        **Returns:**

        `(cache, logits)`: the cache after `tokens` (`step` continues from position
        `length`) and `self(tokens)`, shape `(length, vocab_size)`.
        """
        (tokens,) = host_arrays(tokens)
        _check_rank(tokens)
        check_blocks(tokens.shape[0], self.window, "tokens")
        capacity = check_int("max_length", max_length)
        if capacity < tokens.shape[0]:
            raise ValueError(
                f"`max_length`={capacity} must be at least the number of tokens, {tokens.shape[0]}."
            )
        blocks = jnp.asarray(tokens.shape[0] // self.window, jnp.int32)
        if held_positions(expected_cache(self.init_cache, capacity)) is None:
            capacity = tokens.shape[0]  # unused by fixed-size caches: compile once
        return _jitted_prefill(self, self._check_tokens(tokens), blocks, capacity)

    def _prefill(
        self, tokens: Integer[Array, " length"], blocks: Int[Array, ""], max_length: int
    ) -> tuple[dict, Float[Array, "length dim"]]:
        """The cache after the first `blocks` blocks of `tokens` (later ones, if any, do
        not reach it) and the final hidden states of all of `tokens`."""
        x = self.embedding.weight[tokens]
        caches = []
        for layer in self.layers:
            cache, x = layer._prefill(x, blocks, max_length)
            caches.append(cache)
        # (Decoding loops update the cache with the hidden states: `varying_like`.)
        return varying_like({"t": blocks * self.window, "layers": tuple(caches)}, x), x

    def init_cache(self, max_length: IntLike) -> dict:
        """Empty decoding cache for up to `max_length` tokens (see `step`).

        SLIDE, BRECT and `ssm="s4"` layers keep a fixed-size state and may decode
        further; `ssm="unstruct"` layers store the inputs and raise an error past it.
        The cache holds the parameters' dtypes: in a bfloat16 model whose LayerNorms,
        embedding or SSM kernels stay float32, what a step computes in float32 is rounded
        to bfloat16 where it is stored, so decoding matches `self(tokens)` to that
        rounding.
        """
        max_length = check_int("max_length", max_length)
        return {
            "t": jnp.zeros((), jnp.int32),
            "layers": tuple(layer.init_cache(max_length) for layer in self.layers),
        }

    def step(
        self, cache: dict, token: Integer[Array | np.ndarray, ""] | np.integer | int
    ) -> tuple[dict, Float[Array, " vocab"]]:
        """Feed one token; return the next-token logits (incremental decoding).

        Feeding `tokens[0], tokens[1], ...` from `init_cache(max_length)` gives the rows
        of `self(tokens)` one by one (any position, no multiple-of-`window` needed). Each
        step costs `O(window + N)` per layer for SLIDE, BRECT and `ssm="s4"` BST layers,
        and `O(max_length)` (a direct convolution over the stored inputs, a static-size
        buffer) for `ssm="unstruct"`. To scan it, pass a function (JAX hashes it, and a
        bound method hashes the model's arrays): `jax.lax.scan(lambda c, t: lm.step(c, t),
        lm.init_cache(n), tokens)`.

        **Arguments:**

        - `cache`: from `init_cache` or the previous `step` (its entries, shapes and
          dtypes are checked, and its position if not traced: below `max_length` with
          `ssm="unstruct"` layers).
        - `token`: scalar integer token in `[0, vocab_size)` (others raise an error).

        **Returns:**

        `(cache, logits)` with logits of shape `(vocab_size,)`.
        """
        (token,) = host_arrays(token)
        if token.shape != () or token.dtype == jnp.bool_:
            raise ValueError(
                f"`token` must be a scalar integer token, got shape {token.shape}, "
                f"dtype {token.dtype}."
            )
        held = held_positions(cache)
        check_cache("cache", cache, self.init_cache, held)
        check_position("cache['t']", cache["t"], held)
        # One compilation whatever the token's integer type (and weak type: a first
        # `jnp.asarray(bos)`, then `argmax`'s int32) once it is in range.
        token = self._check_tokens(token, "token").astype(jnp.int32)
        return _jitted_step(self, cache, token)

    def _step(self, cache: dict, token: Integer[Array, ""]) -> tuple[dict, Float[Array, " vocab"]]:
        """`step` for a token known to be in range (as `generate`'s are)."""
        t = cache["t"]
        x = self.embedding.weight[token]
        new = []
        for layer, layer_cache in zip(self.layers, cache["layers"], strict=True):
            layer_cache, x = layer._step(layer_cache, x, t)
            new.append(layer_cache)
        return {"t": t + 1, "layers": tuple(new)}, self._logits(x)


# Jitted, so that `step` called eagerly (a Python decoding loop) compiles once per model
# structure: its layers' `lax.cond` branches are fresh closures, compiled anew otherwise.
_jitted_step = eqx.filter_jit(lambda lm, cache, token: lm._step(cache, token))


@eqx.filter_jit
def _jitted_prefill(lm: BlockStateTransformerLM, tokens, blocks, max_length: int):
    # Eagerly, op by op, a prefill cost 10x the jitted forward.
    cache, x = lm._prefill(tokens, blocks, max_length)
    return cache, lm._logits(x)


def _parallel_pass_runs(lm: BlockStateTransformerLM) -> bool:
    """Whether `lm`'s forward pass runs here: its cuDNN attention, if any, needs an
    NVIDIA GPU and half-precision activations (decoding steps always use XLA's)."""
    is_mha = lambda node: isinstance(node, MultiHeadAttention)
    modules = jax.tree.leaves(lm, is_leaf=is_mha)
    if not any(is_mha(m) and m.implementation == "cudnn" for m in modules):
        return True
    half = lm.embedding.weight.dtype in (jnp.float16, jnp.bfloat16)
    return half and jax.default_backend() == "gpu"


@eqx.filter_jit
def _generate(
    lm, prefix, buffer, prompt_length, total, key, temperature, greedy: bool | None, top_k
):
    """`buffer[:total]`: `buffer` holds the prompt in `[:prompt_length]`; the rest is
    sampled. The prompt's whole blocks are fed in one parallel pass (`prefix`: the prompt
    padded to a power-of-two number of blocks), the rest token by token. One compilation
    per pair of power-of-two sizes, not per prompt length and `steps`: the lengths are
    traced. The prompt is checked once; sampled tokens are in range by construction, so
    the per-token check of `step` is left out of the loop. `temperature` is traced too;
    greedy-or-not (`None`: decided by `temperature` at run time) and `top_k` are static."""

    def sample(logits, i):
        if top_k is not None:  # exactly top_k candidates, ties or not
            _, keep = jax.lax.top_k(logits, top_k)
            logits = jnp.full_like(logits, -jnp.inf).at[keep].set(logits[keep])
        best = jnp.argmax(logits).astype(buffer.dtype)
        if greedy:
            return best
        # Shifted so the best logit is 0: a tiny temperature sends the others to -inf
        # (greedy in the limit) instead of overflowing every logit to inf or NaN.
        # (At least float32, chosen explicitly: promote_types follows strict promotion.)
        work = work_dtype(logits.dtype)
        shifted = logits.astype(work) - jnp.max(logits).astype(work)
        tiny = float(jnp.finfo(jnp.float32).tiny)  # weakly typed: any temperature dtype
        scale = jnp.maximum(temperature, tiny).astype(work)
        # The key of position i + 1: more steps extend a sample, they do not redraw it.
        token = jr.categorical(jr.fold_in(key, i), shifted / scale).astype(buffer.dtype)
        return token if greedy is False else jnp.where(temperature < tiny, best, token)

    def next_token(i, logits, buffer):
        """The token at position `i + 1`: given inside the prompt, else sampled."""
        return jax.lax.cond(i + 1 < prompt_length, lambda: buffer[i + 1], lambda: sample(logits, i))

    def feed(i, carry):
        cache, buffer = carry
        cache, logits = lm._step(cache, buffer[i])
        return cache, buffer.at[i + 1].set(next_token(i, logits, buffer))

    if _parallel_pass_runs(lm):
        blocks = prompt_length // lm.window
        cache, hidden = lm._prefill(prefix, blocks, buffer.shape[0])
        start = blocks * lm.window  # the first position left to feed
        logits = lm._logits(hidden[jnp.maximum(start - 1, 0)])
    else:  # the whole prompt token by token (a carry varying as the data, as `_prefill`'s)
        logits = jnp.zeros(lm.vocab_size, lm.embedding.weight.dtype)  # (unused)
        cache, logits = varying_like((lm.init_cache(buffer.shape[0]), logits), buffer)
        start = jnp.zeros((), jnp.int32)
    buffer = buffer.at[start].set(next_token(start - 1, logits, buffer))  # start 0: prompt[0]
    _, buffer = jax.lax.fori_loop(start, total - 1, feed, (cache, buffer))
    return buffer


def generate(
    lm: BlockStateTransformerLM,
    prompt: Integer[Array | np.ndarray, " prompt"],
    steps: IntLike,
    *,
    key: PRNGKeyArray,
    temperature: RealScalar = 1.0,
    top_k: IntLike | None = None,
) -> Integer[Array, " total"]:
    """Sample `steps` tokens after `prompt` with the incremental decoder.

    The prompt's whole blocks are fed in one parallel pass (`lm.prefill`; token by token
    where the model's cuDNN attention cannot run: off NVIDIA GPUs, or in float32), the
    rest of it token by token through `lm.step`, then each new token is sampled from the last
    logits and fed back. Every token after the prefill costs `O(window + N)`
    per layer (attention frame of two blocks, S4D recurrent state, BRECT states),
    except `ssm="unstruct"` BST layers, whose filters have no recurrence: they keep the
    inputs and convolve directly, `O(T)` per token, with `T` the power of two
    `>= prompt + steps`. The prompt may have any length. One compilation serves every
    prompt length and `steps` with the same `T` and the same power of two `>=` the
    prompt's number of whole blocks (and `top_k`, greedy or not), and the
    token at each position is drawn with its own key, `jax.random.fold_in(key,
    position - 1)`: more `steps` extend a sample without redrawing it.

    **Arguments:**

    - `lm`: the model.
    - `prompt`: integer tokens in `[0, vocab_size)`, shape `(prompt,)`, at least one.
    - `steps`: number of tokens to sample (`0` returns `prompt`, as int32 or int64).
    - `key`: PRNG key.
    - `temperature`: softmax temperature, finite and `>= 0`; `0` (or anything below
        float32's smallest normal number, about `1.2e-38`) means greedy (argmax);
        values above `1e37` sample as `1e37` does (uniformly among the candidates). It
        may be traced (a `jit` argument, or a sweep under `jax.vmap`): then it is checked
        at run time.
    - `top_k`: if given, sample among the `top_k` most likely tokens only (ties at the
        `top_k`-th logit are broken by `jax.lax.top_k`, towards lower ids).

    **Returns:**

    `prompt` followed by the `steps` sampled tokens, shape `(prompt + steps,)`, int32
    (int64 for an int64 prompt when `jax_enable_x64` is on; without it JAX holds int64
    as int32).
    """
    check_instance("lm", lm, BlockStateTransformerLM)
    (prompt,) = host_arrays(prompt)
    if not jnp.issubdtype(prompt.dtype, jnp.integer):
        raise TypeError(f"`prompt` must hold integer tokens, got dtype {prompt.dtype}.")
    if prompt.ndim != 1 or prompt.shape[0] < 1:
        raise ValueError(f"`prompt` must be a non-empty 1-d token array, got shape {prompt.shape}.")
    prompt = lm._check_tokens(prompt, "prompt")
    if prompt.dtype not in (jnp.int32, jnp.int64):  # narrow types cannot hold the samples
        prompt = prompt.astype(jnp.int32)
    steps = check_int("steps", steps, minimum=0)
    if prompt.shape[0] + steps >= 2**31:  # positions are int32
        raise ValueError(
            f"`steps` must keep prompt + steps below 2**31 positions, got steps={steps} "
            f"after a prompt of {prompt.shape[0]}."
        )
    check_key("key", key)
    temperature = check_real_or_traced("temperature", temperature, "nonnegative")
    if top_k is not None:
        top_k = check_int("top_k", top_k)
        if top_k > lm.vocab_size:
            raise ValueError(f"`top_k` must be in [1, {lm.vocab_size}], got top_k={top_k}.")
    if steps == 0:
        return prompt
    # Below float32's smallest normal number, 1 / temperature overflows: decode greedily.
    # Above 1e37, 1 / temperature would leave float32's normal range (XLA may divide by
    # multiplying with it, and -inf * 0 is NaN): capped there, where sampling is already
    # uniform over the candidates.
    tiny = float(np.finfo(np.float32).tiny)
    if isinstance(temperature, jax.core.Tracer):  # a `jit` argument, a `vmap`ped sweep
        if temperature.shape != ():
            raise ValueError(
                f"temperature must be a scalar, got a traced array of shape "
                f"{temperature.shape}; sweep temperatures with jax.vmap"
            )
        greedy, temperature = None, jnp.asarray(temperature, jnp.result_type(float))
    else:
        greedy = bool(temperature < tiny)
    temperature = jnp.minimum(temperature, 1e37)
    pow2 = lambda n: 1 << (n - 1).bit_length()  # the power of two >= n
    total = prompt.shape[0] + steps
    # Padded with JAX (not NumPy): `prompt` may be traced, e.g. under `vmap` over prompts.
    buffer = jnp.pad(prompt, (0, pow2(total) - prompt.shape[0]))
    whole = prompt.shape[0] // lm.window * lm.window  # the prompt's whole blocks
    prefix_size = lm.window * pow2(max(whole // lm.window, 1))
    prefix = jnp.pad(prompt[:whole], (0, prefix_size - whole))
    lengths = jnp.asarray(prompt.shape[0], jnp.int32), jnp.asarray(total, jnp.int32)
    return _generate(lm, prefix, buffer, *lengths, key, temperature, greedy, top_k)[:total]
