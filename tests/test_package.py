import inspect
import subprocess
import sys
import typing
from types import ModuleType

import jax
import matplotlib.figure
import pytest
from _compiles import compilations
from typed_usage import build_all

import lineax_seq
from lineax_seq.__main__ import main


def test_host_devices_available():
    assert len(jax.devices("cpu")) == 8


def test_public_names_documented():
    assert len(set(lineax_seq.__all__)) == len(lineax_seq.__all__)
    missing = [name for name in lineax_seq.__all__ if not getattr(lineax_seq, name).__doc__]
    assert missing == []
    # Constants (an int's `__doc__` is int's): the docstring under the assignment, which
    # is what the API pages show (griffe reads the source, as mkdocstrings does).
    griffe = pytest.importorskip("griffe")
    package = griffe.load("lineax_seq", resolve_aliases=True)
    constants = [
        name for name in lineax_seq.__all__ if not callable(getattr(lineax_seq, name))
    ]  # fmt: skip
    assert "PAD_ID" in constants and "SYSTEMS" in constants
    assert [name for name in constants if not package[name].docstring] == []
    # Every public name at the top level is listed (modules aside).
    public = {
        name
        for name in dir(lineax_seq)
        if not name.startswith("_") and not isinstance(getattr(lineax_seq, name), ModuleType)
    }
    assert public == set(lineax_seq.__all__)


def _public_callables():
    """Every public function, and every public class's own public methods, `__init__`
    and `__call__` (inherited ones are checked on the class defining them)."""
    for name in lineax_seq.__all__:
        obj = getattr(lineax_seq, name)
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj) and obj.__module__.startswith("lineax_seq"):
            for attr, value in vars(obj).items():
                public = not attr.startswith("_") or attr in ("__init__", "__call__")
                if public and inspect.isfunction(value):
                    yield f"{name}.{attr}", value


# Hinted names that the package imports for type checkers only (`if TYPE_CHECKING:`),
# so that `import lineax_seq` does not load their libraries.
_TYPE_CHECKING_ONLY = {"Figure": matplotlib.figure.Figure}


def test_import_loads_no_plotting():
    """`import lineax_seq` does not import matplotlib (slow, and it warns at import
    where its cache directory is not writable): only plotting does."""
    code = "import sys, lineax_seq; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_public_api_is_annotated():
    """Every parameter and return of the public API carries a type hint, and the hints
    resolve (`typing.get_type_hints`, as a user's checker or beartype reads them)."""
    unannotated, unresolved = [], []
    for name, fn in _public_callables():
        sig = inspect.signature(fn)
        plain = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        for p in sig.parameters.values():
            if p.name not in ("self", "cls") and p.kind not in plain and p.annotation is p.empty:
                unannotated.append(f"{name}({p.name})")
        if sig.return_annotation is sig.empty and not name.endswith("__init__"):
            unannotated.append(f"{name} -> ?")
        try:
            typing.get_type_hints(fn, localns=_TYPE_CHECKING_ONLY)
        except Exception as e:  # a hint that names something not importable
            unresolved.append(f"{name}: {e!r}")
    assert unannotated == [] and unresolved == []


def test_typed_usage_builds_every_public_class():
    """`typed_usage.py` (type-checked by `make lint`) runs, and calls the constructor of
    every public class but the abstract ones and the results and errors the library
    returns or raises."""
    built = {type(obj) for obj in build_all(jax.random.key(0))}
    ls = lineax_seq
    returned = {ls.Checkpoint, ls.TrainResult, ls.CheckpointError, ls.NonFiniteError}
    abstract = {ls.AbstractLatentDynamics, ls.DynamicalSystem, ls.Tokenizer}
    classes = {getattr(ls, name) for name in ls.__all__ if inspect.isclass(getattr(ls, name))}
    assert classes - returned - abstract == built


def test_cli_help():
    out = subprocess.run(
        [sys.executable, "-m", "lineax_seq", "--help"], capture_output=True, text=True, check=True
    )
    assert "demo" in out.stdout


