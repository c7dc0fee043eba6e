"""User-facing errors: each carries a one-line message that the CLI prints as ``error: ...``."""

from __future__ import annotations


class RopePassesError(Exception):
    """An error caused by the user's input (bad file, bad option); printed in one line, exit code 2."""

    exit_code = 2

    def __str__(self) -> str:  # keep it to one line whatever the cause said
        return " ".join(super().__str__().split())


class ModelLoadError(RopePassesError):
    """The model (or its external data, or its folder) cannot be read."""


class ModelSaveError(RopePassesError):
    """The rewritten model cannot be written where the user asked."""


class UsageError(RopePassesError):
    """Bad option values or combinations."""


def show_value(value: object) -> str:
    """``value`` as a short one-line JSON (else repr) for an error message about a config entry."""
    import json

    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."
