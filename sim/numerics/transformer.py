"""A small decoder-only transformer in numpy with hand-written backward: the "shadow" model.

Pre-LN GPT blocks, untied LM head, mean token cross-entropy:

    x_0   = E_tok[tokens] + E_pos[:s]                          # (b, s, h)
    x'    = x + Attn(LN1(x)),  x_next = x' + MLP(LN2(x'))      # per layer
    loss  = mean_{b,s} CE(LN_f(x_L) W_head, targets)

Every piece is a pair `*_forward(p, name, ...) -> (out, cache)` and `*_backward(dout, cache) ->
(dx, grads)`, where `p` is the full parameter dict, `name` the piece's parameter prefix and `grads`
maps full parameter names to their gradients. `model_forward` records a tape of
(backward, cache) pairs, so any contiguous span of the model (a pipeline stage or the whole
thing) runs through the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from clustersim.sim.numerics.layers import INIT_STD, linear_backward, linear_forward, mlp_backward, mlp_forward
from clustersim.sim.numerics.moe import MoEConfig, moe_backward, moe_forward, moe_param_shapes

LN_EPS = 1e-5


@dataclass(frozen=True)
class ShadowConfig:
    """Sizes of the shadow model; `dtype` is "float64" or "float32". `moe_layers` are the blocks
    whose MLP is the mixture of experts `moe` (experts of width `ffn`, sim.numerics.moe)."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    seq_len: int
    vocab: int
    dtype: str = "float64"
    moe: MoEConfig | None = None
    moe_layers: tuple[int, ...] = ()
    kv_heads: int | None = None  # grouped-query attention: query heads share keys and values in groups
    stage_layers: tuple[int, ...] | None = None  # each pipeline stage's layers (None: an even split)

    @property
    def kv_hidden(self) -> int:
        """The width of the keys (and of the values)."""
        return self.hidden // self.heads * (self.kv_heads or self.heads)

    def __post_init__(self) -> None:
        for knob in ("layers", "hidden", "heads", "ffn", "seq_len", "vocab"):
            if getattr(self, knob) < 1:
                raise ValueError(f"ShadowConfig.{knob} = {getattr(self, knob)} must be >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"ShadowConfig: heads ({self.heads}) must divide hidden ({self.hidden})")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise ValueError(f"ShadowConfig: kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"ShadowConfig.dtype = {self.dtype!r}: expected 'float64' or 'float32'")
        if self.moe_layers and self.moe is None:
            raise ValueError("ShadowConfig: moe_layers given without an moe configuration")


