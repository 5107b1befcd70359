"""The library's operations as PyTorch operators (``torch.ops.gpu_kernels.*``).

Each operator takes and returns CUDA tensors, runs on PyTorch's current stream of the
tensors' device, and has a fake implementation (for ``torch.compile``) and an autograd
formula. Shapes are validated by the Rust library, so the messages are its own.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from . import _gpu_kernels as _rust

_NAMESPACE = "gpu_kernels"

# dtype -> the name the Rust side dispatches on.
_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}

_CUMSUM_DTYPES = frozenset(_DTYPE_NAMES)
_MIN_DTYPES = frozenset({torch.float32, torch.float64, torch.int32, torch.bfloat16, torch.float16})
_GEMV_DTYPES = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16})
_CONV_DTYPES = frozenset({torch.float32})
_ALIGNMENT = _rust.ARRAY_ALIGNMENT

try:
    _current_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # an older PyTorch: the public (slower) path

    def _current_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream


def _check(op: str, name: str, tensor: torch.Tensor, dtypes: frozenset) -> None:
    """Raises a clear error unless `tensor` is a CUDA tensor of one of `dtypes`."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cuda:
        raise ValueError(f"{op}: {name} must be a CUDA tensor, got a tensor on {tensor.device}")
    if tensor.dtype not in dtypes:
        names = ", ".join(sorted(str(d).replace("torch.", "") for d in dtypes))
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; {op} takes {names}")


def _same_device(op: str, first: torch.Tensor, **others: Optional[torch.Tensor]) -> None:
    for name, tensor in others.items():
        if tensor is not None and tensor.device != first.device:
            raise ValueError(f"{op}: {name} is on {tensor.device}, the other arguments on {first.device}")


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when the kernels can read it in place (row-major, aligned);
    else a row-major copy."""
    if not tensor.is_contiguous():
        return tensor.contiguous()
    if tensor.data_ptr() % _ALIGNMENT:
        return tensor.clone()
    return tensor


def _dense_at(tensor: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """`_dense(tensor)` and its address, with one `data_ptr` call where no copy is made."""
    address = tensor.data_ptr()
    if address % _ALIGNMENT or not tensor.is_contiguous():
        tensor = _dense(tensor)
        address = tensor.data_ptr()
    return tensor, address


def _dim(op: str, dim: int, rank: int) -> int:
    """A dimension in PyTorch's convention (negative from the end) as an axis."""
    if rank == 0:
        raise ValueError(f"{op}: needs a tensor of rank 1 or more; got a 0-dimensional tensor")
    if not -rank <= dim < rank:
        raise IndexError(f"{op}: dim {dim} is out of range for a tensor of rank {rank}")
    return dim % rank


def _at(tensor: torch.Tensor) -> Tuple[int, torch.Size]:
    """A dense tensor as the Rust side takes it: its address and shape."""
    return tensor.data_ptr(), tensor.shape


def _launch_args(tensor: torch.Tensor) -> Tuple[int, int]:
    device = tensor.get_device()
    return device, _current_stream(device)


def _check_out(op: str, name: str, out, device: int, shape, dtype: torch.dtype) -> None:
    """Raises a clear error unless `out` can take a result of `shape` and `dtype` on
    CUDA device `device`."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(out).__name__}")
    if out.get_device() != device:
        raise ValueError(f"{op}: {name} is on {out.device}; the result is on cuda:{device}")
    if out.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {out.dtype}; the result has {dtype}")
    if list(out.shape) != list(shape):
        raise ValueError(f"{op}: {name} has shape {list(out.shape)}; the result has {list(shape)}")


def _span(tensor: torch.Tensor) -> Tuple[int, int]:
    """The bytes a dense tensor's elements take."""
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


def _writable(out: torch.Tensor, inputs, same_as_first: bool = False) -> torch.Tensor:
    """`out` itself where the kernels can write the result straight into it (dense,
    aligned, its memory apart from the dense `inputs`', or with `same_as_first` the
    first input's exactly: an in-place scan); else a dense tensor for `_delivered`."""
    if out.is_contiguous() and out.data_ptr() % _ALIGNMENT == 0:
        start, end = _span(out)
        for index, tensor in enumerate(inputs):
            other = _span(tensor)
            in_place = same_as_first and index == 0 and other == (start, end)
            if start < other[1] and other[0] < end and not in_place:
                break
        else:
            return out
    return torch.empty_like(out, memory_format=torch.contiguous_format)


