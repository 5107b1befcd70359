"""The min workload's model (the values of torch.min over one dim) on gpu_kernels."""

import torch.nn as nn

import gpu_kernels


class ModelNew(nn.Module):
    """MinOverDim: the same values (the least, NaN first), without the indices."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return gpu_kernels.amin(x, self.dim)
