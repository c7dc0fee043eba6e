"""Moved to :mod:`rope_passes.proofs.cone`; kept for ``passes/_mrope_cone.py`` until it moves to ``proofs/`` too."""

from rope_passes.proofs.cone import Cone, Label, Token, Val, refuse

__all__ = ["Cone", "Label", "Token", "Val", "refuse"]
