"""Compile-only checks: the kernel builds for Hopper (sm_90a) with nvcc alone, no GPU needed,
and the generated CUDA takes the Hopper paths the design depends on."""

from __future__ import annotations

import re

import pytest

from fa_kernel.configs import SHORT_KEYS, TileConfig, select_config
from fa_kernel.kernel import PRODUCER_THREADS, compiled_forward

pytestmark = pytest.mark.compile


@pytest.mark.parametrize(
    ("head_dim", "causal", "dtype", "seqlen_k"),
    [
        (64, False, "float16", None),
        (64, True, "float16", None),
        (64, True, "bfloat16", SHORT_KEYS),
        (128, False, "float16", None),
        (128, True, "bfloat16", None),
        (128, True, "float16", SHORT_KEYS),
        (256, False, "bfloat16", None),
        (256, True, "float16", None),
    ],
)
def test_compiles_for_sm90a_with_hopper_instructions(head_dim, causal, dtype, seqlen_k):
    config = select_config("sm_90", head_dim, causal, seqlen_k)
    source = compiled_forward(head_dim=head_dim, causal=causal, dtype=dtype, config=config, arch="sm_90a")
    source = source.get_kernel_source()
    threads = config.threads + PRODUCER_THREADS
    assert f"__launch_bounds__({threads}, {config.blocks_per_sm})" in source, "registers for blocks_per_sm blocks"
    assert "wgmma" in source, "Q.K^T and P.V should be warpgroup MMAs on Hopper"
    assert "tma_load" in source or "cp.async" in source, "K/V tiles should arrive by TMA or cp.async"
    assert "exp2" in source, "softmax should use exp2 with log2(e) folded into the scale"
    # Lengths, batch and head counts are kernel arguments, not constants: one build serves all.
    signature = re.search(r"__global__ void __launch_bounds__\([^)]*\) (\w+)\(([^)]*)\)", source)
    assert signature, "kernel signature not found"
    for name in ("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv", "scale_log2"):
        assert re.search(rf"\b{name}\b", signature.group(2)), f"{name} should be a runtime argument"


def test_a_config_whose_output_tile_outgrows_the_v_ring_is_refused():
    # O is staged in the V ring (num_stages * block_n rows) on its way out.
    with pytest.raises(ValueError, match=r"output tile \(192 rows\).*num_stages \* block_n = 64 rows"):
        compiled_forward(head_dim=64, causal=False, dtype="float16", config=TileConfig(192, 64, 1, 384), arch="sm_90a")