@pytest.mark.parametrize("command", ["demo", "koopman", "bst", "bigs"])
def test_cli_help_gives_every_default(command, capsys):
    """Every option with a default says what it is in `--help` (the docs promise it;
    `koopman --lr` showed only the paper's 1e-4, not the 3e-3 it uses)."""
    import argparse

    with pytest.raises(SystemExit):
        main([command, "--help"])  # builds the command's parser, as a user runs it
    parsers = [argparse.ArgumentParser(formatter_class=lineax_seq.experiments._cli.HelpFormatter)]
    module = {"demo": "_demo", "koopman": "_koopman", "bst": "_bst", "bigs": "_bigs"}[command]
    getattr(lineax_seq.experiments, module).add_arguments(parsers[0])
    for action in parsers[0]._actions:  # and bigs' subcommands
        if isinstance(action, argparse._SubParsersAction):
            parsers += list(action.choices.values())
    missing = []
    for parser in parsers:
        formatter = parser._get_formatter()
        assert isinstance(formatter, lineax_seq.experiments._cli.HelpFormatter), parser.prog
        for action in parser._actions:
            has_default = not any(action.default is x for x in (None, False, argparse.SUPPRESS))
            if action.option_strings and has_default:
                text = formatter._get_help_string(action) if action.help else ""
                if "default" not in text:
                    missing.append(f"{parser.prog} {action.option_strings[0]}")
    assert not missing, missing
    if command == "koopman":  # through `python -m lineax_seq`'s own parser
        out = " ".join(capsys.readouterr().out.split())  # unwrapped
        assert "(default: 0.003)" in out and "(default: koopman/linear,koopman/mlp," in out


@pytest.mark.slow
def test_demo_runs_again_into_the_same_directory(tmp_path):
    # A rerun must replace an earlier run's outputs, not refuse to start: the BiGS section
    # trains with `train`, which refuses a directory holding metrics or checkpoints.
    argv = ["demo", "--small", "--only", "bigs", "--out", str(tmp_path)]
    earlier = tmp_path / "bigs"
    (earlier / "checkpoints" / "step_00000010").mkdir(parents=True)
    (earlier / "metrics.jsonl").write_text('{"step": 10, "split": "train", "loss": 9.0}\n')
    (earlier / "stale.txt").write_text("from an earlier run")
    (earlier / ".lineax_seq_demo").touch()  # written by that earlier demo run
    assert main(argv) == 0
    metrics = (earlier / "metrics.jsonl").read_text()
    assert '"loss": 9.0' not in metrics and '"split": "eval"' in metrics
    assert not (earlier / "stale.txt").exists()


def test_demo_out_must_be_a_directory(tmp_path, capsys):
    (tmp_path / "file").touch()
    for out, message in (("file", "exists and is not a directory"), ("file/x", "is a file")):
        with pytest.raises(SystemExit) as exit_info:
            main(["demo", "--small", "--out", str(tmp_path / out)])
        err = capsys.readouterr().err.splitlines()[-1]
        assert exit_info.value.code == 2 and err.startswith("python -m lineax_seq demo: error: ")
        assert message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    # A section directory is replaced only if a demo wrote it: a user's files there were
    # deleted, and a file in its place was a traceback.
    (tmp_path / "mine" / "s4d").mkdir(parents=True)
    (tmp_path / "mine" / "s4d" / "notes.txt").write_text("precious")
    (tmp_path / "mine" / "bst").touch()
    for only, message in (("s4d", "holds files a demo did not write"), ("bst", "not a dir")):
        with pytest.raises(SystemExit):
            main(["demo", "--small", "--only", only, "--out", str(tmp_path / "mine")])
        assert message in capsys.readouterr().err.splitlines()[-1]
    assert (tmp_path / "mine" / "s4d" / "notes.txt").read_text() == "precious"
    # Nor a demo's directory holding a user's file besides those its marker lists (it
    # was deleted with the rest); a marker listing none is an interrupted run's.
    from lineax_seq.experiments import _demo

    section = tmp_path / "mine" / "s4d"
    (section / "plots").mkdir()
    (section / "plots" / "a.png").write_text("demo")
    (section / _demo.MARKER).write_text("plots/a.png\n")
    problem = _demo._section_problem(section)
    assert "holds files a demo did not write (notes.txt)" in problem, problem
    (section / "notes.txt").unlink()
    assert _demo._section_problem(section) is None
    (section / _demo.MARKER).write_text("")
    (section / "notes.txt").write_text("written before the run stopped")
    assert _demo._section_problem(section) is None


