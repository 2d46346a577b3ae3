"""A launch writes nothing outside `out` and `lse`: both are views into larger buffers whose
guard regions, before and after, hold a sentinel bit pattern that must survive bitwise.

Every global store of the kernel is bounded today, the LSE store by TileLang's
LegalizeSafeMemoryAccess pass (a per-dimension check it adds beside the kernel's own) and O's
TMA store by the tensor map's extents, so this test guards against a change of either: the
pass switched off (tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS), a store by plain
pointers or inline PTX, a TileLang upgrade. compute-sanitizer sees such a write only where it
leaves the allocation; inside the caching allocator's block, which a small overrun is, only a
guard region does.
"""

from __future__ import annotations

import pytest
import torch
from suite.boundaries import build_id, sweep_builds
from suite.builds import GUARD_CASES, GUARD_GRID
from suite.launch import device_arch, kernel_for

from fa_kernel.configs import TileConfig
from fa_kernel.kernel import compiled_forward
from fa_kernel.numerics import LOG2E
from fa_kernel.reference import judge, random_qkv

pytestmark = pytest.mark.gpu

# Fixed bit patterns, written and compared through integer views: a NaN with a payload in fp16,
# a signalling-NaN pattern in fp32. No result of the kernel has these bits.
OUT_SENTINEL = 0x7E5A
LSE_SENTINEL = 0x7FA5A5A5
# Query rows of guard before and after each: more than one tile of rows of any config.
GUARD_ROWS = 256
SWEEP_BUILDS = sweep_builds()


def shapes(config: TileConfig) -> list[tuple[int, int, int, int, int]]:
    """(batch, seqlen_q, seqlen_k, nheads, nheads_kv): the last query block partial (37 rows,
    then 1), GQA and MQA, 3 x 4 x 2 = 24 and 3 x 3 = 9 work tiles; the second with fewer keys
    than queries, so causal rows that see no key."""
    block_m = config.block_m
    return [(2, 2 * block_m + 37, 300, 4, 2), (1, 2 * block_m + 1, block_m - 7, 3, 1)]


def guarded(shape: tuple[int, ...], dtype: torch.dtype, sentinel: int, guard: int):
    """(buffer, view): a contiguous `shape` view of `dtype` with `guard` elements of sentinel
    before and after it in `buffer` (an integer tensor of the same element size). The view
    starts as sentinel too, so an element the kernel skips fails the judge."""
    int_dtype = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
    numel = int(torch.Size(shape).numel())
    buffer = torch.full((guard + numel + guard,), sentinel, dtype=int_dtype, device="cuda")
    return buffer, buffer[guard : guard + numel].view(dtype).view(shape)


def assert_guards_untouched(buffer: torch.Tensor, guard: int, sentinel: int, what: str) -> None:
    """Both guard regions of `buffer` still hold the sentinel, or an AssertionError saying where
    the first write landed, counted from the view's ends."""
    numel = buffer.numel() - 2 * guard
    for name, region, start in (("before", buffer[:guard], -guard), ("after", buffer[guard + numel :], numel)):
        written = (region != sentinel).nonzero().flatten()
        if written.numel():
            first = start + int(written[0])
            raise AssertionError(
                f"{what}: {written.numel()} elements of the guard {name} were written; the first at "
                f"index {first} of a view of {numel} elements"
            )


def assert_writes_only_out_and_lse(kernel_of, head_dim: int, causal: bool, config: TileConfig) -> None:
    """Each of shapes(config) launched into guarded views by `kernel_of(q)`'s kernel: the guard
    regions untouched, and out and lse judged."""
    assert config.block_m <= GUARD_ROWS
    for batch, seqlen_q, seqlen_k, nheads, nheads_kv in shapes(config):
        label = f"{config}, {batch}x{seqlen_q}x{seqlen_k}x{nheads}/{nheads_kv}, d{head_dim}, causal={causal}"
        q, k, v = random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, torch.float16, seed=seqlen_q)
        out_buffer, out = guarded(q.shape, q.dtype, OUT_SENTINEL, GUARD_ROWS * nheads * head_dim)
        lse_buffer, lse = guarded((batch, nheads, seqlen_q), torch.float32, LSE_SENTINEL, GUARD_ROWS)
        kernel_of(q)(q, k, v, out, lse, LOG2E / head_dim**0.5)
        torch.cuda.synchronize()
        assert_guards_untouched(out_buffer, GUARD_ROWS * nheads * head_dim, OUT_SENTINEL, f"output, {label}")
        assert_guards_untouched(lse_buffer, GUARD_ROWS, LSE_SENTINEL, f"LSE, {label}")
        verdict = judge(q, k, v, out, lse, causal)
        assert verdict.passed, f"{label}: {verdict}"


@pytest.mark.parametrize(
    ("head_dim", "causal", "config"),
    GUARD_CASES,
    ids=[f"d{head_dim}-{'causal' if causal else 'full'}-{config}" for head_dim, causal, config in GUARD_CASES],
)
def test_a_launch_writes_only_out_and_lse(head_dim, causal, config):
    sm_count = GUARD_GRID if config.persistent else None
    assert_writes_only_out_and_lse(lambda q: kernel_for(q, causal, config, sm_count), head_dim, causal, config)


@pytest.mark.smoke
@pytest.mark.parametrize("build", SWEEP_BUILDS, ids=build_id)
def test_sweep_builds_write_only_out_and_lse(build):
    # The boundary sweep's kernels, at no extra compile: the smoke tier (and so each mutant's
    # first tiers) sees a store past out or lse, and the persistent ones, on the sweep's grid of
    # SWEEP_GRID thread blocks, run a partial last round on the second shape's 9 work tiles.
    kernel = compiled_forward(**build, arch=device_arch())
    assert_writes_only_out_and_lse(lambda q: kernel, build["head_dim"], build["causal"], build["config"])