def layer_param_shapes(cfg: ShadowConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape for transformer block `i`, in init order."""
    h, f, n = cfg.hidden, cfg.ffn, f"layer{i}"
    qkv = h + 2 * cfg.kv_hidden
    shapes: dict[str, tuple[int, ...]] = {
        f"{n}.ln1.g": (h,),
        f"{n}.ln1.b": (h,),
        f"{n}.attn.qkv.w": (h, qkv),
        f"{n}.attn.qkv.b": (qkv,),
        f"{n}.attn.proj.w": (h, h),
        f"{n}.attn.proj.b": (h,),
        f"{n}.ln2.g": (h,),
        f"{n}.ln2.b": (h,),
    }
    if i in cfg.moe_layers and cfg.moe is not None:
        return shapes | moe_param_shapes(f"{n}.moe", h, f, cfg.moe.num_experts, cfg.moe.shared)
    return shapes | {f"{n}.mlp.fc.w": (h, f), f"{n}.mlp.fc.b": (f,), f"{n}.mlp.proj.w": (f, h), f"{n}.mlp.proj.b": (h,)}


def param_shapes(cfg: ShadowConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name -> shape, in the fixed order `init_params` draws them."""
    shapes: dict[str, tuple[int, ...]] = {"embed.tok": (cfg.vocab, cfg.hidden), "embed.pos": (cfg.seq_len, cfg.hidden)}
    for i in range(cfg.layers):
        shapes.update(layer_param_shapes(cfg, i))
    shapes.update({"final_ln.g": (cfg.hidden,), "final_ln.b": (cfg.hidden,), "head.w": (cfg.hidden, cfg.vocab)})
    return shapes


def init_params(cfg: ShadowConfig, seed: int) -> dict[str, np.ndarray]:
    """Deterministic init: one `default_rng(seed)` draws every weight matrix in `param_shapes` order,
    so the same seed gives bit-identical parameters however the model is later split."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".g"):
            value = np.ones(shape)
        elif name.endswith(".b"):
            value = np.zeros(shape)
        else:
            value = rng.standard_normal(shape) * INIT_STD
        params[name] = value.astype(cfg.dtype)
    return params


# ---- pieces -------------------------------------------------------------------------------------


def embed_forward(p, tokens):
    """x = E_tok[tokens] + E_pos[:s]; tokens (b, s) int -> x (b, s, h)."""
    s = tokens.shape[1]
    x = p["embed.tok"][tokens] + p["embed.pos"][:s]  # (b, s, h)
    return x, (tokens, p["embed.tok"].shape, p["embed.pos"].shape)


def embed_backward(dout, cache):
    """dE_tok[v] = sum of dout over positions holding token v; dE_pos[:s] = sum_b dout; no dx."""
    tokens, tok_shape, pos_shape = cache
    dtok = np.zeros(tok_shape, dtype=dout.dtype)  # (V, h)
    np.add.at(dtok, tokens, dout)
    dpos = np.zeros(pos_shape, dtype=dout.dtype)  # (seq_len, h)
    dpos[: tokens.shape[1]] = dout.sum(axis=0)
    return None, {"embed.tok": dtok, "embed.pos": dpos}


def layernorm_forward(p, name, x):
    """y = g * (x - mu) / sqrt(var + eps) + b over the last dim (biased variance, eps = 1e-5)."""
    mu = x.mean(axis=-1, keepdims=True)  # (b, s, 1)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + LN_EPS)  # (b, s, 1)
    xhat = (x - mu) * rstd  # (b, s, h)
    return xhat * p[f"{name}.g"] + p[f"{name}.b"], (name, xhat, rstd, p[f"{name}.g"])


def layernorm_backward(dout, cache):
    """With d = dy * g: dx = rstd * (d - mean(d) - xhat * mean(d * xhat)); dg = sum dy*xhat, db = sum dy."""
    name, xhat, rstd, g = cache
    d = dout * g  # (b, s, h)
    dx = rstd * (d - d.mean(axis=-1, keepdims=True) - xhat * (d * xhat).mean(axis=-1, keepdims=True))
    lead = tuple(range(dout.ndim - 1))
    return dx, {f"{name}.g": (dout * xhat).sum(axis=lead), f"{name}.b": dout.sum(axis=lead)}


def attention_forward(p, name, x, heads, kv_heads=None):
    """Causal MHA: [q k v] = x W_qkv + b_qkv; A = softmax(q k^T / sqrt(d) + mask); y = (A v) W_o + b_o
    (grouped-query: `kv_heads` heads of k and v, each read by heads / kv_heads query heads)."""
    qkv, c_qkv = linear_forward(p, f"{name}.qkv", x)  # (b, s, h + 2 h_kv)
    y, c_core = attention_core_forward(qkv, heads, kv_heads)  # (b, s, h)
    out, c_proj = linear_forward(p, f"{name}.proj", y)  # (b, s, h)
    return out, (c_qkv, c_core, c_proj)


def attention_backward(dout, cache):
    c_qkv, c_core, c_proj = cache
    dy, grads = linear_backward(dout, c_proj)  # (b, s, h)
    dx, g_qkv = linear_backward(attention_core_backward(dy, c_core), c_qkv)  # (b, s, h)
    return dx, grads | g_qkv


def attention_core_forward(qkv, heads, kv_heads=None):
    """Causal attention of `heads` heads from their [q k v] (b, s, w + 2 w_kv) -> (A v) (b, s, w),
    head width d = w / heads, `kv_heads` heads of k and v (None: heads), query head j reading those
    of group j // (heads / kv_heads), as Megatron groups them (a tensor-parallel shard runs its a/t
    heads and kv/t groups through the same code)."""
    b, s, width = qkv.shape
    kv = heads if kv_heads is None else kv_heads
    d = width // (heads + 2 * kv)
    q, k, v = (
        t.reshape(b, s, -1, d).transpose(0, 2, 1, 3) for t in np.split(qkv, [heads * d, (heads + kv) * d], axis=-1)
    )  # (b, nh, s, d); k and v (b, kv, s, d)
    if kv != heads:
        k, v = (np.repeat(t, heads // kv, axis=1) for t in (k, v))  # (b, nh, s, d)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)  # (b, nh, s, s)
    scores = np.where(np.triu(np.ones((s, s), dtype=bool), k=1), -np.inf, scores)
    att = np.exp(scores - scores.max(axis=-1, keepdims=True))  # (b, nh, s, s)
    att /= att.sum(axis=-1, keepdims=True)
    return (att @ v).transpose(0, 2, 1, 3).reshape(b, s, heads * d), (q, k, v, att, kv)  # (b, s, w)


def attention_core_backward(dy, cache):
    """Softmax rows: dS = A * (dA - rowsum(dA * A)); masked entries have A = 0, so dS = 0 there;
    a k or v head shared by a group gets the sum of its readers' gradients. Returns d[q k v]."""
    q, k, v, att, kv = cache
    b, nh, s, d = q.shape
    dy = dy.reshape(b, s, nh, d).transpose(0, 2, 1, 3)  # (b, nh, s, d)
    datt = dy @ v.transpose(0, 1, 3, 2)  # (b, nh, s, s)
    dv = att.transpose(0, 1, 3, 2) @ dy  # (b, nh, s, d)
    dscores = att * (datt - (datt * att).sum(axis=-1, keepdims=True)) / math.sqrt(d)  # (b, nh, s, s)
    dq, dk = dscores @ k, dscores.transpose(0, 1, 3, 2) @ q  # (b, nh, s, d)
    if kv != nh:
        dk, dv = (t.reshape(b, kv, nh // kv, s, d).sum(axis=2) for t in (dk, dv))  # (b, kv, s, d)
    return np.concatenate([t.transpose(0, 2, 1, 3).reshape(b, s, -1) for t in (dq, dk, dv)], axis=-1)


def block_forward(p, name, x, heads, moe: MoEConfig | None = None, kv_heads: int | None = None):
    """Pre-LN block: x' = x + Attn(LN1(x)); y = x' + MLP(LN2(x')), the MLP a mixture of experts
    when `moe` is given (its tokens routed as one group: this microbatch's)."""
    a, c_ln1 = layernorm_forward(p, f"{name}.ln1", x)  # (b, s, h)
    a, c_attn = attention_forward(p, f"{name}.attn", a, heads, kv_heads)  # (b, s, h)
    x = x + a  # (b, s, h)
    m, c_ln2 = layernorm_forward(p, f"{name}.ln2", x)  # (b, s, h)
    if moe is None:
        m, c_mlp = mlp_forward(p, f"{name}.mlp", m)  # (b, s, h)
        return x + m, (c_ln1, c_attn, c_ln2, mlp_backward, c_mlp)
    m, c_mlp = moe_forward(p, f"{name}.moe", m, moe)  # (b, s, h)
    return x + m, (c_ln1, c_attn, c_ln2, moe_backward, c_mlp)


def block_backward(dout, cache):
    """Residuals pass the gradient through unchanged and add the branch's input gradient."""
    c_ln1, c_attn, c_ln2, mlp_backward_of, c_mlp = cache
    dm, g_mlp = mlp_backward_of(dout, c_mlp)  # (b, s, h)
    dm, g_ln2 = layernorm_backward(dm, c_ln2)
    dmid = dout + dm  # (b, s, h)
    da, g_attn = attention_backward(dmid, c_attn)
    da, g_ln1 = layernorm_backward(da, c_ln1)
    return dmid + da, g_mlp | g_ln2 | g_attn | g_ln1


def head_forward(p, x):
    """logits = LN_f(x) W_head; x (b, s, h) -> (b, s, V); the head is untied and has no bias."""
    y, c_ln = layernorm_forward(p, "final_ln", x)  # (b, s, h)
    return y @ p["head.w"], (c_ln, y, p["head.w"])


def head_backward(dout, cache):
    c_ln, y, w = cache
    dw = y.reshape(-1, y.shape[-1]).T @ dout.reshape(-1, dout.shape[-1])  # (h, V)
    dx, g_ln = layernorm_backward(dout @ w.T, c_ln)  # (b, s, h)
    return dx, g_ln | {"head.w": dw}


def cross_entropy_forward(logits, targets):
    """loss = mean over the N = b*s tokens of logsumexp(z) - z[target]."""
    z = logits - logits.max(axis=-1, keepdims=True)  # (b, s, V)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # (b, s, V)
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)  # (b, s, 1)
    return float(-picked.mean()), (logp, targets)


def cross_entropy_backward(dloss, cache):
    """dz = dloss * (softmax(z) - onehot(target)) / N; `dloss` is the scalar dL_total / d loss."""
    logp, targets = cache
    dz = np.exp(logp)  # (b, s, V)
    idx = targets[..., None]  # (b, s, 1)
    np.put_along_axis(dz, idx, np.take_along_axis(dz, idx, axis=-1) - 1.0, axis=-1)
    return dz * (dloss / targets.size), {}


# ---- a contiguous span of the model --------------------------------------------------------------


def model_forward(p, cfg: ShadowConfig, inp, layers, *, embed: bool, targets=None):
    """Run embedding (if `embed`; then `inp` is tokens (b, s)), blocks `layers`, and, if `targets`
    is given, final LN + head + loss. Returns (activations (b, s, h) or the loss, tape)."""
    tape = []
    x = inp
    if embed:
        x, cache = embed_forward(p, x)  # (b, s, h)
        tape.append((embed_backward, cache))
    for i in layers:
        x, cache = block_forward(p, f"layer{i}", x, cfg.heads, cfg.moe if i in cfg.moe_layers else None, cfg.kv_heads)
        tape.append((block_backward, cache))
    if targets is not None:
        logits, cache = head_forward(p, x)  # (b, s, V)
        tape.append((head_backward, cache))
        x, cache = cross_entropy_forward(logits, targets)
        tape.append((cross_entropy_backward, cache))
    return x, tape


def model_backward(dout, tape):
    """Walk the tape in reverse. `dout` is the scalar loss weight when the span ends in the loss,
    else dL/d(output) (b, s, h). Returns (dL/d input or None after the embedding, grads)."""
    grads = {}
    for backward, cache in reversed(tape):
        dout, g = backward(dout, cache)
        grads |= g
    return dout, grads


def moe_routings(tape) -> list:
    """The routing of every MoE layer's groups on a forward tape, layer by layer."""
    return [
        routing
        for backward, cache in tape
        if backward is block_backward and cache[3] is moe_backward
        for routing, _, _ in cache[4]
    ]


def loss_and_grads(p, cfg: ShadowConfig, tokens, targets):
    """The whole model: mean token loss and dloss/dparam for every parameter."""
    loss, tape = model_forward(p, cfg, tokens, range(cfg.layers), embed=True, targets=targets)
    _, grads = model_backward(1.0, tape)
    return loss, grads
