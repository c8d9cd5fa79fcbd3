"""The `tensorscope` command: a thin argparse layer over the library.

Each subcommand lives in `tensorscope.commands.<name>` with ``HELP``, ``DESCRIPTION``,
``add_arguments(parser)`` and ``run(args) -> int``. Exit codes follow diff(1):
0 clean / identical, 1 findings / differences, 2 error (one line on stderr, never a traceback).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .formats import describe_error
from .render import error_line

__all__ = ["main", "COMMANDS", "EXIT_CLEAN", "EXIT_FINDINGS", "EXIT_ERROR"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
COMMANDS = ["inspect", "graph", "diff", "scan", "convert", "tui"]


def _command_modules():
    for name in COMMANDS:
        yield name, importlib.import_module(f"tensorscope.commands.{name}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """An argument error: exit 2 with the command's own one line, like every other error, and
        where to look (not a usage block the line would drown in)."""
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        print(f"  (`{self.prog} --help` lists the arguments)", file=sys.stderr)
        raise SystemExit(EXIT_ERROR)


def _subcommand(parser: argparse.ArgumentParser, name: str | None):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tensorscope",
                     description="Open, diff and scan model files without executing them.")
    parser.add_argument("--version", action="version", version=f"tensorscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, mod in _command_modules():
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        if not any("-v" in a.option_strings for a in p._actions):
            p.add_argument("-v", "--verbose", action="store_true",
                           help="say on stderr what reading cost (bytes fetched and requests "
                                "made for URLs)")
        p.set_defaults(_run=mod.run)
    return parser


# Commands that open a model or two and then work over its records: the CLI process pauses its
# own cyclic collector while they run (`formats.gc_paused`; 10^5 records without cycles, which
# collections would walk again and again). The library never does this for its host; `scan`
# (many files, garbage collected as it goes) and `tui` (a long session) keep theirs running.
GC_PAUSED = frozenset({"inspect", "diff", "graph", "convert"})


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:   # said by the command they were given to, not by the top-level parser
            owner = _subcommand(parser, getattr(args, "command", None)) or parser
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:
        return int(e.code or 0)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    from .remote import reset_totals
    reset_totals()  # what this command fetched, whatever ran before in this process
    blas_pinned = _pin_blas_threads()
    try:
        if args.command in GC_PAUSED:
            from .formats import gc_paused
            with gc_paused():
                return int(args._run(args))
        return int(args._run(args))
    except KeyboardInterrupt:
        print(f"tensorscope {args.command}: interrupted", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return EXIT_CLEAN
    except (RecursionError, MemoryError) as e:  # defence in depth: still one line, exit 2
        return error_line(args.command, describe_error(e))
    except Exception as e:  # noqa: BLE001 — the boundary where every error becomes one line
        return error_line(args.command, describe_error(e))
    finally:
        if blas_pinned:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        _say_cost(args)


def _pin_blas_threads() -> bool:
    """OpenBLAS single-threaded for numpy loaded during this command, unless numpy is loaded
    already or the user chose OPENBLAS_NUM_THREADS; True when the variable was set here (and is
    to be removed after the command). OpenBLAS starts a server thread per core at load, and each
    spins ~0.1 s before it sleeps, on the cores the command runs on; no command wants them (the
    diff's compiled pass calls no BLAS, its numpy passes pin each pool thread's BLAS to one
    thread; statistics and conversion are reductions and copies). The variable is read at
    numpy's load only; only the CLI sets it, never the library."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return False
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    return True


def _say_cost(args) -> None:
    from .remote import cost_line
    line = cost_line() if getattr(args, "verbose", False) else None
    if line:
        print(f"tensorscope: {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
