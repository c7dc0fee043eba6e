"""Ctrl-C (SIGINT) where it would do harm: held, then raised as :class:`KeyboardInterrupt` once it is safe.

Python raises :class:`KeyboardInterrupt` between any two bytecodes of the main thread. Two moments cannot take it:

* **a commit** (:mod:`rope_passes.io.disk`): a file half moved into place. The commit finishes (or rolls back) first.
* **importing third-party modules** (the CLI's commands: onnx, onnx_ir, onnxscript, numpy, sympy; onnxruntime when a
  pass first evaluates a subgraph). Import code is not written to be interrupted, and measured here (SIGINT at
  random moments of ``rope-passes optimize``' start-up): mpmath's bare ``except:`` around ``import gmpy`` swallowed
  the interrupt and the run went on to the end (exit 0); onnx's nanobind module raised it out of ``enum.__setattr__``
  into C++ and the process aborted (SIGABRT); dataclasses' ``exec`` left CPython's "unhandled interrupt" mark set, so
  ``python -m rope_passes`` died by SIGINT after printing its one line (:func:`forget_interrupt_seen_in_exec`).

Holding is per process and only in the main thread (signal handlers live there); anywhere else the block just runs.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold Ctrl-C until the block is done; then raise it (as the handler in place before the block would)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)  # now handled as it would have been


def forget_interrupt_seen_in_exec() -> None:
    """Let a handled Ctrl-C end the process with the handler's exit code, not as a death by SIGINT.

    CPython up to 3.11 marks the process "interrupted, unhandled" whenever a KeyboardInterrupt leaves ``exec`` of a
    string (``PyRun_StringFlags``; dataclasses build every ``__init__`` that way), even when a caller handles it, as
    the CLI's ``main`` does; at exit ``python -m rope_passes`` then kills itself with SIGINT (returncode -2). The mark
    is cleared by the next ``exec`` of a string that completes."""
    exec("")