def _entry_points() -> dict:
    """Every run-time checked layer, head and model with NumPy arguments."""
    import jax.random as jr
    import numpy as np

    ls, k = lineax_seq, jr.key(0)
    x = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    tokens = ls.ByteTokenizer().encode("numpy ids, 16 b")  # int32 NumPy, 15 bytes
    tokens = np.concatenate([tokens, tokens[:1]])
    mask = np.arange(16) < 12
    s4d = ls.S4D(8, state_size=4, key=k)
    lm = ls.BlockStateTransformerLM(
        263, 8, num_layers=2, num_heads=2, window=4, bst_layers=(1,), key=k
    )
    bigs = ls.BiGS(263, 8, 1, key=k)
    calls = {
        "S4D": (s4d, (x,)),
        "S4D.step": (s4d.step, (np.asarray(s4d.init_state()), x[0])),
        "MultiHeadAttention": (ls.MultiHeadAttention(8, 2, key=k), (x,)),
        "SlidingWindowAttention": (ls.SlidingWindowAttention(8, 2, 4, key=k), (x,)),
        "SlidingWindowLayer": (ls.SlidingWindowLayer(8, 2, 4, key=k), (x,)),
        "BlockStateTransformerLayer": (
            ls.BlockStateTransformerLayer(8, 2, 4, ssm_features=4, key=k),
            (x,),
        ),
        "BlockRecurrentTransformerLayer": (ls.BlockRecurrentTransformerLayer(8, 2, 4, key=k), (x,)),
        "BlockStateTransformerLM": (lm, (tokens,)),
        "BiGS": (bigs, (tokens, mask)),
        "GatedLayer": (ls.GatedLayer(8, key=k), (x, mask)),
        "DirectionalSSM": (ls.DirectionalSSM(8, key=k), (x, mask)),
        "SequenceClassificationHead": (ls.SequenceClassificationHead(8, 3, key=k), (x, mask)),
        "SpanExtractionHead": (ls.SpanExtractionHead(8, key=k), (x, mask)),
        "MultipleChoiceHead": (ls.MultipleChoiceHead(8, key=k), (x[None], mask[None])),
        "MaskedLMHead": (
            ls.MaskedLMHead(8, 263, key=k),
            (x, np.asarray(bigs.token_embedding.weight)),
        ),
        "KoopmanAutoencoder": (ls.KoopmanAutoencoder(8, 4, width=8, key=k), (x[0],)),
        "MLPBaseline": (ls.MLPBaseline(8, 2, width=8, key=k), (x[0], x[1, :2])),
        "LinearKoopmanDynamics": (ls.LinearKoopmanDynamics(8, 2, key=k), (x[0], x[1, :2])),
        "MLPDynamics": (ls.MLPDynamics(8, width=8, key=k), (x[0],)),
        "UnitNormLinear": (ls.UnitNormLinear(8, 3, key=k), (x[0],)),
    }
    return calls


def test_entry_points_take_numpy_inputs():
    """Layers and models take NumPy arrays (a tokenizer's ids, `np.random` data), as
    Equinox's layers do, and give what the same JAX arrays give; their run-time type
    check used to refuse them."""
    import jax.numpy as jnp
    import numpy as np

    for name, (call, args) in _entry_points().items():
        got = call(*args)
        want = call(*(jnp.asarray(a) for a in args))
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert isinstance(g, jax.Array), name
            np.testing.assert_array_equal(g, w, err_msg=name)


