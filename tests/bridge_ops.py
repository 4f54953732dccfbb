"""te_grad ops used by the PyTorch and JAX bridge tests: one custom op not in te_grad.nn, one
with a reduction, one with an integer index input."""
import te_grad as tg


def causal_conv1d(x, w, dilation=2):
    """A causal dilated 1-D convolution: y[b, f, s] = sum over c, k of x[b, c, s - (K-1-k) d] w[f, c, k]."""
    n, c, t = x.shape
    o, _, k = w.shape
    rc, rk = tg.reduce_axis(c, "rc"), tg.reduce_axis(k, "rk")

    def body(b, f, s):
        at = s - (k - 1 - rk) * dilation
        return tg.sum(tg.if_then_else(at >= 0, x[b, rc, at], 0.0) * w[f, rc, rk], axis=[rc, rk])
    return tg.compute((n, o, t), body, name="causal_conv1d")


def layer_norm(x, gamma, beta):
    return tg.nn.layer_norm(x, gamma, beta)


def embedding(table, ids):
    return tg.nn.embedding(table, ids)


def two_outputs(x):
    k = tg.reduce_axis(x.shape[1], "k")
    s = tg.compute((x.shape[0],), lambda i: tg.sum(x[i, k] * x[i, k], axis=k), name="sumsq")
    return s, tg.nn.tanh(x)
