"""The MoE layer's numerics: hand-written backward vs finite differences, routing rules, and
expert-parallel shards exchanging tokens by all_to_all vs the single-device reference."""

import numpy as np
import pytest

from clustersim.sim.collectives.ops import Pieces
from clustersim.sim.numerics.expert_parallel import ExpertParallelMoE, traffic_matrix
from clustersim.sim.numerics.moe import MoEConfig, init_moe_params, moe_backward, moe_forward
from clustersim.sim.numerics.routing import route

from finite_differences import central_difference

NAME = "moe"
HIDDEN, FFN, B, S = 8, 16, 2, 6
FD_EPS = 1e-5


def randomized_params(num_experts, shared, seed):
    """init_moe_params moved well away from init, so routing is decisive and GeLU is nonlinear."""
    rng = np.random.default_rng(seed)
    params = init_moe_params(NAME, HIDDEN, FFN, num_experts, shared, rng)
    return {name: value + 0.5 * rng.standard_normal(value.shape) for name, value in params.items()}


def rel_err(got, want):
    """max |got - want| / max |want| (0 when both are all zeros)."""
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), np.finfo(float).tiny))


FD_CASES = {
    "top1-switch-shared": MoEConfig(4, top_k=1, shared=True),
    "top2-normalized-dropping-shared": MoEConfig(4, top_k=2, capacity_factor=0.5, normalize=True, shared=True),
    "top2-unnormalized-dropping": MoEConfig(4, top_k=2, capacity_factor=0.5),
}


@pytest.mark.parametrize("cfg", FD_CASES.values(), ids=FD_CASES.keys())
def test_backward_matches_central_differences_on_every_parameter_and_x(cfg):
    p = randomized_params(cfg.num_experts, cfg.shared, seed=3)
    rng = np.random.default_rng(4)
    x, dout = rng.standard_normal((B, S, HIDDEN)), rng.standard_normal((B, S, HIDDEN))
    _, cache = moe_forward(p, NAME, x, cfg)
    ((routing, _, _),) = cache  # one routing group
    ranked = -np.sort(-routing.probs, axis=1)  # (T, E)
    assert np.min(ranked[:, cfg.top_k - 1] - ranked[:, cfg.top_k]) > 1e-4, "a probe could flip a top-k choice"
    assert (routing.tokens_per_expert > 0).all(), "an idle expert would leave its parameters untested"
    assert (routing.dropped > 0) == (cfg.capacity_factor is not None)
    dx, grads = moe_backward(dout, cache)
    assert set(grads) == set(p)

    def loss():
        return float((moe_forward(p, NAME, x, cfg)[0] * dout).sum())

    for name, array, grad in [(n, p[n], grads[n]) for n in p] + [("x", x, dx)]:
        fd = np.array([central_difference(loss, array, i, FD_EPS) for i in np.ndindex(array.shape)]).reshape(
            array.shape
        )
        assert rel_err(grad, fd) < 1e-6, name


def test_capacity_admits_all_first_choices_before_any_second_choice():
    # h = 1, logits (x, -x): tokens 0, 2, 3 prefer expert 0, token 1 expert 1. C = ceil(0.5 * 4 * 2 / 2) = 2.
    x2d = np.array([[1.0], [-1.0], [1.0], [1.0]])
    r = route(x2d, np.array([[1.0, -1.0]]), top_k=2, capacity_factor=0.5, normalize=True)
    assert r.capacity == 2
    assert r.experts.tolist() == [[0, 1], [1, 0], [0, 1], [0, 1]]
    # first choices t0->0, t1->1, t2->0 fill expert 0 before t3's; of the second choices only t0->1 fits
    assert r.admitted.tolist() == [[True, True], [True, False], [True, False], [False, False]]
    assert r.slots.tolist() == [0, 4, 2, 1]  # (expert, priority) order of assignments t k + j
    assert r.tokens_per_expert.tolist() == [2, 2] and r.dropped == 4
    np.testing.assert_allclose(r.weights.sum(axis=1), 1.0)