def test_layers_take_key_like_equinox_layers():
    """Every layer, head and model takes `key=` at call time, as Equinox's layers do
    (deterministic ones ignore it), so they compose with `eqx.nn.Sequential`, which
    always passes one; most used to raise a TypeError."""
    import equinox as eqx
    import jax.numpy as jnp
    import jax.random as jr
    import numpy as np

    ls, k = lineax_seq, jr.key(0)
    calls = _entry_points()
    del calls["S4D.step"]  # a recurrent step, not a layer
    koopman = ls.KoopmanAutoencoder(2, 4, width=8, key=k)
    calls["KoopmanAutoencoder"] = (koopman, (jnp.ones(2),))
    calls["UnitNormLinear"] = (koopman.decoder, (jnp.ones(4),))
    calls["MLPBaseline"] = (ls.MLPBaseline(2, width=8, key=k), (jnp.ones(2),))
    calls["LinearKoopmanDynamics"] = (koopman.dynamics, (jnp.ones(4),))
    mlp_dynamics = ls.KoopmanAutoencoder(2, 4, width=8, dynamics="mlp", key=k).dynamics
    calls["MLPDynamics"] = (mlp_dynamics, (jnp.ones(4),))
    for name, (call, args) in calls.items():
        want = call(*args)
        for key in (None, jr.key(1)):
            got = call(*args, key=key)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                np.testing.assert_array_equal(g, w, err_msg=name)
    x = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    layers = [
        ls.S4D(8, state_size=4, key=k),
        eqx.nn.Lambda(jax.nn.gelu),
        ls.SlidingWindowLayer(8, 2, 4, key=k),
        ls.GatedLayer(8, key=k),
    ]
    want = x
    for layer in layers:
        want = layer(want)
    np.testing.assert_array_equal(eqx.nn.Sequential(layers)(x, key=k), want)


def _public_signatures():
    """`(name, parameter)` for every parameter of every public function, class
    constructor and public method of a public class."""
    import inspect

    for name in lineax_seq.__all__:
        obj = getattr(lineax_seq, name)
        if inspect.isclass(obj):
            members = [("__init__", obj.__init__)] + [
                (m, f)
                for m, f in vars(obj).items()
                if (m == "__call__" or not m.startswith("_")) and callable(f)
            ]
            members += [
                (m, vars(obj)[m].__func__)
                for m in vars(obj)
                if isinstance(vars(obj)[m], classmethod)
            ]
        elif callable(obj):
            members = [("", obj)]
        else:
            continue
        for member, fn in members:
            try:
                params = inspect.signature(fn).parameters.values()
            except (TypeError, ValueError):
                continue
            for p in params:
                yield f"{name}.{member}".rstrip("."), p


def test_number_arguments_take_numpy_numbers_in_their_hints():
    """Sizes, lengths and counts are validated by `check_int`, which takes NumPy integers
    (`np.int64(8)`), so their hints say `IntLike`; real numbers are validated by
    `check_real`, which takes ints and NumPy numbers, so theirs say `RealScalar` (or at
    least `float | int`). A bare `int` or `float` hint made the shape-checked build
    (jaxtyping + beartype) refuse what the plain one accepts."""
    import typing

    import numpy as np

    def bare(hint, kind, partner) -> bool:
        """`kind` where `partner` is not also allowed (alone, or in a union)."""
        if hint is kind:
            return True
        args = typing.get_args(hint)
        if kind in args and partner in args:
            args = tuple(a for a in args if a is not kind)
        return any(bare(a, kind, partner) for a in args)

    offenders = []
    for where, p in _public_signatures():
        hint = p.annotation
        if isinstance(hint, str) or hint is p.empty:
            continue
        if bare(hint, int, np.integer) or bare(hint, float, int):
            offenders.append(f"{where}({p.name}: {hint})")
    assert not offenders, "hint `int` or `float` where `IntLike` / `RealScalar` is meant:\n" + (
        "\n".join(offenders)
    )


