"""The shadow model cut into pipeline stages, each holding and training its own parameters.

With p stages and L layers, stage s owns layers [s L/p, (s+1) L/p) (or the scenario's uneven split,
ShadowConfig.stage_layers); stage 0 also owns the embedding
and stage p-1 the final layernorm, head and loss. Stage s of microbatch j computes
y_{j,s} = f_s(y_{j,s-1}). For the mean loss over m equal microbatches, L = (1/m) sum_j loss_j, so
the last stage seeds backward with dL/dloss_j = 1/m and each stage accumulates
dL/dW_s = sum_j (dy_{j,s}/dW_s)^T dL/dy_{j,s}.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clustersim.sim.numerics.transformer import ShadowConfig, layer_param_shapes, model_backward, model_forward

EMBED_PARAMS = ("embed.tok", "embed.pos")
HEAD_PARAMS = ("final_ln.g", "final_ln.b", "head.w")


def stage_layers(cfg: ShadowConfig, stage: int, num_stages: int) -> range:
    """The transformer blocks stage `stage` runs, in order (cfg.stage_layers' split, or an even one)."""
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage} is outside 0..{num_stages - 1}")
    if cfg.stage_layers is not None:
        if len(cfg.stage_layers) != num_stages or sum(cfg.stage_layers) != cfg.layers:
            raise ValueError(
                f"stage_layers {cfg.stage_layers}: one count per stage ({num_stages}), {cfg.layers} in all"
            )
        start = sum(cfg.stage_layers[:stage])
        return range(start, start + cfg.stage_layers[stage])
    if cfg.layers % num_stages:
        raise ValueError(f"pipeline stages ({num_stages}) must divide the shadow model's layers ({cfg.layers})")
    per_stage = cfg.layers // num_stages
    return range(stage * per_stage, (stage + 1) * per_stage)


def stage_param_names(cfg: ShadowConfig, stage: int, num_stages: int) -> list[str]:
    """Names of the parameters stage `stage` owns; over all stages they partition the model's."""
    names = list(EMBED_PARAMS) if stage == 0 else []
    for i in stage_layers(cfg, stage, num_stages):
        names.extend(layer_param_shapes(cfg, i))
    if stage == num_stages - 1:
        names.extend(HEAD_PARAMS)
    return names


class StageChecks:
    """The order rules every stage keeps, whole or tensor-parallel: a microbatch's forward once,
    before its backward, within 0..m-1; the last stage's backward seeded by the loss. Subclasses
    set stage, num_microbatches, is_last, _tapes (mb -> what the backward needs) and backward_done."""

    stage: int
    num_microbatches: int
    is_last: bool
    _tapes: dict[int, Any]
    backward_done: set[int]
    grads: dict[str, np.ndarray]
    _weight_grads: dict[int, dict[str, np.ndarray]]  # mb -> gradients its W will add

    def _where(self, mb: int) -> str:
        return f"stage {self.stage}, microbatch {mb}"

    def _check_forward(self, mb: int, targets) -> None:
        if not 0 <= mb < self.num_microbatches:
            raise RuntimeError(f"{self._where(mb)}: microbatch outside 0..{self.num_microbatches - 1}")
        if mb in self._tapes:
            raise RuntimeError(f"{self._where(mb)}: forward run twice (its backward has not run yet)")
        if mb in self.backward_done:
            raise RuntimeError(f"{self._where(mb)}: forward run again after its backward")
        if self.is_last and targets is None:
            raise ValueError(f"{self._where(mb)}: the last stage needs the targets to compute the loss")

    def _check_backward(self, mb: int, dout) -> float | np.ndarray:
        """The backward's seed: 1/m on the last stage (dL/dloss_mb), else `dout`."""
        if mb not in self._tapes:
            raise RuntimeError(f"{self._where(mb)}: backward before its forward")
        if self.is_last != (dout is None):
            expected = "None (the loss seeds it)" if self.is_last else "the gradient from the next stage"
            raise ValueError(f"{self._where(mb)}: backward dout must be {expected}")
        return 1.0 / self.num_microbatches if self.is_last else dout

    def pending_microbatches(self) -> list[int]:
        """Microbatches whose forward cache is still held (forward ran, backward did not)."""
        return sorted(self._tapes)

    def missing_backward(self) -> list[int]:
        """Microbatches whose gradient has not been accumulated yet."""
        return sorted(set(range(self.num_microbatches)) - self.backward_done)

    def _backward_done(self, mb: int, grads: dict[str, np.ndarray], split: bool) -> None:
        """A backward's parameter gradients: accumulated now, or (`split`: a zero-bubble B) kept
        for `weight_gradient(mb)`. The layers' backward functions give both gradients at once;
        the simulator times B and W apart, and the gradients count only once W has run."""
        self.backward_done.add(mb)
        if split:
            self._weight_grads[mb] = grads
        else:
            self._accumulate(grads)

    def weight_gradient(self, mb: int) -> None:
        """W: add the parameter gradients microbatch `mb`'s split backward left."""
        if mb not in self._weight_grads:
            raise RuntimeError(f"{self._where(mb)}: W without a split backward before it")
        self._accumulate(self._weight_grads.pop(mb))

    def missing_weight_gradients(self) -> list[int]:
        """Microbatches whose split backward ran but whose W has not."""
        return sorted(self._weight_grads)

    def _accumulate(self, grads: dict[str, np.ndarray]) -> None:
        for name, g in grads.items():
            self.grads[name] += g


