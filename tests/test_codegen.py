"""Compile-only checks: the kernel builds for Hopper (sm_90a) with nvcc alone, no GPU needed,
and the generated CUDA takes the Hopper paths the design depends on."""

from __future__ import annotations

import re

import pytest

from fa_kernel.configs import SHORT_KEYS, TileConfig, select_config
from fa_kernel.kernel import PRODUCER_THREADS, compiled_forward

pytestmark = pytest.mark.compile


SHIPPED_CASES = pytest.mark.parametrize(
    ("head_dim", "causal", "dtype", "seqlen_k"),
    [
        (64, False, "float16", None),
        (64, True, "float16", None),
        (64, True, "bfloat16", SHORT_KEYS),
        (128, False, "float16", None),
        (128, False, "bfloat16", SHORT_KEYS),
        (128, True, "bfloat16", None),
        (128, True, "float16", SHORT_KEYS),
        (256, False, "bfloat16", None),
        (256, True, "float16", None),
    ],
)


def shipped_source(head_dim, causal, dtype, seqlen_k):
    """The tuned config of this case and its generated CUDA."""
    config = select_config("sm_90", head_dim, causal, seqlen_k)
    kernel = compiled_forward(head_dim=head_dim, causal=causal, dtype=dtype, config=config, arch="sm_90a")
    return config, kernel.get_kernel_source()


@SHIPPED_CASES
def test_compiles_for_sm90a_with_hopper_instructions(head_dim, causal, dtype, seqlen_k):
    config, source = shipped_source(head_dim, causal, dtype, seqlen_k)
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


def output_staging_gaps(source: str, consumers: int) -> list[str]:
    """What the generated CUDA lacks for O's trip through the V ring, [] if nothing.

    O is written into V's ring (kernel.py) while the other consumer warpgroups' last P.V may
    still be reading that buffer, by wgmma, which compute-sanitizer's racecheck does not
    see; and the store to global memory reads what every consumer thread wrote. TileLang
    inserts the syncs for both (a mutant cannot remove them), so only the code can show them.
    """
    epilogue = source[source.rindex("v_empty[") :]  # after the tile's last P.V released its stage
    every_consumer = re.compile(rf"__sync_thread_partial\(\d+, {consumers}\)|__syncthreads\(\)")
    write = re.search(r"\(\((?:half_t|bfloat16_t)\*\)[OV]_shared\)", epilogue)
    store = re.search(r"tl::tma_store\(Output_desc|\(Output \+", epilogue)
    released = epilogue.find("o_stored[0].arrive()")
    if not (write and store and released > store.end()):
        return ["O's write into the V ring, its store to Output or o_stored's arrive not found"]
    gaps = []
    if not every_consumer.search(epilogue, 0, write.start()):
        gaps.append("no sync of every consumer between the last P.V and O's write into the V ring")
    if not every_consumer.search(epilogue, write.end(), store.start()):
        gaps.append("no sync of every consumer between O's write and its store to Output")
    if "fence_proxy_async" not in epilogue[store.end() : released]:
        gaps.append("no proxy fence between O's store and the arrive that lets the next V land by TMA")
    return gaps


@SHIPPED_CASES
def test_output_staged_in_the_v_ring_waits_for_every_consumer(head_dim, causal, dtype, seqlen_k):
    config, source = shipped_source(head_dim, causal, dtype, seqlen_k)
    assert output_staging_gaps(source, config.threads) == []
    # The check can fail: without the sync before O's write (the first in the epilogue), it says so.
    epilogue_start = source.rindex("v_empty[")
    sync = re.compile(rf"[^\n]*(__sync_thread_partial\(\d+, {config.threads}\)|__syncthreads\(\));\n")
    unsynced = source[:epilogue_start] + sync.sub("", source[epilogue_start:], count=1)
    assert output_staging_gaps(unsynced, config.threads)[:1] == [
        "no sync of every consumer between the last P.V and O's write into the V ring"
    ]


def test_overlapping_the_epilogue_without_a_persistent_grid_is_refused():
    # Only a persistent thread block has a next work tile whose Q.K^T could run under the epilogue.
    with pytest.raises(ValueError, match=r"config.overlap_epilogue: needs persistent=True"):
        compiled_forward(
            head_dim=128,
            causal=False,
            dtype="float16",
            config=TileConfig(128, 176, 2, 256, overlap_epilogue=True),
            arch="sm_90a",
        )
