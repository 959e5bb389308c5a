"""`python -m lineax_seq <command>`: the demo and the papers' experiments.

Each command lives in `lineax_seq/experiments/_<name>.py`, which provides
`add_arguments(parser)` and `run(args)`; it is imported only when chosen, so
`--help` stays fast.
"""

import argparse
import importlib
import sys

_COMMANDS = {
    "demo": ("_demo", "Train small models end to end: S4D memory task, Koopman Duffing, ..."),
    "koopman": ("_koopman", "Koopman autoencoders with periodic reencoding (Table 1.1)."),
    "bst": ("_bst", "Block-State Transformer language modelling and length generalisation."),
    "bigs": ("_bigs", "BiGS masked-LM pretraining, fine-tuning and the Table 1 ablation."),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lineax_seq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module_name, help_text) in _COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(f"lineax_seq.experiments.{module_name}")
        except ModuleNotFoundError as e:
            if e.name != f"lineax_seq.experiments.{module_name}":
                raise
            continue
        module.add_arguments(command_parser)
        modules[name] = module
    args = parser.parse_args(argv)
    if args.command not in modules:
        parser.error(f"command {args.command!r} is not available in this build")
    return modules[args.command].run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
