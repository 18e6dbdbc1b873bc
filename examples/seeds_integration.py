"""The integration guide's examples (shared/seeds/003), run unchanged on hologram.

The guide was written for the Rust ``hologram_ffi`` bindings; this script keeps
its calls exactly as written ("Vector Addition Example" and "Pattern 1: Convert
and Compute") to show old callers need no edits, and checks the results, so it
exits non-zero if the compatibility layer ever drifts. Pattern 1 uses PyTorch
when it is installed and the same calls on NumPy data otherwise.

    python examples/seeds_integration.py
"""

import json
import sys

import numpy as np

import hologram_ffi as hg


def vector_addition_example() -> bool:
    # --- the guide's "Vector Addition Example", unchanged --------------------------
    # Create executor
    exec_handle = hg.new_executor()

    # Allocate buffers
    size = 1000
    a_handle = hg.executor_allocate_buffer(exec_handle, size)
    b_handle = hg.executor_allocate_buffer(exec_handle, size)
    c_handle = hg.executor_allocate_buffer(exec_handle, size)

    # Prepare data
    data_a = [float(i) for i in range(size)]
    data_b = [float(i * 2) for i in range(size)]

    # Copy to buffers
    hg.buffer_copy_from_slice(exec_handle, a_handle, json.dumps(data_a))
    hg.buffer_copy_from_slice(exec_handle, b_handle, json.dumps(data_b))

    # Execute vector addition
    hg.vector_add_f32(exec_handle, a_handle, b_handle, c_handle, size)

    # Read results
    result_json = hg.buffer_to_vec(exec_handle, c_handle)
    result = json.loads(result_json)

    print(f"Result: {result[:10]}")  # First 10 elements

    # Cleanup
    hg.buffer_cleanup(a_handle)
    hg.buffer_cleanup(b_handle)
    hg.buffer_cleanup(c_handle)
    hg.executor_cleanup(exec_handle)
    # --- end of the guide's code ------------------------------------------------------

    ok = result == [float(3 * i) for i in range(size)]
    print(f"vector addition: {'OK' if ok else 'FAIL'}")
    return ok


def pattern1_torch() -> bool:
    # --- the guide's "Pattern 1: Convert and Compute", unchanged ----------------------
    import torch

    # Create PyTorch tensors
    x_torch = torch.randn(1000)

    # Convert to Hologram buffers
    exec_handle = hg.new_executor()
    x_handle = hg.executor_allocate_buffer(exec_handle, len(x_torch))
    hg.buffer_copy_from_slice(exec_handle, x_handle, json.dumps(x_torch.tolist()))

    # Apply ReLU
    y_handle = hg.executor_allocate_buffer(exec_handle, len(x_torch))
    hg.vector_relu_f32(exec_handle, x_handle, y_handle, len(x_torch))

    # Convert back to PyTorch
    result_json = hg.buffer_to_vec(exec_handle, y_handle)
    y_torch = torch.tensor(json.loads(result_json))

    # Verify with PyTorch
    y_torch_expected = torch.relu(x_torch)
    print(f"Match: {torch.allclose(y_torch, y_torch_expected)}")
    # --- end of the guide's code ------------------------------------------------------

    hg.executor_cleanup(exec_handle)  # the guide leaks the executor; we do not
    ok = bool(torch.equal(y_torch, y_torch_expected))  # ReLU is exact: demand equality
    print(f"pattern 1 (torch): {'OK' if ok else 'FAIL'}")
    return ok


def pattern1_numpy() -> bool:
    """Pattern 1 with NumPy standing in for torch: the same hologram calls."""
    x_np = np.random.default_rng(0).standard_normal(1000).astype(np.float32)

    exec_handle = hg.new_executor()
    x_handle = hg.executor_allocate_buffer(exec_handle, len(x_np))
    hg.buffer_copy_from_slice(exec_handle, x_handle, json.dumps(x_np.tolist()))

    y_handle = hg.executor_allocate_buffer(exec_handle, len(x_np))
    hg.vector_relu_f32(exec_handle, x_handle, y_handle, len(x_np))

    result_json = hg.buffer_to_vec(exec_handle, y_handle)
    y_np = np.array(json.loads(result_json), dtype=np.float32)

    y_np_expected = np.maximum(x_np, 0)
    print(f"Match: {np.allclose(y_np, y_np_expected)}")

    hg.executor_cleanup(exec_handle)
    ok = bool(np.array_equal(y_np, y_np_expected))
    print(f"pattern 1 (numpy): {'OK' if ok else 'FAIL'}")
    return ok


def main() -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        pattern1 = pattern1_numpy
    else:
        pattern1 = pattern1_torch
    results = [vector_addition_example(), pattern1()]  # run both, even if one fails
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
