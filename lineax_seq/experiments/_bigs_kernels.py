"""Figure 3 of Wang et al. ("Pretraining Without Attention"): heat maps of every layer's
forward/backward SSM kernel over relative positions -10..10."""

from __future__ import annotations

import pathlib

import numpy as np

import lineax_seq as ls

from ._bigs_train import Classifier, MaskedLM

# Relative positions shown in the kernel heat maps (Figure 3 crops -10..10).
KERNEL_RADIUS = 10


def kernel_image(
    forward: np.ndarray, backward: np.ndarray, *, radius: int = KERNEL_RADIUS
) -> np.ndarray:
    """Figure 3's picture of a model's routing: |kernel| over relative positions.

    Row `2i` is layer `i`'s forward kernel (it reads the past: relative positions
    `-radius..0`), row `2i + 1` its backward kernel (the future: `0..radius`); the other
    half of each row is NaN. Each layer's two rows are min-max scaled together, as in
    the paper.

    **Arguments:**

    - `forward`, `backward`: `(layers, length)` or `(layers, channels, length)` kernels,
        lag 0 first; per-channel kernels are averaged in absolute value.
    - `radius`: the largest |relative position| shown.

    **Returns:**

    A `(2 * layers, 2 * radius + 1)` array in `[0, 1]` with NaN where undefined; column
    `j` is relative position `j - radius`.
    """
    forward, backward = np.abs(np.asarray(forward)), np.abs(np.asarray(backward))
    if forward.ndim == 3:
        forward, backward = forward.mean(axis=1), backward.mean(axis=1)
    if forward.ndim != 2 or forward.shape != backward.shape:
        raise ValueError(
            "`forward` and `backward` must both have shape (layers, length) or "
            f"(layers, channels, length), got {forward.shape} and {backward.shape}"
        )
    if forward.shape[1] < radius + 1:
        raise ValueError(f"kernels of length {forward.shape[1]} are too short for radius {radius}")
    layers = forward.shape[0]
    image = np.full((2 * layers, 2 * radius + 1), np.nan)
    image[0::2, : radius + 1] = forward[:, radius::-1]  # lag r at relative position -r
    image[1::2, radius:] = backward[:, : radius + 1]  # lag r at relative position +r
    pairs = image.reshape(layers, 2, -1)
    low = np.nanmin(pairs, axis=(1, 2), keepdims=True)
    high = np.nanmax(pairs, axis=(1, 2), keepdims=True)
    pairs = (pairs - low) / np.where(high > low, high - low, 1.0)
    return pairs.reshape(2 * layers, -1)


def png_path(path: pathlib.Path) -> pathlib.Path:
    """`path`, with `.png` appended unless it ends in it (matplotlib would otherwise pick
    the format from any other suffix, or append `.png` itself behind the caller's back)."""
    path = pathlib.Path(path)
    return path if path.suffix.lower() == ".png" else path.with_name(path.name + ".png")


def plot_kernels(
    panels: dict[str, tuple[np.ndarray, np.ndarray]],
    path: pathlib.Path,
    *,
    radius: int = KERNEL_RADIUS,
) -> pathlib.Path:
    """Save Figure-3-style heat maps, one panel per model.

    **Arguments:**

    - `panels`: `{title: (forward, backward)}` with kernels as in
        `kernel_image`.
    - `path`: the PNG to write (`.png` is appended to a name without it).
    - `radius`: the largest |relative position| shown.

    **Returns:**

    The path written, `png_path(path)`.
    """
    import matplotlib
    from matplotlib.figure import Figure

    if not panels:
        raise ValueError("`panels` is empty: no model with SSM routing to plot")
    images = {title: kernel_image(f, b, radius=radius) for title, (f, b) in panels.items()}
    rows = max(image.shape[0] for image in images.values())
    fig = Figure(figsize=(4.4 * len(images), 1.2 + 0.32 * rows), layout="constrained")
    axes = fig.subplots(1, len(images), squeeze=False)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")
    shown = []
    for ax, (title, image) in zip(axes[0], images.items(), strict=True):
        shown.append(
            ax.imshow(image, aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        )
        layers = image.shape[0] // 2
        ax.set_yticks(range(2 * layers))
        ax.set_yticklabels([f"L{i} {d}" for i in range(layers) for d in ("fwd", "bwd")])
        ticks = list(range(0, 2 * radius + 1, max(1, radius // 2)))
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t - radius) for t in ticks])
        ax.set_xlabel("relative position (past < 0 < future)")
        ax.set_title(title, fontsize=10)
    fig.colorbar(shown[-1], ax=axes[0].tolist(), label="|K| (min-max per layer)", shrink=0.8)
    path = png_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def model_kernels(
    model: ls.BiGS | MaskedLM | Classifier, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """`(forward, backward)` kernels of every layer, each `(layers, kc, length)`, of a
    `lineax_seq.BiGS` or of a model holding one as its `encoder`."""
    encoder = model if isinstance(model, ls.BiGS) else model.encoder
    k = np.asarray(encoder.kernels(length))
    return k[:, 0], k[:, 1]
