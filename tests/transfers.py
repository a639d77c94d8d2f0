"""Start messages on a Network at given times and read when each landed (shared by the network tests)."""

import numpy as np


def landing_times(net, starts, label: str = "m") -> list[float]:
    """Start each (t, src, dst, nbytes) at time t as one transfer, labelled label + its index
    (src, dst: GPU indices, or arrays of them for transfer_many); each one's landing time."""
    out = {}

    def send(i, t, src, dst, nbytes):
        yield net.env.timeout(t)
        if np.ndim(src):
            yield net.transfer_many(src, dst, nbytes, f"{label}{i}")
        else:
            yield net.transfer(src, dst, nbytes, f"{label}{i}")
        out[i] = net.env.now

    for i, start in enumerate(starts):
        net.env.process(send(i, *start))
    net.env.run()
    return [out[i] for i in range(len(starts))]
