"""`python -m lineax_seq demo`: train small models of every family end to end.

Each section is the `demo(out_dir, *, small)` function of one experiment module; it
trains for real, prints its figures against a trivial baseline and saves plots.
"""

import argparse
import importlib
import pathlib
import shutil
import time

from ._cli import UsageError, output_problem, path

# (name, module): run in this order.
SECTIONS = (
    ("s4d", "lineax_seq.experiments._s4d"),
    ("koopman", "lineax_seq.experiments._koopman"),
    ("bigs", "lineax_seq.experiments._bigs"),
    ("bst", "lineax_seq.experiments._bst"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=path,
        default=pathlib.Path("outputs/demo"),
        help="directory for plots and metrics, one subdirectory per section, replaced on "
        "every run (a subdirectory with files the demo did not write is an error): "
        "s4d/ (s4d_kernels.png, s4d_metrics.json), koopman/ (phase portrait and MSE curves "
        ".png, koopman_metrics.json), bigs/ (curves.png, kernels.png, metrics.jsonl), bst/ "
        "(bst_lm.png, bst_lm.json, bst_lm.md) (default: outputs/demo)",
    )
    parser.add_argument(
        "--only",
        choices=[name for name, _ in SECTIONS],
        action="append",
        help="run only this section (repeatable; default: all four, in this order)",
    )
    parser.add_argument("--small", action="store_true", help="tiny sizes, for smoke tests")


# Marks a section directory as the demo's own, which a later run may replace.
MARKER = ".lineax_seq_demo"


def _files(section_dir: pathlib.Path) -> set[str]:
    """The files under `section_dir` (relative paths), the marker left out."""
    found = (p for p in section_dir.rglob("*") if p.is_file() or p.is_symlink())
    return {p.relative_to(section_dir).as_posix() for p in found} - {MARKER}


def _section_problem(section_dir: pathlib.Path) -> str | None:
    """Why `section_dir` may not be replaced: a file, or a directory with files that a
    demo did not write (no marker, or files the marker does not list; a marker that
    lists none is from a run that stopped early, or from before markers listed files)."""
    if section_dir.is_file() or section_dir.is_symlink():
        return f"--out {section_dir.parent}: {section_dir} exists and is not a directory"
    if not section_dir.is_dir() or not any(section_dir.iterdir()):
        return None
    marker = section_dir / MARKER
    written = set(marker.read_text().splitlines()) if marker.is_file() else set()
    foreign = sorted(_files(section_dir) - written) if written else []
    if not marker.is_file() or foreign:
        which = f" ({', '.join(foreign[:3])}{', ...' if foreign[3:] else ''})" if foreign else ""
        return (
            f"--out {section_dir.parent}: {section_dir} holds files a demo did not write"
            f"{which} (each run replaces its section directories); choose another --out"
        )
    return None


def run(args: argparse.Namespace) -> int:
    chosen = args.only or [name for name, _ in SECTIONS]
    if problem := output_problem("--out", args.out):
        raise UsageError(problem)
    for name in chosen:
        if problem := _section_problem(args.out / name):
            raise UsageError(problem)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, module_name in SECTIONS:
        if name not in chosen:
            continue
        print(f"\n=== demo: {name} ===", flush=True)
        start = time.perf_counter()
        module = importlib.import_module(module_name)
        section_dir = args.out / name
        shutil.rmtree(section_dir, ignore_errors=True)  # each demo run starts afresh
        section_dir.mkdir()
        (section_dir / MARKER).touch()
        module.demo(section_dir, small=args.small)
        (section_dir / MARKER).write_text("".join(f"{f}\n" for f in sorted(_files(section_dir))))
        print(f"=== {name} done in {time.perf_counter() - start:.0f} s ===", flush=True)
    print(f"\nplots and metrics saved under {args.out}/")
    return 0
