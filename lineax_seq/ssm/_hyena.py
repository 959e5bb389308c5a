"""Implicit long-convolution filters (Hyena-style, the BST paper's "UNSTRUCT")."""

import math

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, Float, PRNGKeyArray

from .._checks import IntLike, RealScalar, check_int, check_key, check_real, check_real_or_traced
from .._numerics import work_dtype


class HyenaFilter(eqx.Module):
    """Implicitly parameterised long convolution filter (BST eq. 2.3.4, after Hyena).

    `K[c, l] = exp(-alpha_c tau_l) * FFN(PositionalEncoding(l))[c]`, `tau_l = l / max_length`.

    - `PositionalEncoding(l) = [tau_l, cos(2 pi f_k l / max_length), -sin(2 pi f_k l / max_length)]`
        with `(emb_dim - 1) / 2` frequencies `f_k` spread over `[1e-4, (emb_dim - 3) / 2]`.
    - `FFN`: `depth` hidden layers of width `order`, each a linear map followed by a sine
        activation `sin(w * x)` with a learned frequency `w` per unit (initialised to
        `frequency`), then a linear map to `channels` outputs without bias.
    - The decay rates `alpha_c` are fixed (not trained) and spread linearly over the
        channels, from `ln(1 / target) / slow_decay` to `ln(1 / target) / fast_decay`:
        the fastest channel has decayed to `target` at `tau = fast_decay` (a single
        channel has the slow rate). They are
        recomputed from these static floats at every call (the `decay` property), so
        they are not PyTree leaves:
        optimisers (weight decay included) never see or change them.
    - `bias` (`(channels,)`) is the skip term of the convolution,
        `y = fft_conv(u, filt(L)) + bias * u`, as in the paper's pseudocode.

    Positions are normalised by `max_length` (`tau_l = l / max_length`, as in Hyena's
    positional encoding `2 pi l / L`); the paper's pseudocode 2.1 uses
    `linspace(0, 1, L)`, i.e. `l / (L - 1)`, larger by the factor `L / (L - 1)`.

    **Lengths.** The filter is tied to `max_length` through `tau`, but every feature is
    defined at every position, so `filt(length)` works for any `length`. Up to
    `max_length` it is the filter that was trained. Beyond it the filter
    *extrapolates*: `tau > 1` is outside the training range of the FFN, and the
    decay keeps shrinking the tail. The BST paper reports that such unstructured
    filters generalise worse to longer sequences than S4 kernels; prefer
    [`lineax_seq.S4DKernel`][] when evaluating far beyond the training length.
    """

    layers: tuple[eqx.nn.Linear, ...]
    frequencies: tuple[Float[Array, " order"], ...]
    output: eqx.nn.Linear
    bias: Float[Array, " channels"]
    channels: int = eqx.field(static=True)
    max_length: int = eqx.field(static=True)
    emb_dim: int = eqx.field(static=True)
    fast_decay: float = eqx.field(static=True)
    slow_decay: float = eqx.field(static=True)
    target: float = eqx.field(static=True)

    def __init__(
        self,
        channels: IntLike,
        order: IntLike = 64,
        max_length: IntLike | None = None,
        *,
        emb_dim: IntLike = 33,
        depth: IntLike = 2,
        frequency: RealScalar = 1.0,
        fast_decay: RealScalar = 0.3,
        slow_decay: RealScalar = 1.5,
        target: RealScalar = 1e-2,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `channels`: number of filters.
        - `order`: width of the FFN's hidden layers.
        - `max_length`: the (training) length that positions are normalised by;
            required (`HyenaFilter(channels, order, max_length, key=key)`).
        - `emb_dim`: size of the positional encoding (odd, >= 3).
        - `depth`: number of hidden (linear + sine) layers, >= 1.
        - `frequency`: initial frequency of the sine activations.
        - `fast_decay`, `slow_decay`: fraction of `max_length` after which the fastest /
            slowest channel has decayed to `target`, `0 < fast_decay <= slow_decay`.
        - `target`: the decayed magnitude, in `(0, 1)`.
        - `key`: a `jax.random.key`.
        """
        check_key("key", key)
        channels = check_int("channels", channels)
        order = check_int("order", order)
        if max_length is None:
            raise TypeError("HyenaFilter needs `max_length`, the training length (an int >= 1).")
        max_length = check_int("max_length", max_length)
        depth = check_int("depth", depth)
        if check_int("emb_dim", emb_dim, 3) % 2 == 0:
            raise ValueError(f"emb_dim must be an odd integer >= 3, got emb_dim={emb_dim!r}")
        emb_dim = int(emb_dim)
        check_real_or_traced("frequency", frequency, "finite")  # (traced: e.g. an ensemble)
        fast_decay = check_real("fast_decay", fast_decay)
        slow_decay = check_real("slow_decay", slow_decay)
        if not fast_decay <= slow_decay:
            raise ValueError(
                f"need 0 < fast_decay <= slow_decay, got fast_decay={fast_decay!r}, "
                f"slow_decay={slow_decay!r}"
            )
        target = check_real("target", target)
        if not target < 1:
            raise ValueError(f"target must be in (0, 1), got target={target!r}")
        keys = jr.split(key, depth + 2)
        sizes = [emb_dim] + [order] * depth
        pairs = zip(sizes[:-1], sizes[1:], keys[:depth], strict=True)
        self.layers = tuple(eqx.nn.Linear(i, o, key=k) for i, o, k in pairs)
        dtype = jax.dtypes.canonicalize_dtype(jnp.float64)  # float, even for frequency=10
        self.frequencies = tuple(jnp.full((order,), frequency, dtype) for _ in range(depth))
        self.output = eqx.nn.Linear(order, channels, use_bias=False, key=keys[depth])
        self.bias = jr.normal(keys[depth + 1], (channels,))
        self.channels = channels
        self.max_length = max_length
        self.emb_dim = emb_dim
        self.fast_decay = float(fast_decay)
        self.slow_decay = float(slow_decay)
        self.target = float(target)

    @property
    def decay(self) -> Float[Array, " channels"]:
        """The fixed decay rates `alpha_c`, of shape `(channels,)`.

        Spread linearly from `ln(1 / target) / slow_decay` to `ln(1 / target) / fast_decay`;
        computed from static floats, so not a parameter.
        """
        rate = math.log(1 / self.target)
        return jnp.linspace(rate / self.slow_decay, rate / self.fast_decay, self.channels)

    def positional_encoding(self, length: IntLike) -> Float[Array, "length emb_dim"]:
        """The positional features `[tau, cos, -sin]` of positions `0, ..., length - 1`.

        **Arguments:**

        - `length`: number of positions (a positive Python integer).

        **Returns:**

        An array of shape `(length, emb_dim)`: `tau_l = l / max_length`, then the
        `(emb_dim - 1) / 2` cosines and as many negated sines.
        """
        tau = self._tau(check_int("length", length))
        bands = (self.emb_dim - 1) // 2
        f = jnp.linspace(1e-4, bands - 1, bands, dtype=tau.dtype)
        phase = 2 * jnp.pi * tau[:, None] * f
        return jnp.concatenate([tau[:, None], jnp.cos(phase), -jnp.sin(phase)], axis=-1)

    def _tau(self, length: int) -> Float[Array, " length"]:
        # Positions in the parameters' precision, float32 at least (bfloat16 cannot
        # tell position 257 from 256).
        work = work_dtype(self.output.weight.dtype)
        return jnp.arange(length, dtype=work) / jnp.asarray(self.max_length, work)

    def __call__(self, length: IntLike) -> Float[Array, "channels length"]:
        """Evaluate the filter.

        **Arguments:**

        - `length`: filter length (any positive Python integer; see the class docs for
            lengths beyond `max_length`).

        **Returns:**

        The filters, of shape `(channels, length)`.
        """
        length = check_int("length", length)
        dtype = self.output.weight.dtype
        h = self.positional_encoding(length).astype(dtype)
        for layer, w in zip(self.layers, self.frequencies, strict=True):
            h = jnp.sin(w * jax.vmap(layer)(h))
        h = jax.vmap(self.output)(h).T
        tau = self._tau(length)
        window = jnp.exp(-self.decay.astype(tau.dtype)[:, None] * tau)
        return window.astype(dtype) * h
