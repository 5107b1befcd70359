"""GPU kernels written in Rust, as PyTorch operators.

The kernels (scan, min, matrix-vector product, 2-D convolution) are compiled ahead of
time and shipped in the package: no compiler runs on import. They take and return
CUDA tensors without copies, run on PyTorch's current stream, and are registered with
``torch.library`` (``torch.ops.gpu_kernels.*``), so ``torch.compile`` traces them and
autograd differentiates them.

>>> import torch, gpu_kernels
>>> x = torch.rand(4096, 4096, device="cuda")
>>> y = gpu_kernels.cumsum(x, 1, exclusive=True)
"""

import torch  # noqa: F401  (the operators register with torch.library)

try:
    from . import _gpu_kernels
except ImportError as error:  # the extension needs the NVIDIA driver's libcuda.so.1
    raise ImportError(
        f"gpu_kernels could not load its extension ({error}); it needs the NVIDIA driver "
        "(libcuda.so.1) on the library path"
    ) from error

from .ops import amin, conv2d, conv2d_backward, cumsum, matvec, min

__all__ = ["amin", "conv2d", "conv2d_backward", "cumsum", "device_info", "matvec", "min"]


def device_info(device: int = 0) -> str:
    """What the library knows of a CUDA device (it loads its kernels on first use)."""
    return _gpu_kernels.device_info(device)
