"""What the engine asks of the numerics (sim.numerics, the shadow model) while it walks."""

from __future__ import annotations

from typing import Any, Protocol

from clustersim.schedules.ir import Collective, Compute, Recv, Send


class Numerics(Protocol):
    """Run compute on real arrays, move real payloads, and say how much more or less work than
    the cost model's estimate an op turned out to be (an MoE experts piece: the rows its routing
    really sent, against an even share). An all_to_all's input may be `Pieces`, whose
    routing-decided sizes then time it."""

    def run_compute(self, rank: int, op: Compute) -> object: ...  # what it returns is not read
    def work(self, rank: int, op: Compute) -> float: ...
    def send_payload(self, rank: int, op: Send) -> Any: ...
    def receive(self, rank: int, op: Recv, payload: Any) -> None: ...
    def collective_input(self, rank: int, op: Collective) -> Any: ...
    def collective_output(self, rank: int, op: Collective, result: Any) -> None: ...
