"""``import hologram.numpy as xp``: the Array API namespace (``hologram.array_api``)."""

from __future__ import annotations

from .array_api import *  # noqa: F403
from .array_api import __all__, __array_api_version__, fft, linalg  # noqa: F401
