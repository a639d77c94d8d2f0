"""Optimizers over a dict of named numpy parameters; state is kept per parameter name.

`step(params, grads)` updates `params[name]` in place for every name in `grads`.
"""

from __future__ import annotations

import numpy as np


class SGD:
    """Plain gradient descent: w <- w - lr g."""

    def __init__(self, lr: float):
        self.lr = lr

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        for name, g in grads.items():
            params[name] -= self.lr * g


class Adam:
    """Adam (Kingma & Ba) with bias correction, per parameter name, t = that name's step count:

    m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
    w <- w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    """

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.lr = lr
        self.b1, self.b2 = betas
        self.eps = eps
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}
        self.t: dict[str, int] = {}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        for name, g in grads.items():
            t = self.t[name] = self.t.get(name, 0) + 1
            m = self.m[name] = self.b1 * self.m.get(name, np.zeros_like(g)) + (1 - self.b1) * g
            v = self.v[name] = self.b2 * self.v.get(name, np.zeros_like(g)) + (1 - self.b2) * g * g
            m_hat = m / (1 - self.b1**t)
            v_hat = v / (1 - self.b2**t)
            params[name] -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


OPTIMIZERS = {"adam": Adam, "sgd": SGD}


def make_optimizer(name: str, lr: float) -> Adam | SGD:
    """Build the optimizer registered under `name`; a miss lists the valid names."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(sorted(OPTIMIZERS))}")
    return OPTIMIZERS[name](lr)
