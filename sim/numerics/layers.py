"""The shadow model's dense building blocks, shared by the transformer and the MoE experts: linear
layers and the GeLU MLP, each a pair `*_forward(p, name, x) -> (out, cache)` and
`*_backward(dout, cache) -> (dx, grads)` over a flat parameter dict with dotted names."""

from __future__ import annotations

import math

import numpy as np

INIT_STD = 0.02  # GPT-2 init: weights ~ N(0, 0.02^2); biases 0; layernorm gain 1, bias 0
GELU_C = math.sqrt(2.0 / math.pi)


def linear_forward(p, name, x):
    """y = x W + b; x (..., i), W (i, o) -> y (..., o)."""
    return x @ p[f"{name}.w"] + p[f"{name}.b"], (name, x, p[f"{name}.w"])


def linear_backward(dout, cache):
    """dx = dy W^T, dW = x^T dy (summed over all leading dims), db = sum dy."""
    name, x, w = cache
    x2 = x.reshape(-1, x.shape[-1])  # (b*s, i)
    dy2 = dout.reshape(-1, dout.shape[-1])  # (b*s, o)
    return dout @ w.T, {f"{name}.w": x2.T @ dy2, f"{name}.b": dy2.sum(axis=0)}


def gelu(x):
    """GeLU, tanh approximation: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi)."""
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x**3)))


def gelu_grad(x):
    """d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2), t = tanh(c (x + 0.044715 x^3))."""
    t = np.tanh(GELU_C * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * x * x)


def mlp_forward(p, name, x):
    """y = gelu(x W_fc + b_fc) W_proj + b_proj."""
    u, c_fc = linear_forward(p, f"{name}.fc", x)  # (b, s, ffn)
    out, c_proj = linear_forward(p, f"{name}.proj", gelu(u))  # (b, s, h)
    return out, (c_fc, u, c_proj)


def mlp_backward(dout, cache):
    c_fc, u, c_proj = cache
    da, grads = linear_backward(dout, c_proj)  # (b, s, ffn)
    dx, g_fc = linear_backward(da * gelu_grad(u), c_fc)  # (b, s, h)
    return dx, grads | g_fc
