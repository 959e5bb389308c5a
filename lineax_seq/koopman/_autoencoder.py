"""Koopman autoencoder (encoder, dynamics, decoder, action encoder / head), MLP baseline."""

from typing import Any, NamedTuple

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._checks import (
    IntLike,
    RealScalar,
    as_float_array,
    check_bool,
    check_choice,
    check_int,
    check_key,
    check_real,
    check_state_control,
)
from ._dynamics import (
    _DISCRETIZATIONS,
    AbstractLatentDynamics,
    LinearKoopmanDynamics,
    MLPDynamics,
    matmul,
    relu_mlp,
)

_DECODERS = ("linear", "mlp")
_DYNAMICS = ("koopman", "mlp")


class UnitNormLinear(eqx.Module):
    """Linear decoder `psi(z) = W z / ||W||_col + b` with unit-norm weight columns.

    Normalising the columns stops the encoder from shrinking the codes to make the
    alignment loss vanish (appendix "Implementation Details").
    """

    weight: Float[Array, "out_dim in_dim"]
    bias: Float[Array, " out_dim"]

    def __init__(self, in_dim: IntLike, out_dim: IntLike, *, key: PRNGKeyArray):
        """**Arguments:** `in_dim` (latent size), `out_dim` (state size), `key`."""
        check_key("key", key)
        in_dim, out_dim = check_int("in_dim", in_dim), check_int("out_dim", out_dim)
        self.weight = jr.normal(key, (out_dim, in_dim))
        self.bias = jnp.zeros((out_dim,))

    def normalized_weight(self) -> Float[Array, "out_dim in_dim"]:
        """The weight `(out_dim, in_dim)` with every column scaled to unit Euclidean norm."""
        norm = jnp.sqrt(jnp.sum(self.weight**2, axis=0, keepdims=True) + 1e-12)
        return self.weight / norm

    def __call__(
        self, z: Float[Array | np.ndarray, " in_dim"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, " out_dim"]:
        """**Arguments:** `z` of shape `(in_dim,)`; `key` is ignored (as by
        `eqx.nn.Linear`). **Returns:** `(out_dim,)`."""
        z = as_float_array("z", z)
        if z.shape != self.weight.shape[1:]:
            raise ValueError(f"z must have shape ({self.weight.shape[1]},), got z.shape={z.shape}")
        return matmul(self.normalized_weight(), z) + self.bias


class _Options(NamedTuple):
    """`KoopmanAutoencoder`'s sizes, checked and with their defaults filled in."""

    state_dim: int
    latent_dim: int
    action_dim: int  # 0: autonomous
    action_latent_dim: int  # `m`, the size of `omega(u)`; 0 without controls
    head_action_dim: int  # 0: no action head
    width: int
    encoder_layers: int
    decoder_layers: int
    dynamics_width: int
    dt: float


def _check_decoder(decoder: str, decoder_layers: IntLike | None) -> int:
    """The MLP decoder's number of layers (default 4), checked with the decoder kind."""
    check_choice("decoder", decoder, _DECODERS)
    if decoder_layers is None:
        return 4
    decoder_layers = check_int("decoder_layers", decoder_layers)
    if decoder != "mlp":
        raise ValueError(
            f"decoder_layers={decoder_layers} is the MLP decoder's depth; "
            f"decoder={decoder!r} has none: pass decoder='mlp' or leave it None"
        )
    return decoder_layers


def _check_dynamics(dynamics: str, discretization: str) -> None:
    """A `ValueError` unless the dynamics kind and discretization are known and go together."""
    check_choice("dynamics", dynamics, _DYNAMICS)
    check_choice("discretization", discretization, _DISCRETIZATIONS)
    if dynamics == "mlp" and discretization != "bilinear":
        raise ValueError(
            f"discretization={discretization!r} applies to linear dynamics only; "
            "dynamics='mlp' steps by explicit Euler: leave discretization='bilinear'"
        )


def _check_dynamics_width(dynamics: str, dynamics_width: IntLike | None, width: int) -> int:
    """The MLP dynamics' hidden width (default `width`), checked with the dynamics kind."""
    if dynamics_width is None:
        return width
    dynamics_width = check_int("dynamics_width", dynamics_width)
    if dynamics != "mlp":
        raise ValueError(
            f"dynamics_width={dynamics_width} is the MLP dynamics' width; "
            f"dynamics={dynamics!r} has none: pass dynamics='mlp' or leave it None"
        )
    return dynamics_width


def _head_action_dim(action_dim: int, action_head: bool, head_action_dim: IntLike | None) -> int:
    """The size of the actions the head predicts (0: no head), checked."""
    if head_action_dim is not None:
        head_action_dim = check_int("head_action_dim", head_action_dim)
        if not action_head:
            raise ValueError(
                f"head_action_dim={head_action_dim} is the action head's output size, "
                "but action_head=False: pass action_head=True or leave it None"
            )
        if action_dim and head_action_dim != action_dim:
            raise ValueError(
                f"head_action_dim={head_action_dim}: with controls (action_dim="
                f"{action_dim}) the head predicts them; leave head_action_dim None"
            )
        return head_action_dim
    if not action_head:
        return 0
    if action_dim == 0:
        raise ValueError(
            "action_head=True needs the size of the actions it predicts: "
            "action_dim > 0 (controlled dynamics) or head_action_dim > 0 "
            "(autonomous dynamics, as in semi-open-loop control)"
        )
    return action_dim


def _resolve_options(
    state_dim: IntLike,
    latent_dim: IntLike,
    action_dim: IntLike,
    *,
    action_latent_dim: IntLike | None,
    decoder: str,
    dynamics: str,
    width: IntLike,
    encoder_layers: IntLike,
    decoder_layers: IntLike | None,
    dynamics_width: IntLike | None,
    action_head: bool,
    head_action_dim: IntLike | None,
    dt: RealScalar,
    discretization: str,
) -> _Options:
    """`KoopmanAutoencoder`'s arguments (but the key), checked against each other (a
    `ValueError` or `TypeError` naming the first one at fault), as sizes."""
    state_dim = check_int("state_dim", state_dim)
    latent_dim = check_int("latent_dim", latent_dim)
    width = check_int("width", width)
    encoder_layers = check_int("encoder_layers", encoder_layers)
    action_dim = check_int("action_dim", action_dim, minimum=0)
    dt = check_real("dt", dt)
    decoder_layers = _check_decoder(decoder, decoder_layers)
    _check_dynamics(dynamics, discretization)
    action_head = check_bool("action_head", action_head)
    dynamics_width = _check_dynamics_width(dynamics, dynamics_width, width)
    if action_dim == 0 and action_latent_dim is not None:
        raise ValueError(
            f"action_latent_dim={action_latent_dim} needs action_dim > 0 (got action_dim=0)"
        )
    head_action_dim = _head_action_dim(action_dim, action_head, head_action_dim)
    if action_dim == 0:
        m = 0
    elif action_latent_dim is None:
        m = latent_dim
    else:
        m = check_int("action_latent_dim", action_latent_dim)
    return _Options(
        state_dim=state_dim,
        latent_dim=latent_dim,
        action_dim=action_dim,
        action_latent_dim=m,
        head_action_dim=head_action_dim,
        width=width,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        dynamics_width=dynamics_width,
        dt=dt,
    )


class KoopmanAutoencoder(eqx.Module):
    """Deep Koopman autoencoder with control inputs (sections 1.2-1.3).

    `z = phi(x)` (ReLU MLP encoder), `z_{t+1} = Kbar z_t + Lbar omega(u_t)` (or a
    nonlinear MLP step), `x = psi(z)` (unit-norm linear or MLP decoder). With
    `action_head=True` an extra MLP decodes actions from the latent, trained by the
    `action` term of [`koopman_loss`][lineax_seq.koopman_loss] (behaviour cloning).
    Unroll it with [`unroll`][lineax_seq.unroll] or
    [`unroll_continuous`][lineax_seq.unroll_continuous].

    For the paper's semi-open-loop control (section 1.4.3 and its appendix) the actions
    follow from the states, `u_t = pi(x_t)`, so the dynamics stay autonomous,
    `z_{t+1} = K z_t`, and the actions are the head's targets only:
    `KoopmanAutoencoder(state_dim, latent_dim, action_head=True, head_action_dim=m)`
    (no `action_dim`). Its unroll takes no actions; the head reads the predicted
    latents: `jax.vmap(model.predict_action)(unroll_latents(model, x0, steps=T))`.
    """

    encoder: eqx.nn.MLP
    decoder: UnitNormLinear | eqx.nn.MLP
    dynamics: AbstractLatentDynamics
    action_encoder: eqx.nn.MLP | None
    action_head: eqx.nn.MLP | None
    state_dim: int = eqx.field(static=True)
    latent_dim: int = eqx.field(static=True)
    action_dim: int = eqx.field(static=True)
    head_action_dim: int = eqx.field(static=True)

    def __init__(
        self,
        state_dim: IntLike,
        latent_dim: IntLike = 128,
        action_dim: IntLike = 0,
        *,
        action_latent_dim: IntLike | None = None,
        decoder: str = "linear",
        dynamics: str = "koopman",
        width: IntLike = 256,
        encoder_layers: IntLike = 4,
        decoder_layers: IntLike | None = None,
        dynamics_width: IntLike | None = None,
        action_head: bool = False,
        head_action_dim: IntLike | None = None,
        dt: RealScalar = 0.01,
        discretization: str = "bilinear",
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `state_dim`: size `d` of the observed state.
        - `latent_dim`: size `n` of the Koopman embedding (paper: 128).
        - `action_dim`: size of the control input (0: autonomous system).
        - `action_latent_dim`: size of the encoded control `v = omega(u)` (default
            `latent_dim`).
        - `decoder`: `"linear"` (unit-norm columns) or `"mlp"` (a plain ReLU MLP; its
            weights are not normalised, so only weight decay keeps the encoder from
            shrinking its codes for it to scale back up).
        - `dynamics`: `"koopman"` (linear generator) or `"mlp"` (3-layer MLP).
        - `width`: hidden width of the encoder / decoder / action MLPs.
        - `encoder_layers`: number of linear layers of the encoder (paper: 4).
        - `decoder_layers`: number of linear layers of an MLP decoder (default 4;
            `decoder="linear"` has one, so leave it `None` there).
        - `dynamics_width`: hidden width of the MLP dynamics (default `width`).
        - `action_head`: add an MLP decoding actions from the latent.
        - `head_action_dim`: size of the actions the head predicts (default
            `action_dim`). With `action_dim=0` the dynamics are autonomous and the
            actions are the head's targets only (semi-open-loop control).
        - `dt`: the data's sampling interval; initialises the trainable step `delta`.
        - `discretization`: `"bilinear"` or `"exact"`; linear dynamics only (MLP
            dynamics step by explicit Euler: leave the default).
        - `key`: PRNG key.
        """
        check_key("key", key)
        opts = _resolve_options(
            state_dim,
            latent_dim,
            action_dim,
            action_latent_dim=action_latent_dim,
            decoder=decoder,
            dynamics=dynamics,
            width=width,
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            dynamics_width=dynamics_width,
            action_head=action_head,
            head_action_dim=head_action_dim,
            dt=dt,
            discretization=discretization,
        )
        n, m, width = opts.latent_dim, opts.action_latent_dim, opts.width
        ekey, dkey, ykey, akey, hkey = jr.split(key, 5)
        self.encoder = relu_mlp(opts.state_dim, n, width, opts.encoder_layers, key=ekey)
        if decoder == "linear":
            self.decoder = UnitNormLinear(n, opts.state_dim, key=dkey)
        else:
            self.decoder = relu_mlp(n, opts.state_dim, width, opts.decoder_layers, key=dkey)
        if dynamics == "koopman":
            self.dynamics = LinearKoopmanDynamics(
                n, m, dt=opts.dt, discretization=discretization, key=ykey
            )
        else:
            self.dynamics = MLPDynamics(n, m, width=opts.dynamics_width, dt=opts.dt, key=ykey)
        self.action_encoder = (
            relu_mlp(opts.action_dim, m, width, 2, key=akey) if opts.action_dim else None
        )
        self.action_head = (
            relu_mlp(n, opts.head_action_dim, width, 3, key=hkey) if opts.head_action_dim else None
        )
        self.state_dim = opts.state_dim
        self.latent_dim = n
        self.action_dim = opts.action_dim
        self.head_action_dim = opts.head_action_dim

    @property
    def is_linear(self) -> bool:
        """Whether the latent dynamics are linear (Koopman)."""
        return isinstance(self.dynamics, LinearKoopmanDynamics)

    def encode(self, x: Float[Array | np.ndarray, " state_dim"]) -> Float[Array, " latent_dim"]:
        """`phi(x)`: state `(state_dim,)` -> latent `(latent_dim,)`."""
        x = as_float_array("x", x)
        if x.shape != (self.state_dim,):
            raise ValueError(f"x must have shape ({self.state_dim},), got x.shape={x.shape}")
        return self.encoder(x)

    def decode(self, z: Float[Array | np.ndarray, " latent_dim"]) -> Float[Array, " state_dim"]:
        """`psi(z)`: latent `(latent_dim,)` -> state `(state_dim,)`."""
        z = as_float_array("z", z)
        if z.shape != (self.latent_dim,):
            raise ValueError(f"z must have shape ({self.latent_dim},), got z.shape={z.shape}")
        return self.decoder(z)

    def reencode(self, z: Float[Array | np.ndarray, " latent_dim"]) -> Float[Array, " latent_dim"]:
        """Periodic reencoding's step `phi(psi(z))`: decode the latent `(latent_dim,)`
        to a state, then encode that back to a latent `(latent_dim,)` (section 1.3.2)."""
        return self.encode(self.decode(z))

    def encode_action(
        self, u: Float[Array | np.ndarray, " action_dim"]
    ) -> Float[Array, " action_latent"]:
        """`omega(u)`: control `(action_dim,)` -> encoded control `(action_latent_dim,)`."""
        if self.action_encoder is None:
            raise ValueError("this model has action_dim=0: it takes no actions")
        u = as_float_array("u", u)
        if u.shape != (self.action_dim,):
            raise ValueError(f"u must have shape ({self.action_dim},), got u.shape={u.shape}")
        return self.action_encoder(u)

    def predict_action(
        self, z: Float[Array | np.ndarray, " latent_dim"]
    ) -> Float[Array, " head_action_dim"]:
        """The action head: the action `(head_action_dim,)` of latent `z` `(latent_dim,)`."""
        if self.action_head is None:
            raise ValueError("this model was built with action_head=False")
        z = as_float_array("z", z)
        if z.shape != (self.latent_dim,):
            raise ValueError(f"z must have shape ({self.latent_dim},), got z.shape={z.shape}")
        return self.action_head(z)

    def step(
        self,
        z: Float[Array | np.ndarray, " latent_dim"],
        v: Float[Array | np.ndarray, " action_latent"] | None = None,
    ) -> Float[Array, " latent_dim"]:
        """One latent step `z_{t+1}` `(latent_dim,)` from `z` = `z_t` `(latent_dim,)` and
        the encoded control `v` = `v_t` `(action_latent,)` (`None` for an autonomous
        model)."""
        return self.dynamics(z, v)

    def __call__(
        self, x: Float[Array | np.ndarray, " state_dim"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, " state_dim"]:
        """Autoencode one state: `psi(phi(x))`.

        **Arguments:**

        - `x`: state `(state_dim,)`.
        - `key`: ignored (the model is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        The reconstruction `(state_dim,)`.
        """
        return self.decode(self.encode(x))

    def config(self) -> dict[str, Any]:
        """The constructor arguments (plain ints/floats/strings/bools, JSON-serialisable),
        read off the model's structure, so that `KoopmanAutoencoder(**model.config(),
        key=key)` rebuilds it (with new weights): e.g. a template for
        [`lineax_seq.load_checkpoint`][]."""
        dynamics, decoder = self.dynamics, self.decoder
        linear = isinstance(dynamics, LinearKoopmanDynamics)
        mlp_dynamics = isinstance(dynamics, MLPDynamics)
        mlp_decoder = isinstance(decoder, eqx.nn.MLP)
        autonomous_head = self.head_action_dim > 0 and self.action_dim == 0
        return dict(
            state_dim=self.state_dim,
            latent_dim=self.latent_dim,
            action_dim=self.action_dim,
            action_latent_dim=dynamics.action_latent_dim if self.action_dim else None,
            decoder="mlp" if mlp_decoder else "linear",
            dynamics="koopman" if linear else "mlp",
            width=self.encoder.width_size,
            encoder_layers=self.encoder.depth + 1,
            decoder_layers=decoder.depth + 1 if mlp_decoder else None,
            dynamics_width=dynamics.mlp.width_size if mlp_dynamics else None,
            action_head=self.action_head is not None,
            head_action_dim=self.head_action_dim if autonomous_head else None,
            dt=dynamics.dt,
            discretization=dynamics.discretization if linear else "bilinear",
        )


class MLPBaseline(eqx.Module):
    """Single-step state-space model `x_{t+1} = x_t + mlp([x_t, u_t])`, unrolled autoregressively.

    The paper's baseline column ("MLP", a standard MLP for single-step prediction). The
    MLP predicts the increment (residual form): at initialisation the model is close to
    the identity map, which the paper does not specify. Choose `width` / `layers` so its
    size is comparable to the autoencoder's encoder.
    """

    mlp: eqx.nn.MLP
    state_dim: int = eqx.field(static=True)
    action_dim: int = eqx.field(static=True)

    def __init__(
        self,
        state_dim: IntLike,
        action_dim: IntLike = 0,
        *,
        width: IntLike = 256,
        layers: IntLike = 4,
        key: PRNGKeyArray,
    ):
        """**Arguments:** `state_dim`, `action_dim` (0: autonomous), `width`, `layers`
        (number of linear layers), `key`."""
        check_key("key", key)
        state_dim = check_int("state_dim", state_dim)
        action_dim = check_int("action_dim", action_dim, minimum=0)
        width, layers = check_int("width", width), check_int("layers", layers)
        self.mlp = relu_mlp(state_dim + action_dim, state_dim, width, layers, key=key)
        self.state_dim = state_dim
        self.action_dim = action_dim

    def __call__(
        self,
        x: Float[Array | np.ndarray, " state_dim"],
        u: Float[Array | np.ndarray, " action_dim"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, " state_dim"]:
        """One step.

        **Arguments:**

        - `x`: state `(state_dim,)`.
        - `u`: control `(action_dim,)`, or `None` for autonomous models.
        - `key`: ignored (the model is deterministic); accepted, as by every Equinox layer, so
            that `eqx.nn.Sequential` can call it.

        **Returns:**

        The next state `(state_dim,)`.
        """
        x, u = check_state_control(("x", x, self.state_dim), ("u", u, self.action_dim), "model")
        inp = x if u is None else jnp.concatenate([x, u])
        return x + self.mlp(inp)

    def config(self) -> dict[str, Any]:
        """The constructor arguments (plain ints), so that `MLPBaseline(**model.config(),
        key=key)` rebuilds the model's structure (with new weights)."""
        return dict(
            state_dim=self.state_dim,
            action_dim=self.action_dim,
            width=self.mlp.width_size,
            layers=self.mlp.depth + 1,
        )
