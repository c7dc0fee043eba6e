"""Moved to :mod:`rope_passes.proofs.known`; kept for ``passes/_mrope_cone.py`` until it moves to ``proofs/`` too."""

from rope_passes.proofs.known import OPAQUE, SMALL, UNKNOWN_VARYING, Known, known_values

__all__ = ["OPAQUE", "SMALL", "UNKNOWN_VARYING", "Known", "known_values"]
