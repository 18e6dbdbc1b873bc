"""Drop-in ``torch.nn`` modules whose forward runs hologram programs.

Each class subclasses its ``torch.nn`` counterpart and overrides only
``forward``, so constructor arguments, parameter names, initialisation,
``state_dict`` keys and ``extra_repr`` are torch's own: a checkpoint saved from
``torch.nn.Linear`` loads into ``hologram_torch.nn.Linear`` and back.

Every constructor also accepts the seeds' optional leading hologram
``Executor`` (``Linear(exec, 512, 256)``) or ``executor=`` (an Executor or a
backend name); it picks the backend the module's ops run on, is kept as the
name ``hologram_backend`` and is not part of the state dict.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hologram.executor import Executor
from hologram.interop import default_executor

from . import functional as F
from .utils import backend_name

__all__ = [
    "BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "GELU", "LayerNorm", "Linear",
    "LogSoftmax", "MSELoss", "ReLU", "Sigmoid", "Softmax", "Tanh",
]


class _HologramModule:
    """Mixin: strips an optional leading Executor before torch's constructor runs.

    The module keeps the executor's backend name, not the executor: a name can be
    deep-copied, pickled with the module and traced by torch.compile.
    """

    hologram_backend: str

    def __init__(self, *args: Any, executor: Executor | str | None = None,
                 **kwargs: Any) -> None:
        if args and isinstance(args[0], Executor):
            if executor is not None:
                raise TypeError(f"{type(self).__name__}: executor given twice")
            executor, args = args[0], args[1:]
        backend = backend_name(executor)  # validates before torch builds parameters
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.hologram_backend = backend

    @property
    def executor(self) -> Executor:
        """The shared executor this module's ops launch on."""
        return default_executor(self.hologram_backend or "cpu")


class Linear(_HologramModule, torch.nn.Linear):
    """``torch.nn.Linear``: ``y = x @ W.T + b`` as one hologram GEMM with a fused bias."""

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias, executor=self.hologram_backend)


class ReLU(_HologramModule, torch.nn.ReLU):
    """``torch.nn.ReLU`` (``inplace=True`` writes into the input)."""

    def forward(self, input: Tensor) -> Tensor:
        return F.relu(input, inplace=self.inplace, executor=self.hologram_backend)


class Sigmoid(_HologramModule, torch.nn.Sigmoid):
    """``torch.nn.Sigmoid``."""

    def forward(self, input: Tensor) -> Tensor:
        return F.sigmoid(input, executor=self.hologram_backend)


class Tanh(_HologramModule, torch.nn.Tanh):
    """``torch.nn.Tanh``."""

    def forward(self, input: Tensor) -> Tensor:
        return F.tanh(input, executor=self.hologram_backend)


class GELU(_HologramModule, torch.nn.GELU):
    """``torch.nn.GELU`` (approximate='none' or 'tanh')."""

    def forward(self, input: Tensor) -> Tensor:
        return F.gelu(input, approximate=self.approximate, executor=self.hologram_backend)


class Softmax(_HologramModule, torch.nn.Softmax):
    """``torch.nn.Softmax`` over ``dim`` (None keeps torch's legacy implicit choice)."""

    def forward(self, input: Tensor) -> Tensor:
        return F.softmax(input, self.dim, _stacklevel=5, executor=self.hologram_backend)


class LogSoftmax(_HologramModule, torch.nn.LogSoftmax):
    """``torch.nn.LogSoftmax`` over ``dim``."""

    def forward(self, input: Tensor) -> Tensor:
        return F.log_softmax(input, self.dim, _stacklevel=5, executor=self.hologram_backend)


class LayerNorm(_HologramModule, torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` (elementwise_affine and bias as torch)."""

    def forward(self, input: Tensor) -> Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps,
                            executor=self.hologram_backend)


class MSELoss(_HologramModule, torch.nn.MSELoss):
    """``torch.nn.MSELoss``."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, reduction=self.reduction, executor=self.hologram_backend)


class CrossEntropyLoss(_HologramModule, torch.nn.CrossEntropyLoss):
    """``torch.nn.CrossEntropyLoss``: class indices or probabilities, weights,
    ignore_index and label smoothing."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing,
                               executor=self.hologram_backend)


class BCELoss(_HologramModule, torch.nn.BCELoss):
    """``torch.nn.BCELoss`` of probabilities."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy(input, target, weight=self.weight,
                                      reduction=self.reduction, executor=self.hologram_backend)


class BCEWithLogitsLoss(_HologramModule, torch.nn.BCEWithLogitsLoss):
    """``torch.nn.BCEWithLogitsLoss`` (weight and pos_weight as torch)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(
            input, target, self.weight, pos_weight=self.pos_weight, reduction=self.reduction,
            executor=self.hologram_backend)
