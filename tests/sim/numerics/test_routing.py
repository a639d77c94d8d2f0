"""Node-limited routing (DeepSeek-V3, arXiv:2412.19437 section 2.1.2; deepseek-ai/DeepSeek-V3
inference/model.py, Gate.forward): each token's experts within its best M of G expert blocks."""

import numpy as np
import pytest

from clustersim.sim.numerics.routing import route

# token 0's logits over 8 experts in 4 blocks of 2: (5, 0) (4.9, 4.8) (0, 0) (0, 4.7)
LOGITS = np.array([[5.0, 0.0, 4.9, 4.8, 0.0, 0.0, 0.0, 4.7]])


def chosen(groups=1, limited=None, bias=None, top_k=2):
    x = np.eye(8)[:1]  # x W_gate = the logits row
    w_gate = np.tile(LOGITS, (8, 1))  # any rows but row 0 are multiplied by 0
    return set(route(x, w_gate, top_k, None, True, bias, groups, limited).experts[0].tolist())


def test_without_a_limit_the_best_experts_win_wherever_they_are():
    assert chosen() == {0, 2}
    assert chosen(groups=4, limited=4) == {0, 2}  # every block kept: no limit


def test_one_block_scored_by_its_best_expert_keeps_the_token_in_block_0():
    """Block maxima 5, 4.9, 0, 4.7: block 0 is best, so its two experts are chosen, expert 1's
    logit of 0 included."""
    assert chosen(groups=4, limited=1) == {0, 1}
    assert chosen(groups=4, limited=2) == {0, 2}


def test_with_a_selection_bias_a_block_scores_the_sum_of_its_best_two():
    """DeepSeek-V3's gate with its bias: softmax weights e^5 + e^0 = 149.4 for block 0 against
    e^4.9 + e^4.8 = 255.8 for block 1 (over the same denominator): block 1 wins."""
    assert chosen(groups=4, limited=1, bias=(0.0,) * 8) == {2, 3}


@pytest.mark.parametrize("limited", [1, 2, 3])
def test_every_tokens_experts_lie_in_at_most_the_limit_of_blocks(limited):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((512, 16)), rng.standard_normal((16, 32))  # 32 experts, 8 blocks of 4
    top_k = min(6, 4 * limited)
    routing = route(x, w, top_k, None, True, None, 8, limited)
    blocks_per_token = [len(set((row // 4).tolist())) for row in routing.experts]
    assert max(blocks_per_token) <= limited
    assert max(blocks_per_token) == limited  # the limit binds for some token
    unlimited = route(x, w, top_k, None, True, None, 8, None)
    assert max(len(set((row // 4).tolist())) for row in unlimited.experts) > limited


def test_more_experts_than_the_kept_blocks_hold_is_refused():
    with pytest.raises(ValueError, match="top_k"):
        chosen(groups=4, limited=1, top_k=3)
