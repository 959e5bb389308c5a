"""S4D layer forward vs the PyTorch reference S4D, side by side in one process.

The issue's shape (batch 8, dim 256, N = 64, L = 1k, 4k, 16k). The competitor restates
the reference layer's forward (state-spaces/s4, `models/s4/s4d.py`): the kernel from one
complex `exp` per (channel, mode, position), FFT convolution, D skip, GELU, then a 1x1
convolution to 2 x dim and a GLU. Ours is `lineax_seq.S4D` both as the bare linear layer
(the `layer` of `benchmarks/ssm.py`) and with the exact (erf) GELU the reference uses and
`glu=True`, which does the reference's work. Ours are timed as `benchmarks/ssm.py` times
them, `jax.jit` over the layers' pre-split arrays. Interleaved rounds after a warm-up, each timing a
competitor over `calls_per_sample` back-to-back calls (1 when a call lasts 20 ms);
median times and the median of the per-round ratios.

Needs PyTorch, which the library does not depend on: `make bench` installs the CPU
build (`pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`);
without it the script says so and exits with status 1. Both sides run on the same
device: with JAX on a GPU the reference runs on CUDA, and where PyTorch has no CUDA
(the CPU build) the script says so and exits with status 0 without writing anything (a
skipped benchmark), rather than compare a GPU with a CPU. `benchmarks/ssm.py` compares
with the issue's figures for the reference instead.

    python benchmarks/ssm_torch.py
    python benchmarks/ssm_torch.py --quick    # smoke run (L = 256, 1k; not the committed JSON)
    python benchmarks/ssm_torch.py --plot-only benchmarks/results/ssm_torch.json  # no torch
"""

import argparse
import functools
import math
import os
import pathlib
import statistics
import sys

# JAX and PyTorch share one GPU here: JAX must not take 75% of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.random as jr  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import (  # noqa: E402
    add_plot_only,
    interleaved_times,
    paired_ratio,
    plot_from_json,
    plot_lengths,
    recorded_device,
    save,
)

import lineax_seq as ls  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

BATCH, DIM, STATE = 8, 256, 64
LENGTHS = (1024, 4096, 16384)
ROUNDS = 5


