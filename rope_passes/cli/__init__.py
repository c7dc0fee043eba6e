"""The ``rope-passes`` command line. One module per sub-command, each with ``add_parser(subparsers)``.

Errors caused by input (bad file, bad option) print one line ``rope-passes: error: ...`` and exit 2; never a traceback.
Ctrl-C at any moment prints ``rope-passes: interrupted`` and exits 130 (a commit in progress finishes or rolls back
first); output piped into a reader that leaves early (``| head``) ends quietly with exit 0.
"""

from __future__ import annotations

import argparse
import errno
import functools
import gc
import importlib
import os
import sys

from rope_passes import __version__
from rope_passes.errors import RopePassesError
from rope_passes.interrupts import forget_interrupt_seen_in_exec, held_interrupts
from rope_passes.runtimes import python_runtimes, with_tables

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


#: the WebGPU runtimes that are a Python installation (the default ``--runtime`` choices), and every runtime with a
#: probed table (``optimize --runtime`` may name the JS ones too: their tables say what they load and read); from
#: the runtime descriptors (rope_passes.runtimes, which imports nothing heavy)
RUNTIMES = python_runtimes()
TABLE_RUNTIMES = with_tables()

#: third-party modules each command imports, imported by :func:`main` with Ctrl-C held once the arguments are
#: parsed (an interrupt inside mpmath's or onnx's own imports is swallowed or aborts the process; the commands
#: themselves import them lazily, so that ``--help`` and usage errors import nothing heavy)
PRELOAD = {"optimize": ("onnx_ir", "onnxscript.rewriter"), "passes": ("onnx_ir", "onnxscript.rewriter"),
           "demo": ("onnx_ir", "onnxscript.rewriter"), "lint": ("onnx_ir",), "inspect": ("onnx_ir",),
           "check": ("onnx_ir",)}

#: the exit codes every command shares, for the end of each ``--help`` (each command adds what 0/1 mean for it)
EXIT_COMMON = ("2  usage error, or a model that could not be read or written (one line, no traceback)",
               "3  internal error (a bug: please report it; ROPE_PASSES_DEBUG=1 shows the traceback)",
               "130  interrupted (Ctrl-C); a commit in progress finishes or rolls back first")


def exit_codes(*codes: str) -> str:
    """An ``exit codes:`` section for a command's ``--help``: the command's own codes, then those of
    :data:`EXIT_COMMON` it does not state itself."""
    own = {c.split()[0] for c in codes}
    return "exit codes:\n" + "\n".join(f"  {c}" for c in (*codes, *(c for c in EXIT_COMMON if c.split()[0] not in own)))


class _Help(argparse.HelpFormatter):
    """argparse's formatter, but the ``exit codes:`` section keeps one line per code (a long one wrapped under
    itself) instead of being filled into one paragraph."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if not text.startswith("exit codes:"):
            return super()._fill_text(text, width, indent)
        import textwrap

        out = []
        for line in text.splitlines():
            body = line.lstrip()
            lead = indent + " " * (len(line) - len(body))
            hang = lead + " " * (len(body.split("  ")[0]) + 2 if line.startswith(" ") else 0)
            out.append(textwrap.fill(body, width, initial_indent=lead, subsequent_indent=hang))
        return "\n".join(out)


def add_command(sub: argparse._SubParsersAction, name: str, *, help: str, description: str,
                exits: tuple[str, ...]) -> argparse.ArgumentParser:
    """One sub-command's parser: ``help`` (its line in ``rope-passes --help``), ``description`` (the top of its own
    ``--help``) and its exit codes (the end of it: ``exits``, one "CODE  meaning" each, then :data:`EXIT_COMMON`)."""
    return sub.add_parser(name, help=help, description=description, epilog=exit_codes(*exits), formatter_class=_Help)


def add_runtime_argument(parser: argparse.ArgumentParser, what: str,
                         default: str = "the one installed beside rope-passes", browser: bool = False) -> None:
    """``--runtime onnxruntime-webgpu|onnxruntime-ep-webgpu`` for optimize, lint and inspect
    (:mod:`rope_passes.runtimes`); ``default``: what no ``--runtime`` means for that command; ``browser``: the
    JS runtimes with a probed table are choices too (``optimize``)."""
    parser.add_argument("--runtime", choices=TABLE_RUNTIMES if browser else RUNTIMES, default=None,
                        help=f"{what} (default: {default}; see docs/runtimes.md)")


#: :data:`rope_passes.plan.PRESETS`, spelled out so that the parser imports nothing heavy (tests/test_startup.py checks
#: they agree)
PRESET_NAMES = ("exporter", "webgpu", "webgpu-graph")


def add_preset_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """``--preset NAME`` (:data:`rope_passes.plan.PRESETS`), for optimize and lint; ``--target`` is the same flag
    (its name before issue 33, kept for the command lines users already type)."""
    parser.add_argument("--preset", "--target", dest="preset", choices=PRESET_NAMES, metavar="PRESET",
                        help=f"{help}; one of {', '.join(PRESET_NAMES)} (--target is an alias)")


def build_parser() -> argparse.ArgumentParser:
    """The whole parser. The command modules import only argparse-level things at the top (their work imports
    onnx_ir, onnxruntime, rich... inside ``run``), so ``--help`` and usage errors cost no heavy import
    (tests/test_startup.py)."""
    parser = _Parser(
        prog="rope-passes",
        description="ONNX rewrite passes for rotary position embeddings, for onnxruntime's WebGPU EP.",
        epilog=exit_codes("0  success (see each command's --help for what 1 means there)"),
        formatter_class=_Help,
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


def tune_gc() -> None:
    """Python's cyclic collector, set for one short process that holds one large graph (10^5-10^6 objects): what
    the imports made moves out of its way (``gc.freeze``) and the young generation is collected every 50,000
    allocations, not 700. Issue 17: ~0.15-0.2 s of the 3B legacy graph's ~1.1 s ``optimize`` went to collections
    (bench/run_all). The frozen objects are the imports' (modules, classes, tables), alive until exit anyway; the
    collector still collects everything made after them, only less often."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def main(argv: list[str] | None = None) -> int:
    try:
        with held_interrupts():  # imports the command modules: not safe to interrupt
            parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        with held_interrupts():  # the command's third-party imports: Ctrl-C here would break them (see interrupts)
            for module in PRELOAD.get(args.command, ()):
                importlib.import_module(module)
        if argv is None:  # this process is the command (not a caller's, e.g. a test's)
            tune_gc()
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
