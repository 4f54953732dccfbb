"""te_grad.nn: common operators written purely in the te_grad DSL.

Every operator here is a handful of ``tg.compute`` tensors; none has a
hand-written gradient. Layouts follow PyTorch and TVM: activations NCHW,
convolution weights OIHW. Invalid shapes or parameters raise
:class:`te_grad.UserError` naming the operator and the bad value.

Shapes may hold size expressions (``tg.var``): every operator takes a symbolic batch, and
shapes are compared and multiplied structurally (``te_grad.sizes.same_shape``). Other
symbolic dimensions work where the index formulas stay affine in the sizes: reductions,
normalizations, softmax, pad and concat along them; convolutions and pools on symbolic
spatial sizes (output extents checked at the variables' ``min``); ``reshape`` when every
run-time extent maps one to one or is outermost in its group. Operators that need an int
there say so: ``strided_slice`` (other than the whole axis), ``split`` at positions beyond
the variable's ``min`` or by ``sizes``, ``chunk`` other than into a structural divisor,
``one_hot``'s depth, ``scaled_dot_product_attention``'s default scale (an int feature size).
"""
from .activation import gelu, leaky_relu, log_softmax, relu, sigmoid, silu, softmax, swiglu, tanh
from .attention import scaled_dot_product_attention
from .conv import conv1d, conv2d, conv2d_output_shape, conv2d_transpose
from .elementwise import (add, bias_add, broadcast_shape, divide, maximum, minimum, multiply,
                          power, subtract)
from .embedding import embedding, take
from .linear import batch_matmul, dense, matmul
from .array import arange, clip, cumsum, expand_dims, gather_nd, one_hot, squeeze, stack, where
from .loss import binary_cross_entropy, cross_entropy, mse_loss, softmax_cross_entropy
from .reduce import argmax, argmin, max, mean, min, sum, variance
from .segment import segment_max, segment_softmax, segment_sum
from .normalization import batch_norm, layer_norm, rms_norm
from .pool import avg_pool2d, global_avg_pool2d, global_max_pool2d, max_pool2d
from .shape import chunk, concat, flatten, pad, reshape, split, strided_slice, transpose

__all__ = [
    # linear algebra
    "dense", "matmul", "batch_matmul",
    # convolution and pooling
    "conv1d", "conv2d", "conv2d_transpose", "conv2d_output_shape",
    "max_pool2d", "avg_pool2d", "global_avg_pool2d", "global_max_pool2d",
    # activations
    "relu", "leaky_relu", "sigmoid", "tanh", "gelu", "silu", "swiglu", "softmax", "log_softmax",
    # attention
    "scaled_dot_product_attention",
    # normalization
    "layer_norm", "rms_norm", "batch_norm",
    # layout
    "reshape", "flatten", "transpose", "concat", "split", "chunk", "pad", "strided_slice",
    # broadcast arithmetic
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "bias_add",
    "broadcast_shape",
    # gathers and losses
    "embedding", "take", "mse_loss", "binary_cross_entropy", "softmax_cross_entropy", "cross_entropy",
    # reductions over axes
    "sum", "mean", "variance", "max", "min", "argmax", "argmin",
    # segment reductions over CSR row pointers (ragged loops)
    "segment_sum", "segment_max", "segment_softmax",
    # array operations
    "clip", "stack", "expand_dims", "squeeze", "where", "one_hot", "gather_nd", "cumsum", "arange",
]
