"""Metrics of a run, each a pure function of the event log, each defined by its formula."""

from __future__ import annotations

from collections.abc import Collection
from itertools import compress
from operator import itemgetter

import numpy as np

from clustersim.schedules.ir import MICROBATCH_PHASES, Comm, Phase
from clustersim.schedules.tensor_parallel import EP_STREAM
from clustersim.sim.engine.records import EventLog
from clustersim.sim.network.records import FlowTable

PIPELINE_PHASES = MICROBATCH_PHASES  # F, B and W: the pipeline's compute
ALLTOALL_PHASE = Comm.ALL_TO_ALL  # a collective span's phase is its kind in capitals
ALLTOALL_STREAMS = (EP_STREAM,)  # streams that carry only all-to-alls (MoE dispatch, combine, counts)


def step_time_s(log: EventLog) -> float:
    """Step time = the end of the last span of any rank (the step starts at t = 0)."""
    return log.makespan_s


def bubble_ratio_per_rank(log: EventLog) -> list[float]:
    """bubble_r = idle_r / (idle_r + busy_r) over the pipeline window [0, T_FB].

    busy_r is the time rank r spends in forward and backward compute (B and W where split); T_FB is
    the end of the last forward or backward on any rank, so idle_r + busy_r = T_FB. The optimizer step is left out:
    it follows the flush and is not part of the pipeline's bubble.
    """
    pipeline = list(compress(log.spans, map(set(PIPELINE_PHASES).__contains__, map(itemgetter(3), log.spans))))
    window_s = max(map(itemgetter(7), pipeline), default=0.0)  # their end_s
    # busy_r summed span by span in log order (bincount adds its weights in order, as a loop would)
    rank = np.fromiter(map(itemgetter(0), pipeline), np.int64, len(pipeline))
    duration = np.fromiter(map(itemgetter(7), pipeline), float, len(pipeline)) - np.fromiter(
        map(itemgetter(6), pipeline), float, len(pipeline)
    )
    busy = np.bincount(rank, weights=duration, minlength=log.num_ranks)[: log.num_ranks].tolist()
    if window_s <= 0:
        return [0.0] * log.num_ranks
    return [(window_s - b) / window_s for b in busy]


def megatron_bubble_over_ideal_per_rank(log: EventLog) -> list[float | None]:
    """Megatron's bubble time fraction t_pb / t_id (Narayanan et al. 2021, sec 2.2.1): idle_r / busy_r
    over the pipeline window, i.e. bubble_r / (1 - bubble_r) with bubble_r from bubble_ratio_per_rank.
    With equal stage times and free communication it is (p - 1) / m for GPipe and 1F1B and
    (p - 1) / (v m) interleaved: bubble time against the ideal (bubble-free) time, not a share of
    the step (summary.json's bubble_fraction is that). A rank with no forward or backward has no
    ideal time: None (null in JSON)."""
    return [ratio / (1 - ratio) if ratio < 1 else None for ratio in bubble_ratio_per_rank(log)]


def peak_inflight_microbatches_per_rank(log: EventLog) -> list[int]:
    """Most (microbatch, stage) activations a rank holds at once: +1 when a forward starts,
    -1 when its backward ends, its W where the backward is split (EventLog.held_activations; an
    end at the same instant as a start is counted first; an op in pieces starts with its first and
    ends with its last)."""
    events: list[list[tuple[float, int]]] = [[] for _ in range(log.num_ranks)]
    for (rank, _, _), (start, end) in log.held_activations.items():
        events[rank].append((start, +1))
        if end is not None:
            events[rank].append((end, -1))
    peaks = []
    for rank_events in events:
        level = peak = 0
        for _, delta in sorted(rank_events):
            level += delta
            peak = max(peak, level)
        peaks.append(peak)
    return peaks


