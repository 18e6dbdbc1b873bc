"""What the Array API standard (2023.12) names: its functions, dtypes and constants.

Kept as data so the namespace is assembled from it (``hologram.array_api``) and the
tests can check that every name is there and behaves as ``array-api-strict`` says.
"""

from __future__ import annotations

CREATION = ("arange", "asarray", "empty", "empty_like", "eye", "from_dlpack", "full",
            "full_like", "linspace", "meshgrid", "ones", "ones_like", "tril", "triu", "zeros",
            "zeros_like")
DATA_TYPES = ("astype", "can_cast", "finfo", "iinfo", "isdtype", "result_type")
ELEMENTWISE = ("abs", "acos", "acosh", "add", "asin", "asinh", "atan", "atan2", "atanh",
               "bitwise_and", "bitwise_left_shift", "bitwise_invert", "bitwise_or",
               "bitwise_right_shift", "bitwise_xor", "ceil", "clip", "conj", "copysign", "cos",
               "cosh", "divide", "equal", "exp", "expm1", "floor", "floor_divide", "greater",
               "greater_equal", "hypot", "imag", "isfinite", "isinf", "isnan", "less",
               "less_equal", "log", "log1p", "log2", "log10", "logaddexp", "logical_and",
               "logical_not", "logical_or", "logical_xor", "maximum", "minimum", "multiply",
               "negative", "nextafter", "not_equal", "positive", "pow", "real", "reciprocal",
               "remainder", "round", "sign", "signbit", "sin", "sinh", "square", "sqrt",
               "subtract", "tan", "tanh", "trunc")
INDEXING = ("take", "take_along_axis")
LINALG = ("matmul", "matrix_transpose", "tensordot", "vecdot")
MANIPULATION = ("broadcast_arrays", "broadcast_shapes", "broadcast_to", "concat",
                "expand_dims", "flip", "moveaxis", "permute_dims", "repeat", "reshape", "roll",
                "squeeze", "stack", "tile", "unstack")
SEARCHING = ("argmax", "argmin", "count_nonzero", "nonzero", "searchsorted", "where")
#: 2024.12 additions NumPy already has
NEWER = ("isin",)
SETS = ("unique_all", "unique_counts", "unique_inverse", "unique_values")
SORTING = ("argsort", "sort")
STATISTICAL = ("cumulative_sum", "cumulative_prod", "max", "mean", "min", "prod", "std",
               "sum", "var")
UTILITY = ("all", "any", "diff")
INSPECTION = ("__array_namespace_info__",)

FUNCTIONS = (CREATION + DATA_TYPES + ELEMENTWISE + INDEXING + LINALG + MANIPULATION
             + SEARCHING + SETS + SORTING + STATISTICAL + UTILITY + INSPECTION + NEWER)

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64", "complex64", "complex128")
CONSTANTS = ("e", "inf", "nan", "newaxis", "pi")

#: The ``linalg`` extension's functions.
LINALG_EXTENSION = ("cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
                    "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer",
                    "pinv", "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace",
                    "vecdot", "vector_norm")
