"""Import torchvision where its wheel's C++ operators do not load (tests, benchmarks).

The only ``torchvision==0.28.0`` wheel the package registries serve here is the CUDA
build. Beside the CPU build of torch its extension library fails to load, and
``import torchvision`` then stops at registering Python fakes for ``torchvision::nms``
and ``torchvision::qnms`` ("operator torchvision::nms does not exist"); transformers
imports torchvision whenever it is installed, so its models would fail to import too.
Defining those two schemas (no kernels) lets the import finish. The CNNs the test suite
and ``benchmarks/bench_models.py`` build never call them; calling them raises
NotImplementedError from the dispatcher, not a wrong result.

Nothing happens where torchvision imports by itself (a matching wheel), nor where it is
not installed: the schemas are defined only after an import failed for that reason.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

import torch

#: The schemas torchvision's Python side registers fakes for at import.
SCHEMAS = {
    "torchvision::nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "torchvision::qnms": "(Tensor qdets, Tensor scores, float iou_threshold, float scale, "
                         "int zero_point) -> Tensor",
}


def _define_missing() -> None:
    for name, schema in SCHEMAS.items():
        ns, op = name.split("::")
        if not hasattr(getattr(torch.ops, ns), op):
            torch.library.define(name, schema)


def import_torchvision() -> ModuleType | None:
    """``torchvision``, imported (None when it is not installed)."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    # a failed import leaves its submodules behind: drop them before trying again
    for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[mod]
    _define_missing()
    return importlib.import_module("torchvision")
