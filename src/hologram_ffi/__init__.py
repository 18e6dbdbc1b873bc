"""``import hologram_ffi as hg``: the original bindings' module name, kept for old callers.

Scripts written for the Rust/UniFFI ``hologram_ffi`` package run unchanged on
hologram through this alias; everything lives in :mod:`hologram.ffi`.
"""

from hologram import ffi as _ffi
from hologram.ffi import *  # noqa: F403

__all__ = list(_ffi.__all__)