def test_uniform_router_ties_send_every_token_to_the_lowest_experts():
    """W_gate = 0: every probability is exactly 1/E, and the stable tie-break picks experts
    0..k-1 for every token: deterministic, and the worst balance there is. With a capacity the
    first C tokens (token order) fill those experts and everything else drops."""
    x2d = np.random.default_rng(0).standard_normal((B * S, HIDDEN))
    w_gate = np.zeros((HIDDEN, 4))
    r = route(x2d, w_gate, top_k=2, capacity_factor=None, normalize=False)
    assert (r.probs == 0.25).all() and (r.weights == 0.25).all()
    assert (r.experts == [0, 1]).all()
    assert r.tokens_per_expert.tolist() == [12, 12, 0, 0] and r.dropped == 0
    r = route(x2d, w_gate, top_k=2, capacity_factor=1.0, normalize=True)  # C = ceil(12 * 2 / 4) = 6
    assert (r.weights == 0.5).all()
    assert r.tokens_per_expert.tolist() == [6, 6, 0, 0] and r.dropped == 12
    assert r.admitted.all(axis=1).tolist() == [True] * 6 + [False] * 6


def test_skewed_router_sends_most_tokens_to_rank_0():
    ep, num_experts = 4, 8
    rng = np.random.default_rng(5)
    w_gate = 0.1 * rng.standard_normal((HIDDEN, num_experts))
    w_gate[0, 0] = 5.0  # feature 0 is always 1 below, so expert 0 wins every token
    routings = []
    for _ in range(ep):
        x2d = rng.standard_normal((B * S, HIDDEN))
        x2d[:, 0] = 1.0
        routings.append(route(x2d, w_gate, top_k=2, capacity_factor=None, normalize=True))
    assert all((r.experts[:, 0] == 0).all() for r in routings)
    traffic = traffic_matrix(routings, ep, num_experts // ep, bytes_per_token=HIDDEN * 8)
    received = traffic.sum(axis=0)  # bytes each rank's experts receive
    assert received[0] == received.max() and (received[0] > received[1:]).all()
    assert (traffic.argmax(axis=1) == 0).all()
    assert traffic.sum() == ep * B * S * 2 * HIDDEN * 8  # no capacity: every assignment travels


# ---- expert parallelism -------------------------------------------------------------------------


def all_to_all(sends, counts):
    """ops.py's all_to_all: rank r sends counts[r][j] elements to j and receives pieces 0->r .. (n-1)->r."""
    pieces = [np.split(buf, np.cumsum(row)[:-1]) for buf, row in zip(sends, counts)]
    return [np.concatenate([pieces[i][j] for i in range(len(sends))]) for j in range(len(sends))]


def run_lockstep(generators):
    """Drive the EP ranks' generators through their all_to_alls together. Returns every rank's
    return value and the (n, n) counts matrix of each exchange."""
    requests = [next(g) for g in generators]
    exchanges = []
    while True:
        assert {request[0] for request in requests} == {"all_to_all"}
        sends = [
            request[1]
            if isinstance(request[1], Pieces)
            else Pieces(request[1], [len(c) for c in np.array_split(request[1], len(requests))])
            for request in requests
        ]
        counts = np.array([send.counts for send in sends])  # (n, n)
        exchanges.append(counts)
        next_requests, results = [], []
        for g, received in zip(generators, all_to_all([send.flat for send in sends], counts)):
            try:
                next_requests.append(g.send(received))
            except StopIteration as stop:
                results.append(stop.value)
        if results:
            assert not next_requests, "ranks left the exchange at different steps"
            return results, exchanges
        requests = next_requests


EP_EXPERTS = 8


@pytest.mark.parametrize("limited", [None, 1], ids=["any-node", "one-node"])
@pytest.mark.parametrize("shared", [False, True], ids=["no-shared", "shared"])
@pytest.mark.parametrize("ep", [1, 2, 4])
@pytest.mark.parametrize("capacity_factor", [None, 0.5], ids=["no-drop", "drop"])
@pytest.mark.parametrize("top_k, normalize", [(1, False), (2, True)], ids=["top1", "top2"])
def test_expert_parallel_shards_match_the_single_device_reference(
    top_k, normalize, capacity_factor, ep, shared, limited
):
    """`limited` 1: node-limited routing with the experts in 4 blocks (ep 4: one per rank), every
    token's experts in one block."""
    cfg = MoEConfig(EP_EXPERTS, top_k, capacity_factor, normalize, shared, expert_groups=4, limited_groups=limited)
    p = randomized_params(EP_EXPERTS, shared, seed=7)
    rng = np.random.default_rng(8)
    xs = [rng.standard_normal((B, S, HIDDEN)) for _ in range(ep)]  # rank r's group
    douts = [rng.standard_normal((B, S, HIDDEN)) for _ in range(ep)]

    reference = [moe_forward(p, NAME, x, cfg) for x in xs]  # each group routed on its own
    reference_back = [moe_backward(d, cache) for d, (_, cache) in zip(douts, reference)]
    routings = [cache[0][0] for _, cache in reference]  # each one group
    if capacity_factor is not None:
        assert all(r.dropped > 0 for r in routings)  # C = 1 (top-1) or 2 (top-2) rows for 12 tokens / 8 experts
    reference_grads = {n: sum(g[n] for _, g in reference_back) for n in p}

    shards = [ExpertParallelMoE(p, NAME, cfg, ep, rank) for rank in range(ep)]
    ys, forward_exchanges = run_lockstep([s.forward(x) for s, x in zip(shards, xs)])
    back, backward_exchanges = run_lockstep([s.backward(d) for s, d in zip(shards, douts)])
    assert (len(forward_exchanges), len(backward_exchanges)) == (3, 2)

    errors = {}
    for rank in range(ep):
        errors[f"y@{rank}"] = rel_err(ys[rank], reference[rank][0])
        errors[f"dx@{rank}"] = rel_err(back[rank][0], reference_back[rank][0])
    owners = {}
    for _, grads in back:
        for n, g in grads.items():
            owners.setdefault(n, []).append(g)
    assert set(owners) == set(p)
    for n, partials in owners.items():
        replicated = n == f"{NAME}.gate.w" or n.startswith(f"{NAME}.shared.")
        assert len(partials) == (ep if replicated else 1), n
        errors[n] = rel_err(sum(partials), reference_grads[n])
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-10, f"{worst}: {errors[worst]:.2e}"

    dispatch_bytes = traffic_matrix(routings, ep, EP_EXPERTS // ep, bytes_per_token=HIDDEN * 8)
    np.testing.assert_array_equal(forward_exchanges[1] * 8, dispatch_bytes)
    np.testing.assert_array_equal(forward_exchanges[2] * 8, dispatch_bytes.T)  # the combine


def test_backward_without_forward_raises():
    shard = ExpertParallelMoE(randomized_params(4, False, 0), NAME, MoEConfig(4), ep=2, rank=1)
    with pytest.raises(RuntimeError, match="EP rank 1: backward without a forward"):
        next(shard.backward(np.zeros((B, S, HIDDEN))))


# ---- input validation ---------------------------------------------------------------------------


def test_rejects_top_k_above_num_experts():
    with pytest.raises(ValueError, match=r"top_k \(5\) must be in 1..num_experts \(4\)"):
        MoEConfig(4, top_k=5)
    with pytest.raises(ValueError, match=r"top_k \(5\) must be in 1..num_experts \(4\)"):
        route(np.zeros((3, HIDDEN)), np.zeros((HIDDEN, 4)), 5, None, False)


def test_rejects_ep_not_dividing_num_experts():
    p = randomized_params(4, False, 0)
    with pytest.raises(ValueError, match=r"ep \(3\) must divide num_experts \(4\)"):
        ExpertParallelMoE(p, NAME, MoEConfig(4), ep=3, rank=0)


@pytest.mark.parametrize("capacity_factor", [0.0, -1.0])
def test_rejects_non_positive_capacity_factor(capacity_factor):
    with pytest.raises(ValueError, match=r"capacity_factor \(.*\) must be > 0"):
        MoEConfig(4, capacity_factor=capacity_factor)
    with pytest.raises(ValueError, match=r"capacity_factor \(.*\) must be > 0"):
        route(np.zeros((3, HIDDEN)), np.zeros((HIDDEN, 4)), 1, capacity_factor, False)
