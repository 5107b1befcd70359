"""The scan workload's model (an exclusive cumulative sum) on gpu_kernels."""

import torch.nn as nn

import gpu_kernels


class ModelNew(nn.Module):
    """ExclusiveCumsum: the same output, in one pass of the library's scan."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return gpu_kernels.cumsum(x, self.dim, exclusive=True)
