"""The single-device reference: the whole batch through the unsplit model, then one optimizer step,
and the measure a parallel run is held to against it (`max_errors`).

All m microbatches of b rows are concatenated into one (m b, s) batch. Since every microbatch has
the same number of tokens, the mean token loss of the whole batch equals the mean over
microbatches of their mean losses, which is what a pipeline with 1/m loss scaling optimizes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from clustersim.sim.numerics.optim import make_optimizer
from clustersim.sim.numerics.routing import Routing
from clustersim.sim.numerics.transformer import ShadowConfig, model_backward, model_forward, moe_routings


class ReferenceResult(NamedTuple):
    params: dict[str, np.ndarray]  # after the optimizer step
    grads: dict[str, np.ndarray]  # dloss/dparam at the initial parameters
    loss: float  # mean token loss at the initial parameters
    routings: list[Routing]  # every MoE layer's routing groups, layer by layer


def reference_step(
    cfg: ShadowConfig, params: dict[str, np.ndarray], tokens: np.ndarray, targets: np.ndarray, optimizer: str, lr: float
) -> ReferenceResult:
    """Forward + backward of tokens (B, s) against targets (B, s), then one step of `optimizer`.
    `params` is not modified; the result holds updated copies."""
    loss, tape = model_forward(params, cfg, tokens, range(cfg.layers), embed=True, targets=targets)
    _, grads = model_backward(1.0, tape)
    updated = {name: value.copy() for name, value in params.items()}
    make_optimizer(optimizer, lr).step(updated, grads)
    return ReferenceResult(updated, grads, loss, moe_routings(tape))


def max_errors(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> tuple[float, float]:
    """(max_abs_err, max_rel_err) over the names in `got`:

        max_abs_err = max_name max_i |a_i - b_i|
        max_rel_err = max_name max_i |a_i - b_i| / max(max_i |b_i|, tiny)

    with a = got[name], b = want[name] and tiny the dtype's smallest normal number, i.e. each
    tensor's worst error relative to that tensor's largest reference entry."""
    abs_err = rel_err = 0.0
    for name, a in got.items():
        b = want[name]
        err = float(np.max(np.abs(a - b))) if np.isfinite(a).all() else np.inf
        abs_err = max(abs_err, err)
        rel_err = max(rel_err, err / max(float(np.max(np.abs(b))), float(np.finfo(b.dtype).tiny)))
    return abs_err, rel_err
