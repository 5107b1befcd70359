"""cuDNN's TF32 convolution error, the bound of the TF32 tests (twice it).

For data uniform in [-1, 1), prints the relative L2 error of cuDNN's TF32 forward pass,
input gradient and weight gradient against float64, in NCHW and channels_last, on the
test's shapes and the headline's.
"""
import torch
import torch.nn.functional as F

# (x NCHW, w, padding): the shapes of `tf32_passes_are_close_and_deterministic`, and
# the headline.
SHAPES = [
    ((2, 64, 17, 19), (96, 64, 3, 3), 1),
    ((3, 5, 33, 31), (40, 5, 1, 1), 0),
    ((8, 64, 512, 1024), (128, 64, 3, 3), 1),
]


def relative_error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def passes(x, w, dy, padding):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = F.conv2d(x, w, padding=padding)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    return y, dx, dw


def main():
    torch.backends.cudnn.allow_tf32 = True
    generator = torch.Generator(device="cuda").manual_seed(7)
    uniform = lambda *shape: (torch.rand(shape, generator=generator, device="cuda", dtype=torch.float64) * 2 - 1).float()
    for x_shape, w_shape, padding in SHAPES:
        x, w = uniform(*x_shape), uniform(*w_shape)
        y_shape = F.conv2d(x[:1], w, padding=padding).shape[1:]
        dy = uniform(x_shape[0], *y_shape)
        wants = passes(x.double(), w.double(), dy.double(), padding)
        for layout, memory_format in (("NCHW", torch.contiguous_format), ("NHWC", torch.channels_last)):
            as_layout = lambda t: t.contiguous(memory_format=memory_format)
            gots = passes(as_layout(x), as_layout(w), as_layout(dy), padding)
            errors = [relative_error(got, want) for got, want in zip(gots, wants)]
            print(
                f"cuDNN TF32 {layout} x {list(x_shape)} w {list(w_shape)}: forward {errors[0]:.3e}, "
                f"input gradient {errors[1]:.3e}, weight gradient {errors[2]:.3e}"
            )


if __name__ == "__main__":
    main()