def _delivered(out: torch.Tensor, written: torch.Tensor) -> torch.Tensor:
    """`out`, holding the result written into `written` (itself, or a stand-in)."""
    if written is not out:
        out.copy_(written)
    return out


def _copied_out(op: str, name: str, out, result: torch.Tensor) -> torch.Tensor:
    """`out` holding `result`, on the dispatcher's path, once checked as `_check_out`
    does, and refused where autograd would record: torch's out= functions do not take
    part in autograd either."""
    _check_out(op, name, out, result.get_device(), result.shape, result.dtype)
    if torch.is_grad_enabled() and result.requires_grad:
        raise RuntimeError(
            f"{op}: out= does not take part in autograd, and an input requires grad; "
            "call it without out= or under torch.no_grad()"
        )
    return out.copy_(result)


# Tensors that PyTorch's dispatcher treats as plain ones (a Parameter is one).
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_is_compiling = torch.compiler.is_compiling
_function_mode = torch._C._is_torch_function_mode_enabled
try:  # user modes and the infrastructure's (fake tensors, tracing) alike
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode as _dispatch_mode
except ImportError:  # an older PyTorch: the user modes' stack

    def _dispatch_mode() -> bool:
        return torch._C._len_torch_dispatch_stack() > 0


def _plain(*args) -> bool:
    """Whether a call can skip PyTorch's dispatcher (tens of microseconds): eager, on
    plain CUDA tensors, with no gradient to record and no mode or tracer watching.
    Otherwise the call goes through the registered operator."""
    if _is_compiling() or _dispatch_mode() or _function_mode():
        return False
    for arg in args:
        if arg.__class__ in _PLAIN_TYPES:
            if not arg.is_cuda or (arg.requires_grad and torch.is_grad_enabled()):
                return False
        elif isinstance(arg, torch.Tensor):  # a subclass: fake, functional, ...
            return False
    return True


# ---- cumsum ----------------------------------------------------------------------