def model_flops(log: EventLog) -> float:
    """Model FLOPs of the step: 3 x the forward FLOPs (backward = 2 x forward). Work a backward
    adds to recompute activations is done by the hardware but is not model FLOPs (the MFU of
    Chowdhery et al. 2022, PaLM, appendix B)."""
    return 3 * sum(compress(map(itemgetter(9), log.spans), map(Phase.F.__eq__, map(itemgetter(3), log.spans))))


def tflops_per_gpu(log: EventLog, num_gpus: int) -> float:
    """Achieved model TFLOP/s per GPU = forward+backward FLOPs / (step time x GPUs) / 1e12."""
    step = step_time_s(log)
    return model_flops(log) / (step * num_gpus) / 1e12 if step > 0 else 0.0


def stream_of_flows(flows: FlowTable, label: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(the streams, sorted; the stream index of each message with label index `label`): a
    flow's label is "stream:...", so the stream is what precedes the first colon."""
    streams, stream_of_label = flows.label_streams
    return streams, stream_of_label[label] if len(label) else np.zeros(0, np.int64)


def bytes_sent_per_rank(log: EventLog) -> dict[str, dict[str, float]]:
    """Bytes each rank put on the network, by the stream that sent them (flow labels start with
    "stream:"); GPU g is rank g."""
    src, _, nbytes, label = log.flows.totals()
    streams, stream_of = stream_of_flows(log.flows, label)
    sources = max(log.num_ranks, int(src.max()) + 1 if len(src) else 0)
    key = src * len(streams) + stream_of
    totals = np.bincount(key, weights=nbytes, minlength=sources * len(streams)).reshape(sources, -1)
    counts = np.bincount(key, minlength=sources * len(streams)).reshape(sources, -1)
    sent: dict[str, dict[str, float]] = {str(rank): {} for rank in range(log.num_ranks)}
    for src, stream in zip(*np.nonzero(counts)):
        sent.setdefault(str(src), {})[streams[stream]] = float(totals[src, stream])
    return sent


def traffic_matrix_bytes(
    log: EventLog, num_gpus: int, streams: Collection[str] | None = None, block: int = 1
) -> np.ndarray:
    """(num_gpus, num_gpus) bytes, [i, j] = bytes of the messages GPU i delivered to GPU j (GPUs,
    as the flow table has them, not ranks), of `streams` only (None: every message): who talks
    to whom, e.g. an even all-to-all as a uniform block per expert-parallel group. A piece sent to
    oneself is a local copy, not a message, so it is not counted. With `block` > 1, cell [i, j]
    sums GPUs i x block ... (i + 1) x block - 1 to the same of j (a matrix a huge run can hold)."""
    src, dst, nbytes, label = log.flows.totals()
    names, stream_of = stream_of_flows(log.flows, label)
    keep = (
        np.ones(len(src), bool)
        if streams is None
        else np.isin(stream_of, [names.index(s) for s in streams if s in names])
    )
    n = -(-num_gpus // block)
    cells = np.bincount(src[keep] // block * n + dst[keep] // block, weights=nbytes[keep], minlength=n * n)
    return cells.reshape(n, n)


def alltoall_time_share(log: EventLog) -> float:
    """share = sum_r |union of r's all-to-all spans| / (T x ranks), T the step time: the share of
    the ranks' time inside an all-to-all, hidden under compute or not (with an MoE model, what the
    expert-parallel dispatch and combine cost against the whole step). 0.0 without all-to-alls."""
    step = step_time_s(log)
    if step <= 0 or log.num_ranks == 0:
        return 0.0
    intervals = sorted((s.rank, s.start_s, s.end_s) for s in log.spans if s.phase == ALLTOALL_PHASE)
    inside = 0.0
    covered_to = (-1, 0.0)  # (rank, end of the union so far on that rank)
    for rank, start, end in intervals:
        reach = covered_to[1] if covered_to[0] == rank else start
        inside += max(end - max(start, reach), 0.0)
        covered_to = (rank, max(reach, end))
    return inside / (step * len(log.averaged_ranks))