class StageModel(StageChecks):
    """One pipeline stage: its parameters, accumulated gradients and per-microbatch caches.

    `params` may be the full parameter dict; the stage keeps (copies of) only the ones it owns.
    """

    def __init__(
        self,
        cfg: ShadowConfig,
        stage: int,
        num_stages: int,
        params: dict[str, np.ndarray],
        num_microbatches: int,
        recompute_full: bool = False,
    ):
        """`recompute_full`: keep only each microbatch's input and run the forward again in the
        backward (full activation recomputation), with the weights present at backward time."""
        self.cfg = cfg
        self.stage = stage
        self.num_stages = num_stages
        self.num_microbatches = num_microbatches
        self.layers = stage_layers(cfg, stage, num_stages)
        self.is_first = stage == 0
        self.is_last = stage == num_stages - 1
        self.params = {name: params[name].copy() for name in stage_param_names(cfg, stage, num_stages)}
        self.grads = {name: np.zeros_like(value) for name, value in self.params.items()}
        self.losses: dict[int, float] = {}
        self.backward_done: set[int] = set()
        self._tapes: dict[int, Any] = {}  # mb -> the forward's tape, or (input, targets) to recompute it
        self.recompute_full = recompute_full
        self._weight_grads = {}

    def forward(self, mb: int, inp: np.ndarray, targets: np.ndarray | None = None):
        """Stage 0 takes tokens (b, s), others activations (b, s, h). Returns activations (b, s, h),
        or on the last stage (which needs `targets` (b, s)) the microbatch's mean token loss."""
        self._check_forward(mb, targets)
        out, tape = model_forward(
            self.params, self.cfg, inp, self.layers, embed=self.is_first, targets=targets if self.is_last else None
        )
        self._tapes[mb] = (inp, targets if self.is_last else None) if self.recompute_full else tape
        if self.is_last:
            self.losses[mb] = out
        return out

    def backward(self, mb: int, dout: np.ndarray | None, split: bool = False):
        """Accumulate this microbatch's parameter gradients and free its cache. `dout` is
        dL/d(output) (b, s, h), or None on the last stage, which seeds dL/dloss_mb = 1/m.
        Returns dL/d(input) (b, s, h), or None on stage 0 (tokens have no gradient). `split`: this
        is a zero-bubble B, its parameter gradients wait for `weight_gradient(mb)`."""
        seed = self._check_backward(mb, dout)
        tape = self._tapes.pop(mb)
        if self.recompute_full:  # run the forward again from the kept input
            inp, targets = tape
            _, tape = model_forward(self.params, self.cfg, inp, self.layers, embed=self.is_first, targets=targets)
        dinp, grads = model_backward(seed, tape)
        self._backward_done(mb, grads, split)
        return dinp
