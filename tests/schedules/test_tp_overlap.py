"""schedules.tp_overlap: a sublayer's pieces with Transformer Engine's overlap, as TE v1.8's
initialize_ub pairs the collectives with GEMMs (ring exchange, pipeline, bulk)."""

from fractions import Fraction

from clustersim.schedules.ir import Phase
from clustersim.schedules.stage_pieces import UNIT_ITEM, tp_stage_plan, unit_starts
from clustersim.schedules.tp_overlap import (
    OVERLAPPED,
    PIPELINE_SPLITS,
    PIPELINED,
    TAIL,
    collective_share,
    parse_segment,
    segment,
)


def test_a_forward_layer_runs_each_all_gather_and_reduce_scatter_beside_a_gemm():
    """Per sublayer: ring exchange into the first GEMM (3/4 beside the all-gather, 1/4 after it,
    t = 4), then the last GEMM's first of 4 chunks before its reduce-scatter starts, the other 3
    beside it, the last chunk's reduce-scatter after them."""
    pieces = tp_stage_plan(Phase.F, 1, False, False, True, tp=4, overlap=True)
    expected = [
        (("F.attn|pre",), "all_gather", OVERLAPPED),
        (("F.attn|entry|3/4",), None, None),
        (("F.attn|entry|1/4", "F.attn|mid", "F.attn|exit|1/4"), "reduce_scatter", PIPELINED),
        (("F.attn|exit|3/4",), "reduce_scatter", TAIL),
        (("F.attn|post", "F.mlp|pre"), "all_gather", OVERLAPPED),
        (("F.mlp|entry|3/4",), None, None),
        (("F.mlp|entry|1/4", "F.mlp|mid", "F.mlp|exit|1/4"), "reduce_scatter", PIPELINED),
        (("F.mlp|exit|3/4",), "reduce_scatter", TAIL),
        (("F.mlp|post",), None, None),
    ]
    assert pieces == expected


def test_a_backward_layer_runs_its_reduce_scatter_beside_the_weight_gradient():
    """Ring exchange into the output projection's (FC2's) input gradient; the reduce-scatter of
    QKV's (FC1's) input gradient beside its weight gradient, whole (bulk)."""
    pieces = tp_stage_plan(Phase.B, 1, False, False, True, tp=2, overlap=True)
    expected = [
        (("B.mlp|pre",), "all_gather", OVERLAPPED),
        (("B.mlp|entry|1/2",), None, None),
        (("B.mlp|entry|1/2", "B.mlp|mid"), "reduce_scatter", OVERLAPPED),
        (("B.mlp|exit",), None, None),
        (("B.mlp|post", "B.attn|pre"), "all_gather", OVERLAPPED),
        (("B.attn|entry|1/2",), None, None),
        (("B.attn|entry|1/2", "B.attn|mid"), "reduce_scatter", OVERLAPPED),
        (("B.attn|exit",), None, None),
        (("B.attn|post",), None, None),
    ]
    assert pieces == expected


def test_without_sequence_parallelism_or_with_moe_nothing_is_overlapped():
    """The all-reduces of plain tensor parallelism and the MoE MLP's collectives stay blocking."""
    plain = tp_stage_plan(Phase.F, 1, False, False, False, tp=4, overlap=True)
    assert plain == tp_stage_plan(Phase.F, 1, False, False, False, tp=4)
    moe = tp_stage_plan(Phase.F, [True], False, False, True, tp=4, ep=2, overlap=True)
    assert [on for _, _, on in moe if on is not None][-1] == "tp"  # the MoE MLP's reduce-scatter


def test_a_pipelined_reduce_scatter_and_its_tail_move_the_whole_activation_once():
    assert collective_share(PIPELINED) + collective_share(TAIL) == 1
    assert collective_share(TAIL) == Fraction(1, PIPELINE_SPLITS) and collective_share(OVERLAPPED) == 1


def test_segments_read_back():
    assert parse_segment(segment("B.attn", "entry", Fraction(3, 4))) == ("B.attn", "entry", Fraction(3, 4))
    assert parse_segment("F.mlp") == ("F.mlp", None, Fraction(1))


def test_a_zero3_unit_starts_inside_the_piece_that_ends_the_unit_before():
    """No collective falls between two overlapped layers: the second unit (layer) starts in the
    piece of the first one's last residual, which ends with the second one's all-gather."""
    pieces = tp_stage_plan(Phase.F, 2, False, False, True, tp=2, unit_layers=1, overlap=True)
    assert unit_starts(pieces) == (0, 8)
    assert pieces[8] == (("F.mlp|post", UNIT_ITEM, "F.attn|pre"), "all_gather", OVERLAPPED)
