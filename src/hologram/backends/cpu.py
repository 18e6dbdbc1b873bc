"""The CPU backend.

Until the native compiler lands it runs programs through the reference
interpreter, so every caller already goes through the same compile/launch path.
"""

from __future__ import annotations

from .reference import ReferenceBackend


class CPUBackend(ReferenceBackend):
    name = "cpu"
