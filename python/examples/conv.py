"""The conv workload's model (a trained 2-D convolution) on gpu_kernels."""

import torch.nn as nn

import gpu_kernels


class ModelNew(nn.Module):
    """Conv2d: the same parameters (an nn.Conv2d holds and initializes them) and
    output, forward and backward on the library's kernels, in the arithmetic PyTorch's
    own convolution would use (TF32 unless torch.backends.cudnn.allow_tf32 is off)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=False):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, (kernel_size, kernel_size),
                                stride=stride, padding=padding, dilation=dilation,
                                groups=groups, bias=bias)

    def forward(self, x):
        c = self.conv2d
        return gpu_kernels.conv2d(x, c.weight, c.bias, c.stride, c.padding, c.dilation, c.groups)
