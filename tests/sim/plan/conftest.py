"""A small scenario for the planner's tests: 8 GPUs on one switch, a 12-head model (so tp 8,
which divides the GPU count, does not divide the heads)."""

import pytest

SMALL = """\
name: small
cluster: {gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 8,
          topology: {kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}
model: {layers: 8, hidden: 768, heads: 12, ffn: 3072, seq_len: 512, vocab: 1024}
training: {global_batch: 16, micro_batch: 1, recompute: none}
parallel: {pp: 2, dp: 4}
schedule: 1f1b
numerics: {enabled: false}
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return str(path)
