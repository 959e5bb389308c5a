"""`python -m lineax_seq <command>`: the demo and the papers' experiments.

Each command lives in `lineax_seq/experiments/_<name>.py`, which provides
`add_arguments(parser)` and `run(args)`. Only the chosen command's module is imported
(to build its options), so `python -m lineax_seq --help` loads no experiment. A
`UsageError` that a command raises (an input it cannot use, found before training) is
reported as the command's usage error: one line, exit status 2.
"""

import argparse
import importlib
import sys

from lineax_seq.experiments._cli import HelpFormatter, UsageError

_COMMANDS = {
    "demo": ("_demo", "Train small models end to end: S4D memory task, Koopman Duffing, ..."),
    "koopman": ("_koopman", "Koopman autoencoders with periodic reencoding (Table 1.1)."),
    "bst": ("_bst", "Block-State Transformer language modelling and length generalisation."),
    "bigs": ("_bigs", "BiGS masked-LM pretraining, fine-tuning and the Table 1 ablation."),
}

_DESCRIPTION = (
    "Run the lineax_seq demo or reproduce the papers' experiments "
    "(Koopman autoencoders, Block-State Transformer, BiGS). "
    "`python -m lineax_seq COMMAND --help` lists a command's options."
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m lineax_seq", description=_DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    parsers: dict[str, argparse.ArgumentParser] = {}
    # The command is the first argument that is not an option (the parser has no others).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module = None
    for name, (module_name, help_text) in _COMMANDS.items():
        command_parser = parsers[name] = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=HelpFormatter
        )
        if name != chosen:
            continue
        try:
            module = importlib.import_module(f"lineax_seq.experiments.{module_name}")
        except ModuleNotFoundError as e:
            if e.name != f"lineax_seq.experiments.{module_name}":
                raise
            parser.error(f"command {name!r} is not available in this build")
        module.add_arguments(command_parser)
    args = parser.parse_args(argv)  # exits unless `chosen` named a command
    assert module is not None
    try:
        return module.run(args) or 0
    except UsageError as e:
        parsers[args.command].error(str(e))


if __name__ == "__main__":
    sys.exit(main())
