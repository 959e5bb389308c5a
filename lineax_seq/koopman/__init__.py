"""`lineax_seq.koopman`: Koopman autoencoders with periodic reencoding (chapter 1).

Latent dynamics ([`LinearKoopmanDynamics`][lineax_seq.LinearKoopmanDynamics] with
bilinear or exact discretisation, [`MLPDynamics`][lineax_seq.MLPDynamics]), the
[`KoopmanAutoencoder`][lineax_seq.KoopmanAutoencoder], the
[`MLPBaseline`][lineax_seq.MLPBaseline], discrete unrolls with periodic reencoding
([`unroll`][lineax_seq.unroll]) and continuous-time unrolls through diffrax
([`unroll_continuous`][lineax_seq.unroll_continuous]), and the training losses.
"""

from ._autoencoder import KoopmanAutoencoder, MLPBaseline, UnitNormLinear
from ._continuous import unroll_continuous
from ._dynamics import AbstractLatentDynamics, LinearKoopmanDynamics, MLPDynamics
from ._losses import koopman_loss, mlp_baseline_loss
from ._unroll import unroll, unroll_latents

__all__ = [
    "AbstractLatentDynamics",
    "KoopmanAutoencoder",
    "LinearKoopmanDynamics",
    "MLPBaseline",
    "MLPDynamics",
    "UnitNormLinear",
    "koopman_loss",
    "mlp_baseline_loss",
    "unroll",
    "unroll_continuous",
    "unroll_latents",
]
