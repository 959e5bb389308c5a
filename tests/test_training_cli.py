"""The training command line (`python -m lineax_seq bigs ...`): user errors are usage
errors, found before any data is loaded or anything is written."""

import re

import pytest

from lineax_seq.__main__ import main


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_help_shows_a_single_percent_sign(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bigs", "pretrain", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "(15% masking" in out and "%%" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--vocab-size", "100"], r"--vocab-size: '100' is not an integer >= 263"),
        (["--corpus", "{tmp}/missing"], r"--corpus: '.*missing' does not exist"),
        (["--length", "2"], r"--length 2: masked-LM sequences need at least 3 tokens"),
        (["--resume"], r"--resume: .*run holds no run to resume \(no config.json\)"),
        (["--init-from", "{tmp}"], r"--init-from .*: not a `bigs pretrain` output"),
        # Named as missing (it said "(no config.json)"), with globs named as unexpanded.
        (["--init-from", "{tmp}/gone"], r"--init-from .*gone: does not exist \(a `bigs pre"),
        (["--init-from", "{tmp}/f.txt"], r"--init-from .*f.txt: is not a directory"),
        (["--corpus", "{tmp}/*.txt"], r"'.*\*.txt' does not exist \(wildcards are not expa"),
    ],
)
def test_pretrain_usage_errors(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    (tmp_path / "f.txt").write_text("a file")
    argv = [a.format(tmp=tmp_path) for a in argv]
    err = _usage_error(
        ["bigs", "pretrain", "--tokenizer", "byte", "--out", str(out), *argv], capsys
    )
    assert re.search(message, err), err
    assert err.startswith("usage: ") and not out.exists()


def test_existing_run_needs_resume(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "final").mkdir()  # it trained (a config alone: it never started)
    err = _usage_error(["bigs", "pretrain", "--out", str(tmp_path)], capsys)
    assert "already holds a run: pass --resume" in err


def test_finetune_kernels_and_ablation_usage_errors(tmp_path, capsys):
    for argv, message in (
        (["finetune", "--checkpoint", str(tmp_path)], "--task file needs --train PATH"),
        (["finetune", "--checkpoint", str(tmp_path), "--task", "listops"], "not a `bigs pretrain`"),
        (["finetune", "--checkpoint", "x", "--train", str(tmp_path / "no.csv")], "does not exist"),
        (["kernels", "--checkpoint", str(tmp_path)], "--checkpoint .*: not a `bigs pretrain`"),
        (["ablation", "--length", "2", "--out", str(tmp_path)], "--length 2: masked-LM"),
    ):
        assert re.search(message, _usage_error(["bigs", *argv], capsys))


def test_corpus_too_small_for_a_held_out_split(tmp_path, capsys):
    """Three files leave the hashed held-out split empty: one line naming --corpus and
    what to do with the CLI, not a traceback."""
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text(f"document {i}\n")
    argv = ["bigs", "pretrain", "--tokenizer", "byte", "--corpus", str(tmp_path),
            "--out", str(tmp_path / "run")]  # fmt: skip
    err = _usage_error(argv, capsys).splitlines()[-1]
    assert err.startswith(f"python -m lineax_seq bigs pretrain: error: --corpus '{tmp_path}'")
    assert "split='valid'" in err and "give more files, or one long text file" in err
    assert "split='all'" not in err  # the library's advice, not a command-line option
    assert not (tmp_path / "run").exists()


def test_ablation_corpus_errors_are_usage_errors(tmp_path, capsys):
    """They were tracebacks (pretrain's were wrapped, the ablation's not)."""
    (tmp_path / "tiny.txt").write_text("x\n")
    argv = ["bigs", "ablation", "--corpus", str(tmp_path / "tiny.txt"), "--out", str(tmp_path)]
    err = _usage_error(argv, capsys).splitlines()[-1]
    assert err.startswith(f"python -m lineax_seq bigs ablation: error: --corpus '{tmp_path}")
    assert "split='all'" not in err and not list(tmp_path.glob("bigs_ablation*"))
