"""Transformer Engine's overlap of the tensor-parallel collectives with the GEMMs beside them
(userbuffers; NeMo's `ub_tp_comm_overlap`), as tp_stage_plan tokens: a sublayer's work item cut
at the edges of its two overlapped GEMMs, each collective running beside its GEMM.

With sequence parallelism a sublayer (attention, dense MLP) is entered through an all-gather and
left through a reduce-scatter. TE v1.8 (the NeMo 24.07 container's; transformer_engine/pytorch/
module/base.py initialize_ub, lines 100-102) pairs them with GEMMs by three methods:

    ring_exchange  the all-gather feeding the first GEMM: QKV and FC1 forward, the output
                   projection's and FC2's input gradient (dgrad) in the backward. The GEMM runs in
                   t chunks, chunk i on the rows at hand while the next t-th of the input comes from
                   the ring neighbour (csrc/comm_gemm_overlap.h split_overlap_ag, 828-960: t GEMMs,
                   t - 1 userbuffers_send/recv), sent by the copy engine (use_ce default True,
                   base.py 235; userbuffers.cu 2253-2255 cudaMemcpyAsync): no SMs taken. Exposed:
                   the last chunk's GEMM after the last exchange, and whatever of the exchanges the
                   first t - 1 chunks do not cover.
    pipeline       the reduce-scatter of the last GEMM's output: output projection and FC2 forward.
                   The GEMM runs in num_splits chunks (default 4, base.py 231), chunk i's
                   reduce-scatter starting when the chunk is done (split_overlap_rs, 382-540), done
                   by userbuffers kernels on num_sm SMs; with set_sm_margin the GEMM chunks run on
                   the SMs less num_sm (comm_gemm_overlap.h 184: _math_sms). Exposed: the first
                   chunk (nothing to send yet) and the last chunk's reduce-scatter.
    bulk           the backward's reduce-scatter of the first GEMM's input gradient (QKV, FC1 dgrad)
                   beside the same linear's weight gradient, started together, not chunked
                   (bulk_overlap, 206-265). Exposed: what the weight gradient does not cover. (Its
                   pair, the re-gather of the saved input beside dgrad, is no collective here: the
                   program never modelled that all-gather.)

Segment items: "F.attn|pre" (kernels before the first overlapped GEMM), "F.attn|entry|3/4" (a
share of that GEMM), "F.attn|mid", "F.attn|exit|1/4", "F.attn|post"; sim.cost.kernel_times
resolves them to kernels. A collective on group OVERLAPPED or PIPELINED runs beside the next piece
and is waited for by the piece after it; TAIL is a pipelined reduce-scatter's last chunk.
"""

from __future__ import annotations

from fractions import Fraction

OVERLAPPED = "tp_overlap"  # the whole collective beside the next piece (ring exchange, bulk)
PIPELINED = "tp_pipelined"  # all chunks but the last beside the next piece (pipeline)
TAIL = "tp_tail"  # the pipelined reduce-scatter's last chunk, after its GEMM: blocking
BESIDE = (OVERLAPPED, PIPELINED)  # groups whose collective does not hold the next piece
PIPELINE_SPLITS = 4  # TE's num_splits default (base.py 231); every NeMo ub_cfg for H100 keeps 4
SEGMENTS = ("pre", "entry", "mid", "exit", "post")
CUT = (None, None)  # a piece boundary without a collective


def segment(item: str, name: str, share: Fraction | None = None) -> str:
    """The item naming segment `name` of work item `item`, or a `share` of it."""
    return f"{item}|{name}" + (f"|{share.numerator}/{share.denominator}" if share is not None else "")


def parse_segment(item: str) -> tuple[str, str | None, Fraction]:
    """(work item, segment or None for the whole item, share of it)."""
    whole, _, rest = item.partition("|")
    if not rest:
        return whole, None, Fraction(1)
    name, _, share = rest.partition("|")
    return whole, name, Fraction(share) if share else Fraction(1)


def overlapped_sublayer(item: str, tp: int) -> list:
    """The tokens of a sequence-parallel sublayer `item` ("F.attn", "B.mlp", ...) with its
    all-gather and reduce-scatter overlapped: what replaces [all-gather, item, reduce-scatter]."""
    ring = [segment(item, "entry", Fraction(tp - 1, tp)), CUT, segment(item, "entry", Fraction(1, tp))]
    head = [segment(item, "pre"), ("all_gather", OVERLAPPED), *ring, segment(item, "mid")]
    if item.startswith("F."):  # pipeline: the last GEMM's first chunk, then its reduce-scatter beside the rest
        first = Fraction(1, PIPELINE_SPLITS)
        exit_ = [segment(item, "exit", first), ("reduce_scatter", PIPELINED), segment(item, "exit", 1 - first)]
        return head + exit_ + [("reduce_scatter", TAIL), segment(item, "post")]
    # bulk: the weight gradient beside the whole reduce-scatter
    return head + [("reduce_scatter", OVERLAPPED), segment(item, "exit"), CUT, segment(item, "post")]


def collective_share(on: str) -> Fraction:
    """The share of the activation a tensor-parallel collective on group `on` moves."""
    if on == PIPELINED:
        return 1 - Fraction(1, PIPELINE_SPLITS)
    if on == TAIL:
        return Fraction(1, PIPELINE_SPLITS)
    return Fraction(1)