def reference_layer(dim: int, state_size: int):
    """The reference S4D forward in PyTorch (its default initialisation)."""
    nn = torch.nn
    generator = torch.Generator().manual_seed(0)

    class S4DReference(nn.Module):
        def __init__(self):
            super().__init__()
            log_dt = torch.rand(dim, generator=generator)
            log_dt = log_dt * (math.log(0.1) - math.log(0.001)) + math.log(0.001)
            c = torch.randn(dim, state_size // 2, dtype=torch.cfloat, generator=generator)
            log_a_real = torch.log(0.5 * torch.ones(dim, state_size // 2))
            a_imag = math.pi * torch.arange(state_size // 2).repeat(dim, 1).float()
            self.log_dt = nn.Parameter(log_dt)
            self.C = nn.Parameter(c)
            self.log_A_real = nn.Parameter(log_a_real)
            self.A_imag = nn.Parameter(a_imag)
            self.D = nn.Parameter(torch.randn(dim, generator=generator))
            self.output = nn.Sequential(nn.Conv1d(dim, 2 * dim, 1), nn.GLU(dim=-2))

        def kernel(self, length):
            dt = torch.exp(self.log_dt)
            a = -torch.exp(self.log_A_real) + 1j * self.A_imag
            dt_a = a * dt.unsqueeze(-1)
            c = self.C * (torch.exp(dt_a) - 1.0) / a
            powers = torch.exp(dt_a.unsqueeze(-1) * torch.arange(length, device=dt_a.device))
            return 2 * torch.einsum("hn,hnl->hl", c, powers).real

        def forward(self, u):  # (batch, dim, length)
            length = u.shape[-1]
            k_f = torch.fft.rfft(self.kernel(length), n=2 * length)
            y = torch.fft.irfft(torch.fft.rfft(u, n=2 * length) * k_f, n=2 * length)
            y = y[..., :length] + u * self.D.unsqueeze(-1)
            return self.output(nn.functional.gelu(y))

    return S4DReference().eval()


class _CudaSync:
    """What a CUDA call of the reference returns: `jax.block_until_ready` calls its
    `block_until_ready`, which waits for the device, so that back-to-back calls queue
    on the device as JAX's do and a sample blocks once, on the last."""

    def block_until_ready(self) -> "_CudaSync":
        torch.cuda.synchronize()
        return self


def torch_device(backend: str) -> str | None:
    """The PyTorch device on JAX's `backend`'s kind of device, or `None` where PyTorch
    cannot run there (a GPU without CUDA in this PyTorch build; a TPU)."""
    if backend == "cpu":
        return "cpu"
    if backend == "gpu" and torch.cuda.is_available():
        return "cuda"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    add_plot_only(parser)
    args = parser.parse_args(argv)
    if args.plot_only:
        print(f"wrote {plot_from_json(_plot, args.plot_only)}")
        return 0
    lengths, rounds = ((256, 1024), 2) if args.quick else (LENGTHS, ROUNDS)
    if torch is None:
        print(
            "PyTorch is not installed; `make bench` installs the CPU build (pip install "
            "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)",
            file=sys.stderr,
        )
        return 1
    # Same device for both, or no comparison: off CPU the reference runs on CUDA.
    backend, jax_device = jax.default_backend(), jax.devices()[0].device_kind
    device = torch_device(backend)
    if device is None:
        print(
            f"skipped, nothing written: JAX runs on {jax_device} ({backend}) and PyTorch "
            f"{torch.__version__} cannot run there (no CUDA), only on the CPU; the two are "
            "not compared across devices. Install a CUDA build of PyTorch to compare on "
            "the GPU, or run with JAX_PLATFORMS=cpu to compare on the CPU.",
            file=sys.stderr,
        )
        return 0
    cuda = device == "cuda"
    reference = reference_layer(DIM, STATE).to(device)

    def forward(layer):
        """`x -> y` of `layer`, as `benchmarks/ssm.py` times it: `jax.jit` over the
        layer's arrays, split from the rest once."""
        params, static = eqx.partition(layer, eqx.is_array)
        jitted = jax.jit(lambda p, x: jax.vmap(eqx.combine(p, static))(x))
        return lambda x: jitted(params, x)

    linear = forward(ls.S4D(DIM, state_size=STATE, key=jr.key(0)))
    gelu = functools.partial(jax.nn.gelu, approximate=False)  # PyTorch's default GELU
    full = forward(ls.S4D(DIM, state_size=STATE, activation=gelu, glu=True, key=jr.key(0)))
    rows = []
    for length in lengths:
        x = jr.normal(jr.key(1), (BATCH, length, DIM))
        u = torch.randn(BATCH, DIM, length, device=device)

        def run_reference(u=u):
            with torch.no_grad():
                reference(u)
            return _CudaSync() if cuda else None

        calls = {
            "layer": lambda x=x: linear(x),
            "layer_gelu_glu": lambda x=x: full(x),
            "pytorch_reference": run_reference,
        }
        times, _, number = interleaved_times(calls, rounds=rounds)
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        ratios = {
            f"pytorch_reference_over_{name}": paired_ratio(times, "pytorch_reference", name)
            for name in ("layer", "layer_gelu_glu")
        }
        rows.append({"length": length, "ms": ms, "ratios": ratios, "calls_per_sample": number})
        print(f"L={length:6d} {ms} {ratios} calls per sample {number}", flush=True)
    path = save(
        "ssm_torch_quick" if args.quick else "ssm_torch",
        {
            "config": {
                "batch": BATCH,
                "dim": DIM,
                "state_size": STATE,
                "rounds": rounds,
                "quick": args.quick,
                "timing": "median over interleaved rounds; a round times each competitor "
                "over `calls_per_sample` back-to-back calls; ours jax.jit on pre-split "
                "arrays",
            },
            "torch": torch.__version__,
            "torch_device": str(device),
            "torch_threads": torch.get_num_threads(),
            "results": rows,
        },
        args=args,
        parser=parser,
    )
    print(f"results: {path} and {plot_from_json(_plot, path).name}")
    return 0


def _plot(record: dict, path: pathlib.Path) -> None:
    """Time against length from a results JSON (drawn without PyTorch)."""
    rows = record["results"]
    _, device = recorded_device(record)
    labels = {
        "layer": "layer (bare linear)",
        "layer_gelu_glu": "layer, GELU + GLU (the reference's work)",
        "pytorch_reference": f"PyTorch reference ({record.get('torch', 'torch')}, "
        f"{record.get('torch_device', '?')})",
    }
    series = {labels.get(n, n): [(r["length"], r["ms"][n]) for r in rows] for n in rows[0]["ms"]}
    plot_lengths(series, path, f"S4D forward vs the PyTorch reference ({device})")


if __name__ == "__main__":
    raise SystemExit(main())