def cumsum(
    x: torch.Tensor,
    dim: int,
    exclusive: bool = False,
    reverse: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The cumulative sum of x along dim: inclusive (``torch.cumsum``) or exclusive
    (``y[0] = 0``), optionally from the end. Floats sum in at least float32 and round
    once; integers wrap. Deterministic. With ``out`` (x's shape, dtype and device; x
    itself too), the sums are written there and it is returned, as torch's ``out=``."""
    if out is None:
        if _plain(x):
            return _cumsum_into(x, dim, exclusive, reverse, None)
        return _cumsum_op(x, dim, exclusive, reverse)
    if _plain(x, out):
        return _cumsum_into(x, dim, exclusive, reverse, out)
    return _copied_out("cumsum", "out", out, _cumsum_op(x, dim, exclusive, reverse))


def _along_axis(op: str, x: torch.Tensor, dim: int, dtypes: frozenset):
    """x checked and made dense, with its address; dim as an axis; the device and
    stream to run on. (The eager path of the smallest calls: each step here is a
    measurable part of it.)"""
    _check(op, "x", x, dtypes)
    axis = _dim(op, dim, x.dim())
    x, address = _dense_at(x)
    device = x.get_device()
    return x, address, axis, device, _current_stream(device)


def _cumsum(x: torch.Tensor, dim: int, exclusive: bool, reverse: bool) -> torch.Tensor:
    return _cumsum_into(x, dim, exclusive, reverse, None)


def _cumsum_into(x, dim, exclusive, reverse, out):
    x, address, axis, device, stream = _along_axis("cumsum", x, dim, _CUMSUM_DTYPES)
    if out is None:
        y = torch.empty_like(x)
    else:
        _check_out("cumsum", "out", out, device, x.shape, x.dtype)
        y = _writable(out, (x,), same_as_first=True)
    dtype = _DTYPE_NAMES[x.dtype]
    _rust.cumsum(device, stream, dtype, (address, x.shape), y.data_ptr(), axis, exclusive, reverse)
    return y if out is None else _delivered(out, y)


_cumsum_op = torch.library.custom_op(f"{_NAMESPACE}::cumsum", _cumsum, mutates_args=())


@_cumsum_op.register_fake
def _(x, dim, exclusive, reverse):
    _rust.check_cumsum(list(x.shape), _dim("cumsum", dim, x.dim()))
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _cumsum_setup(ctx, inputs, output):
    _, ctx.dim, ctx.exclusive, ctx.reverse = inputs


def _cumsum_backward(ctx, grad):
    # Each x[j] counts in the sums of the elements after it (before it, reversed).
    return cumsum(grad, ctx.dim, ctx.exclusive, not ctx.reverse), None, None, None


_cumsum_op.register_autograd(_cumsum_backward, setup_context=_cumsum_setup)


# ---- min and amin ------------------------------------------------------------------


def min(
    x: torch.Tensor, dim: int, keepdim: bool = False, *, out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``torch.min(x, dim, keepdim)``: the least values along dim and the index of the
    first of each (NaN is the least). With ``out``, a pair (values, int64 indices) of
    the result's shape, written and returned."""
    if out is None:
        return (_min if _plain(x) else _min_op)(x, dim, keepdim)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"min: out must be a pair (values, indices), got {type(out).__name__}")
    if _plain(x, *out):
        return _reduce_min("min", x, dim, keepdim, True, out)
    values, indices = _min_op(x, dim, keepdim)
    return _copied_out("min", "out[0]", out[0], values), _copied_out("min", "out[1]", out[1], indices)


def amin(x: torch.Tensor, dim: int, keepdim: bool = False, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``torch.amin(x, dim, keepdim)``: the least values along dim (NaN is the least).
    With ``out`` (the result's shape, x's dtype), written and returned."""
    if out is None:
        return (_amin if _plain(x) else _amin_op)(x, dim, keepdim)
    if _plain(x, out):
        return _reduce_min("amin", x, dim, keepdim, False, (out, None))[0]
    return _copied_out("amin", "out", out, _amin_op(x, dim, keepdim))


def _min(x: torch.Tensor, dim: int, keepdim: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    return _reduce_min("min", x, dim, keepdim, with_indices=True)


def _amin(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    return _reduce_min("amin", x, dim, keepdim, with_indices=False)[0]


_min_op = torch.library.custom_op(f"{_NAMESPACE}::min", _min, mutates_args=())
_amin_op = torch.library.custom_op(f"{_NAMESPACE}::amin", _amin, mutates_args=())


def _reduce_min(op, x, dim, keepdim, with_indices, out=None):
    x, address, axis, device, stream = _along_axis(op, x, dim, _MIN_DTYPES)
    shape = _rust.min_output_shape(list(x.shape), axis, keepdim)
    if out is None:
        values = x.new_empty(shape)
        indices = x.new_empty(shape, dtype=torch.int64) if with_indices else None
    else:
        names = ("out[0]", "out[1]") if with_indices else ("out", None)
        _check_out(op, names[0], out[0], device, shape, x.dtype)
        values = _writable(out[0], (x,))
        indices = None
        if with_indices:
            _check_out(op, names[1], out[1], device, shape, torch.int64)
            indices = _writable(out[1], (x, values))
    _rust.min(
        device,
        stream,
        _DTYPE_NAMES[x.dtype],
        (address, x.shape),
        axis,
        (values.data_ptr(), shape),
        None if indices is None else indices.data_ptr(),
    )
    if out is None:
        return values, indices
    return _delivered(out[0], values), indices if indices is None else _delivered(out[1], indices)


def _min_shape(x, dim, keepdim):
    return _rust.min_output_shape([int(s) for s in x.shape], _dim("min", dim, x.dim()), keepdim)


@_min_op.register_fake
def _(x, dim, keepdim):
    shape = _min_shape(x, dim, keepdim)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


@_amin_op.register_fake
def _(x, dim, keepdim):
    return x.new_empty(_min_shape(x, dim, keepdim))


def _min_setup(ctx, inputs, output):
    x, ctx.dim, ctx.keepdim = inputs
    ctx.shape = x.shape
    ctx.save_for_backward(output[1])


def _min_backward(ctx, grad_values, _grad_indices):
    # The gradient goes to the element each minimum was taken from.
    (indices,) = ctx.saved_tensors
    if not ctx.keepdim:
        grad_values, indices = grad_values.unsqueeze(ctx.dim), indices.unsqueeze(ctx.dim)
    grad = grad_values.new_zeros(ctx.shape).scatter(ctx.dim, indices, grad_values)
    return grad, None, None


_min_op.register_autograd(_min_backward, setup_context=_min_setup)


def _amin_setup(ctx, inputs, output):
    x, ctx.dim, ctx.keepdim = inputs
    ctx.save_for_backward(x, output)


def _amin_backward(ctx, grad):
    # As torch.amin: the gradient is shared evenly among the elements equal to the minimum.
    x, values = ctx.saved_tensors
    if not ctx.keepdim:
        grad, values = grad.unsqueeze(ctx.dim), values.unsqueeze(ctx.dim)
    ties = x == values
    return ties * (grad / ties.sum(ctx.dim, keepdim=True)), None, None


_amin_op.register_autograd(_amin_backward, setup_context=_amin_setup)


# ---- matvec ------------------------------------------------------------------------


def matvec(
    a: torch.Tensor, x: torch.Tensor, transpose: bool = False, *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``a @ x`` for a ``[m, k]`` and x a vector ``[k]``, a column ``[k, 1]`` or up to 16
    columns ``[k, v]``, reading a once; with transpose, ``a.T @ x`` for one vector.
    Sums in float32 at least, deterministic. With ``out`` (the result's shape, a's
    dtype), written and returned."""
    if out is None:
        return (_matvec if _plain(a, x) else _matvec_op)(a, x, transpose)
    if _plain(a, x, out):
        return _matvec_into(a, x, transpose, out)
    return _copied_out("matvec", "out", out, _matvec_op(a, x, transpose))


def _matvec(a: torch.Tensor, x: torch.Tensor, transpose: bool) -> torch.Tensor:
    return _matvec_into(a, x, transpose, None)


def _matvec_into(a, x, transpose, out):
    _check("matvec", "a", a, _GEMV_DTYPES)
    _check("matvec", "x", x, _GEMV_DTYPES)
    _same_device("matvec", a, x=x)
    if x.dtype != a.dtype:
        raise TypeError(f"matvec: x has dtype {x.dtype}, a has {a.dtype}; they must match")
    (a, a_address), (x, x_address) = _dense_at(a), _dense_at(x)
    shape = _rust.gemv_output_shape(list(a.shape), list(x.shape), transpose)
    device = a.get_device()
    if out is None:
        y = a.new_empty(shape)
    else:
        _check_out("matvec", "out", out, device, shape, a.dtype)
        y = _writable(out, (a, x))
    _rust.gemv(
        device,
        _current_stream(device),
        _DTYPE_NAMES[a.dtype],
        (a_address, a.shape),
        (x_address, x.shape),
        (y.data_ptr(), shape),
        transpose,
    )
    return y if out is None else _delivered(out, y)


_matvec_op = torch.library.custom_op(f"{_NAMESPACE}::matvec", _matvec, mutates_args=())


@_matvec_op.register_fake
def _(a, x, transpose):
    return a.new_empty(_rust.gemv_output_shape([int(s) for s in a.shape], [int(s) for s in x.shape], transpose))


def _matvec_setup(ctx, inputs, output):
    a, x, ctx.transpose = inputs
    ctx.save_for_backward(a, x)


def _matvec_backward(ctx, grad):
    a, x = ctx.saved_tensors
    columns = x if x.dim() == 2 else x.unsqueeze(1)
    grad_columns = grad if grad.dim() == 2 else grad.unsqueeze(1)
    grad_a = grad_x = None
    if ctx.needs_input_grad[0]:
        grad_a = columns @ grad_columns.T if ctx.transpose else grad_columns @ columns.T
    if ctx.needs_input_grad[1]:
        if ctx.transpose or grad_columns.shape[1] == 1:
            grad_x = matvec(a, grad.reshape(grad_columns.shape), not ctx.transpose).reshape(x.shape)
        else:  # A^T G for several columns: the library's A^T takes one vector
            grad_x = a.T @ grad
    return grad_a, grad_x, None


_matvec_op.register_autograd(_matvec_backward, setup_context=_matvec_setup)


# ---- conv2d ------------------------------------------------------------------------


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    stride: Union[int, Sequence[int]] = 1,
    padding: Union[int, Sequence[int]] = 0,
    dilation: Union[int, Sequence[int]] = 1,
    groups: int = 1,
    precision: Optional[str] = None,
    activation: str = "identity",
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``activation(torch.nn.functional.conv2d(x, weight, bias, ...)) + residual`` in
    float32, in one pass that writes the output once; deterministic.

    ``precision`` is ``"fp32"`` or ``"tf32"`` (the tensor cores); by default TF32 where
    PyTorch's convolutions may use it (``torch.backends.cudnn.allow_tf32``), as
    ``torch.nn.functional.conv2d`` does. ``activation`` is ``"identity"``, ``"relu"``,
    ``"silu"`` or ``"gelu_tanh"``; ``residual`` (the output's shape) is a skip
    connection added after it. A channels_last x is computed in NHWC and gives a
    channels_last output. Autograd differentiates the identity and relu activations
    (relu without a residual)."""
    if precision is None:
        precision = "tf32" if torch.backends.cudnn.allow_tf32 else "fp32"
    stride, padding, dilation, groups = _conv_params("conv2d", stride, padding, dilation, groups)
    args = (x, weight, bias, residual, stride, padding, dilation, groups, precision, activation)
    return (_conv2d if _plain(x, weight, bias, residual) else _conv2d_op)(*args)


def _conv_params(op, stride, padding, dilation, groups):
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    return _pair(op, "stride", stride), _pair(op, "padding", padding), _pair(op, "dilation", dilation), groups


def _pair(op: str, name: str, value) -> list:
    pair = [value, value] if isinstance(value, int) else list(value)
    if len(pair) != 2 or any(not isinstance(v, int) or v < 0 for v in pair):
        raise ValueError(f"{op}: {name} must be an int or two non-negative ints, got {value!r}")
    return pair


def _channels_last(x: torch.Tensor) -> bool:
    """Whether x is stored NHWC (PyTorch's channels_last) rather than NCHW."""
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def _conv_layout(x: torch.Tensor):
    """The layout the kernels read x in, and a function giving a 4-D tensor in it as
    the row-major tensor they see."""
    if _channels_last(x):
        return "nhwc", lambda t: _dense(t.permute(0, 2, 3, 1))
    return "nchw", _dense


def _from_layout(layout: str, tensor: torch.Tensor) -> torch.Tensor:
    """A row-major 4-D tensor of the kernels as the NCHW-indexed tensor PyTorch expects."""
    return tensor.permute(0, 3, 1, 2) if layout == "nhwc" else tensor


def _conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
    precision: str,
    activation: str,
) -> torch.Tensor:
    for name, tensor in (("x", x), ("weight", weight), ("bias", bias), ("residual", residual)):
        if tensor is not None:
            _check("conv2d", name, tensor, _CONV_DTYPES)
    _same_device("conv2d", x, weight=weight, bias=bias, residual=residual)
    layout, as_layout = _conv_layout(x)
    params = _rust.ConvParams(stride, padding, dilation, groups, layout, precision, activation)
    xl, wl = as_layout(x), as_layout(weight)
    bias = None if bias is None else _dense(bias)
    residual = None if residual is None else as_layout(residual)
    shape = params.output_shape(list(xl.shape), list(wl.shape))
    y = torch.empty(shape, dtype=x.dtype, device=x.device)
    device, stream = _launch_args(x)
    _rust.conv2d(
        device,
        stream,
        _at(xl),
        _at(wl),
        None if bias is None else bias.data_ptr(),
        None if residual is None else residual.data_ptr(),
        _at(y),
        params,
    )
    return _from_layout(layout, y)


_conv2d_op = torch.library.custom_op(f"{_NAMESPACE}::conv2d", _conv2d, mutates_args=())


@_conv2d_op.register_fake
def _(x, weight, bias, residual, stride, padding, dilation, groups, precision, activation):
    params = _rust.ConvParams(stride, padding, dilation, groups, "nchw", precision, activation)
    shape = params.output_shape([int(s) for s in x.shape], [int(s) for s in weight.shape])
    memory_format = torch.channels_last if _channels_last(x) else torch.contiguous_format
    return x.new_empty(shape).contiguous(memory_format=memory_format)


def conv2d_backward(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: Union[int, Sequence[int]],
    padding: Union[int, Sequence[int]],
    dilation: Union[int, Sequence[int]],
    groups: int,
    precision: str,
    output_mask: Sequence[bool],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of ``conv2d`` with respect to x, weight and bias, each computed when
    ``output_mask`` asks for it (else an empty tensor)."""
    stride, padding, dilation, groups = _conv_params("conv2d_backward", stride, padding, dilation, groups)
    args = (grad_y, x, weight, stride, padding, dilation, groups, precision, list(output_mask))
    return (_conv2d_backward if _plain(grad_y, x, weight) else _conv2d_backward_op)(*args)


def _conv2d_backward(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
    precision: str,
    output_mask: List[bool],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    for name, tensor in (("grad_y", grad_y), ("x", x), ("weight", weight)):
        _check("conv2d_backward", name, tensor, _CONV_DTYPES)
    _same_device("conv2d_backward", x, grad_y=grad_y, weight=weight)
    layout, as_layout = _conv_layout(x)
    params = _rust.ConvParams(stride, padding, dilation, groups, layout, precision, "identity")
    xl, wl, gl = as_layout(x), as_layout(weight), as_layout(grad_y)
    grad_x = torch.empty_like(xl) if output_mask[0] else None
    grad_w = torch.empty_like(wl) if output_mask[1] else None
    grad_b = x.new_empty(weight.shape[0]) if output_mask[2] else None
    device, stream = _launch_args(x)
    _rust.conv2d_backward(
        device,
        stream,
        _at(xl),
        _at(wl),
        _at(gl),
        *(None if g is None else g.data_ptr() for g in (grad_x, grad_w, grad_b)),
        params,
    )
    empty = x.new_empty(0)
    return (
        empty if grad_x is None else _from_layout(layout, grad_x),
        empty if grad_w is None else _from_layout(layout, grad_w),
        empty if grad_b is None else grad_b,
    )


_conv2d_backward_op = torch.library.custom_op(
    f"{_NAMESPACE}::conv2d_backward", _conv2d_backward, mutates_args=()
)


@_conv2d_backward_op.register_fake
def _(grad_y, x, weight, stride, padding, dilation, groups, precision, output_mask):
    memory_format = torch.channels_last if _channels_last(x) else torch.contiguous_format
    empty = x.new_empty(0)
    return (
        torch.empty_like(x, memory_format=memory_format) if output_mask[0] else empty,
        torch.empty_like(weight, memory_format=memory_format) if output_mask[1] else empty,
        x.new_empty(weight.shape[0]) if output_mask[2] else empty,
    )


def _conv2d_setup(ctx, inputs, output):
    x, weight, bias, residual, stride, padding, dilation, groups, precision, activation = inputs
    differentiable = activation == "identity" or (activation == "relu" and residual is None)
    ctx.unsupported = None if differentiable else activation
    ctx.params = (stride, padding, dilation, groups, precision)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, output if activation == "relu" else None)


def _conv2d_gradients(ctx, grad_y):
    if ctx.unsupported is not None:
        raise NotImplementedError(
            f"conv2d: no gradient through the fused activation {ctx.unsupported!r} (relu: "
            "without a residual); apply it after an unfused conv2d to train"
        )
    x, weight, y = ctx.saved_tensors
    grad_residual = grad_y if ctx.needs_input_grad[3] else None
    if y is not None:  # relu: the gradient passes where the output is positive
        grad_y = grad_y * (y > 0)
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    grad_x, grad_w, grad_b = conv2d_backward(grad_y, x, weight, *ctx.params, mask)
    return (
        grad_x if mask[0] else None,
        grad_w if mask[1] else None,
        grad_b if mask[2] else None,
        grad_residual,
        None,
        None,
        None,
        None,
        None,
        None,
    )


_conv2d_op.register_autograd(_conv2d_gradients, setup_context=_conv2d_setup)
