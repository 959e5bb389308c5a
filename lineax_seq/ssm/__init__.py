"""`lineax_seq.ssm`: the state-space core.

Diagonal SSM kernels ([`S4DKernel`][lineax_seq.S4DKernel]), implicit Hyena-style
filters ([`HyenaFilter`][lineax_seq.HyenaFilter]), FFT long convolutions
([`fft_conv`][lineax_seq.fft_conv]) and their exact FFT-free equivalent for SSM kernels
([`chunked_conv`][lineax_seq.chunked_conv]), the [`S4D`][lineax_seq.S4D] layer with its
recurrent mode, and parallel linear recurrences ([`linear_scan`][lineax_seq.linear_scan]).
"""

from ._chunked import chunked_conv
from ._fft_conv import fft_conv
from ._hyena import HyenaFilter
from ._kernel import S4DKernel
from ._s4d import S4D
from ._scan import linear_scan

__all__ = ["HyenaFilter", "S4D", "S4DKernel", "chunked_conv", "fft_conv", "linear_scan"]
