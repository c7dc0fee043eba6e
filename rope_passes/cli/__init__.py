"""The ``rope-passes`` command line. One module per sub-command, each with ``add_parser(subparsers)``.

Errors caused by input (bad file, bad option) print one line ``rope-passes: error: ...`` and exit 2; never a traceback.
Ctrl-C at any moment prints ``rope-passes: interrupted`` and exits 130 (a commit in progress finishes or rolls back
first); output piped into a reader that leaves early (``| head``) ends quietly with exit 0.
"""

from __future__ import annotations

import argparse
import errno
import functools
import os
import sys

from rope_passes import __version__
from rope_passes.errors import RopePassesError
from rope_passes.interrupts import forget_interrupt_seen_in_exec, held_interrupts

COMMANDS = ("optimize", "inspect", "check", "lint", "passes", "demo")


@functools.cache
def _console_class():
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich would exit 1 itself; ``main`` ends quietly
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return _Console


def output_console():
    """A rich Console for stdout: the terminal's width, or 120 columns when piped (logs, CI), not rich's 80."""
    return _console_class()(width=None if sys.stdout.isatty() else 120)


def _stdout_to_devnull() -> None:
    """The reader of stdout left: later writes (and the flush at exit) go nowhere instead of failing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_runtime_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--runtime onnxruntime-webgpu|onnxruntime-ep-webgpu`` (default: the runtime installed here), for optimize,
    lint and inspect (:mod:`rope_passes.targets`)."""
    from rope_passes.targets import RUNTIMES

    parser.add_argument("--runtime", choices=RUNTIMES, default=None,
                        help=f"{what} (default: the one installed beside rope-passes; see docs/runtimes.md)")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = _Parser(
        prog="rope-passes",
        description="ONNX rewrite passes for rotary position embeddings, for onnxruntime's WebGPU EP.",
    )
    parser.add_argument("--version", action="version", version=f"rope-passes {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"rope_passes.cli.{name}_cmd")
        except ModuleNotFoundError as exc:
            if exc.name != f"rope_passes.cli.{name}_cmd":
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        with held_interrupts():  # imports the commands (onnx_ir, onnxscript): not safe to interrupt
            parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that left shows here, not as a message at exit
        return code
    except RopePassesError as exc:
        print(f"rope-passes: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rope-passes: interrupted", file=sys.stderr)
        forget_interrupt_seen_in_exec()
        return 130
    except BrokenPipeError:  # `rope-passes ... | head`: the reader left, which is fine
        _stdout_to_devnull()
        return 0
    except MemoryError:
        print("rope-passes: error: out of memory", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug of ours: one line for users, the traceback on request
        if os.environ.get("ROPE_PASSES_DEBUG"):
            raise
        detail = " ".join(str(exc).split())[:300]
        print(f"rope-passes: internal error: {type(exc).__name__}: {detail} "
              "(please report it; set ROPE_PASSES_DEBUG=1 for the traceback)", file=sys.stderr)
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