def test_every_constructor_names_a_bad_key(no_jaxtyping):
    """A missing, integer or split (two) key was JAX's error from deep inside (`unexpected
    PRNG key type`, `split accepts a single key`), which never named `key`."""
    import inspect

    import equinox as eqx
    import jax.random as jr

    modules = [
        cls
        for cls in map(lambda name: getattr(lineax_seq, name), lineax_seq.__all__)
        if inspect.isclass(cls)
        and issubclass(cls, eqx.Module)
        and "key" in inspect.signature(cls.__init__).parameters
    ]
    assert len(modules) >= 20
    for cls in modules:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        sizes = [8 for p in params if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        for bad in (None, 0, jr.split(jr.key(0), 2)):
            with pytest.raises(TypeError, match="key must be one JAX PRNG key"):
                cls(*sizes, key=bad)


def test_constructors_and_sizes_take_numpy_integers():
    """The same models and outputs from NumPy integer sizes (and layer-index arrays) as
    from Python ints; run under the suite's jaxtyping hook, so the hints are exercised
    too (and a size reaching JAX arithmetic unconverted fails strict promotion)."""
    import equinox as eqx
    import jax.random as jr
    import numpy as np

    ls, k = lineax_seq, jr.key(0)
    builds = {
        "S4DKernel": lambda n: ls.S4DKernel(n(4), n(2), key=k)(n(6)),
        "HyenaFilter": lambda n: ls.HyenaFilter(n(2), order=n(4), max_length=n(8), key=k)(n(8)),
        "sliding_window_mask": lambda n: ls.sliding_window_mask(n(4)),
        "relative_position_bucket": lambda n: ls.relative_position_bucket(
            np.arange(-3, 3), bidirectional=False, num_buckets=n(8), max_distance=n(16)
        ),
        "BlockStateTransformerLM": lambda n: ls.BlockStateTransformerLM(
            n(11), n(8), n(2), num_heads=n(2), window=n(4), bst_layers=[n(1)], key=k
        ),  # equal modules, static fields included: equal outputs
        "BiGS": lambda n: ls.BiGS(n(11), n(8), n(1), key=k),
        "bst_variant_config": lambda n: ls.bst_variant_config("BST:SH:S4", n(4)),
        "MultiHeadAttention": lambda n: ls.MultiHeadAttention(n(8), n(2), kv_dim=n(4), key=k),
    }
    for name, build in builds.items():
        assert eqx.tree_equal(build(np.int64), build(int)), name
    # Real hyper-parameters as ints and NumPy floats (exactly representable values).
    reals = {
        "S4DKernel": lambda r: ls.S4DKernel(4, dt_min=r(0.125), dt_max=r(1), key=k),
        "HyenaFilter": lambda r: ls.HyenaFilter(2, max_length=8, slow_decay=r(2), key=k),
        "BiGS": lambda r: ls.BiGS(11, 8, 1, dropout=r(0), init_std=r(0.5), key=k),
    }
    for name, build in reals.items():
        want = build(float)
        assert eqx.tree_equal(build(np.float32), want), name
        assert eqx.tree_equal(build(lambda v: int(v) if v == int(v) else v), want), name
    for g in (10, np.float32(10), np.int64(10)):  # parameters are leaves, kept as given
        assert float(ls.get_system("pendulum", g=g).g) == 10.0
    lm = lambda layers: ls.BlockStateTransformerLM(
        11, 8, 2, num_heads=2, window=4, bst_layers=layers, key=k
    )
    assert eqx.tree_equal(lm(np.array([1])), lm((1,)))


def test_repeated_eager_calls_compile_nothing():
    """Models are often called outside `jit` (the README does), and decoding loops written
    in Python call `step`: a repeated call with the same shapes compiles nothing. BiGS's
    scan over layers, BRECT's over blocks and the steps' `lax.cond` take fresh closures,
    which eager JAX compiled again on every call (0.2-0.5 s each)."""
    import jax.numpy as jnp
    import jax.random as jr

    key = jr.key(0)
    x, ids = jr.normal(key, (8, 8)), jnp.arange(8) % 5
    bigs = lineax_seq.BiGS(10, 8, 2, key=key)
    brect = lineax_seq.BlockRecurrentTransformerLayer(8, 2, 4, num_states=3, key=key)
    lm = lineax_seq.BlockStateTransformerLM(
        11, 8, 2, num_heads=2, window=4, context="mf", bst_layers=(0,), recurrent_layers=(1,),
        num_states=3, state_size=4, key=key,
    )  # fmt: skip
    cache = lm.init_cache(8)
    calls = [lambda: bigs(ids, inference=True), lambda: brect(x), lambda: lm.step(cache, 3)]
    for call in calls:
        call()
    with compilations() as compiled:
        for call in calls:
            call()
    assert compiled == []
