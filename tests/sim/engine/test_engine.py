"""The engine's rules: one program gives one record, bit for bit; its loop fits one screen; the
plain Scale is the identity, and a symmetric one meets only the members its program holds."""

import inspect
import pickle

import numpy as np
import pytest
import simpy

from clustersim.schedules.ir import Collective, Compute, Program
from clustersim.schedules.tags import GradBucket
from clustersim.sim.build import build_topology, make_program, symmetry_of
from clustersim.sim.engine import loop
from clustersim.sim.engine.loop import DeadlockError, run_program
from clustersim.sim.network.network import Network
from clustersim.sim.run import simulate
from clustersim.sim.scale.execution import Scale, Symmetric, make_scale
from clustersim.sim.scenario.loader import load_scenario
from clustersim.topologies.switch import switch

from repo import QUICKSTART
from symmetric_cases import scenario as shortcut_scenario

SCREEN_LINES = 50  # a screen of code


def record(log) -> bytes:
    """Everything a log holds, as bytes: equal bytes, equal records."""
    flows, links = log.flows, log.links
    columns = (flows.src, flows.dst, flows.start_s, flows.end_s, flows.nbytes, flows.label, flows.links)
    return pickle.dumps(
        (
            [tuple(span) for span in log.spans],
            [np.asarray(c).tobytes() for c in columns],
            flows.labels,
            [np.asarray(c).tobytes() for c in (links.bytes, links.busy_s, links.peak_flows, *links.timeline)],
            log.num_ranks,
            log.represented,
        )
    )


@pytest.mark.parametrize("case", ["quickstart", "fattree-128-1f1b"])
def test_one_program_gives_one_record(case):
    """The quickstart (numerics on, every rank walked) and a symmetric fat tree (one rank per
    orbit, replays, the network solved per orbit), each run twice."""
    if case == "quickstart":
        runs = [simulate(load_scenario(QUICKSTART)) for _ in range(2)]
    else:
        runs = [simulate(shortcut_scenario(case)) for _ in range(2)]
        assert runs[0].summary["symmetry"] is not None
    assert record(runs[0].log) == record(runs[1].log)


def test_the_loop_fits_one_screen():
    for function in (loop.run_program, loop._run):
        lines = len(inspect.getsource(function).splitlines())
        assert lines <= SCREEN_LINES, f"{function.__name__} has {lines} lines"


def test_the_plain_scale_is_the_identity():
    network = Network(simpy.Environment(), switch(4, 1e9, 1e-6))
    scale = Scale(network)
    op = Collective("all_reduce", GradBucket(0, 0, 0), (0, 1, 2, 3), 1e6)
    assert scale.in_person(op) == 4
    assert scale.ahead(op) is None
    assert scale.groups(op) == [(0, 1, 2, 3)]
    assert scale.ranks(Program({0: [], 1: []}, 1, 1)) == (2, None)
    assert scale.signal_from(0)(3, 0.0, "signal") == pytest.approx(2e-6)  # GPU -> switch -> GPU


def test_a_symmetric_scale_meets_only_the_members_its_program_holds():
    """fattree-128-1f1b: pp 4 x dp 4 x tp 8; ranks (d = 0, p, t = 0) are walked, each standing
    for 32; a data-parallel group holds one walked member."""
    s = shortcut_scenario("fattree-128-1f1b")
    symmetry = symmetry_of(s)
    program = make_program(s, symmetry.representatives)
    scale = make_scale(program, build_topology(s), symmetry)
    assert isinstance(scale, Symmetric) and program.ranks == [0, 8, 16, 24]
    dp_op = next(op for op in program.ops[0] if isinstance(op, Collective) and op.stream == "dp")
    assert scale.in_person(dp_op) == 1 and len(dp_op.group) == 4
    assert scale.ranks(program) == (128, (0, 8, 16, 24))
    with pytest.raises(ValueError, match="exactly the representatives"):
        Symmetric(scale.network, symmetry, make_program(s))


def test_a_symmetric_scale_refuses_numerics():
    s = shortcut_scenario("fattree-128-1f1b")
    symmetry = symmetry_of(s)
    program = make_program(s, symmetry.representatives)
    scale = make_scale(program, build_topology(s), symmetry)
    with pytest.raises(ValueError, match="runs no numerics"):
        run_program(program, scale.network, lambda op: 0.0, numerics=object(), scale=scale)  # type: ignore[arg-type]


def test_a_collective_missing_a_member_is_a_deadlock_that_names_it():
    ops = {0: [Collective("all_reduce", GradBucket(0, 0, 0), (0, 1), 1e6)], 1: [Compute("F", 0, 0, 1.0)]}
    network = Network(simpy.Environment(), switch(2, 1e9, 0.0))
    with pytest.raises(DeadlockError, match=r"rank 0 dp: ALL_REDUCE grads@0\.t0\.b0 waits for ranks 0, 1 to join"):
        run_program(Program(ops, 1, 1), network, compute_time_s=lambda op: op.flops)
