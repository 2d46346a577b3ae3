"""The parts the two gradient programs, dK/dV (backward.py) and fixed-order dQ (backward_dq.py), share."""

import functools

import tilelang.language as T

from fa_kernel.backward_preprocess import PREPROCESS_ROWS
from fa_kernel.mask import Visibility
from fa_kernel.toolchain import FAST_MATH, compile_program

# Rows of one wgmma (its M): a warpgroup's share of a GEMM's rows is a multiple of it.
WGMMA_ROWS = 64
# setmaxnreg budgets of the dK/dV kernel's producer and consumer warpgroups (TileLang's default
# for one producer and two consumers: 128·24 + 256·240 registers fill the SM's 64K).
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 24, 240
# The consumer warpgroups' named barrier where a dK/dV kernel places its own (backward.syncs_by_hand);
# TileLang's planner numbers its own from 3, and places none in such a build.
CONSUMERS_BARRIER = 6


def ragged_parameters(varlen: bool) -> tuple:
    """(ragged_tiles, cu_seqlens_q, cu_seqlens_k, tile_order): a ragged launch's tile count (its
    grid's first dimension) and the annotations of its int32 parameters, None in a batched launch
    (two annotations for the two cu_seqlens: two buffers)."""
    ragged_tiles, cu_len = T.dynamic("ragged_tiles, cu_len")
    if not varlen:
        return ragged_tiles, None, None, None
    return ragged_tiles, T.Tensor([cu_len], T.int32), T.Tensor([cu_len], T.int32), T.Tensor([ragged_tiles, 2], T.int32)


def tile_needs_mask(visibility: Visibility, kv_start, q_start, block_n: int, block_m: int):
    """Whether the tile holds a (key, row) pair the rule hides, rows past seqlen_q included: every
    other tile takes P = exp2(...) without the select (the select at every element of every tile
    cost the causal gradient a third of its time: docs/performance.md)."""
    needs_mask = visibility.tile_needs_mask(kv_start, block_n, q_start, block_m, rows_checked=True)
    # As an int: on the bool, TileLang 0.1.15's thread sync fails to lower some non-causal
    # builds (head_dim 64 on 128-row tiles: "a shared-memory sync inside a divergent region").
    return T.if_then_else(needs_mask, 1, 0) == 1


def gradient_sizes(block_m: int):
    """The sizes the gradient kernels take at launch (T.dynamic), once block_m is checked against
    Delta's padding, whose rows a query tile's TMA box must not leave."""
    if PREPROCESS_ROWS % block_m:
        raise ValueError(f"block_m: expected a divisor of {PREPROCESS_ROWS} (Delta's padding), got {block_m}")
    return T.dynamic("batch, seqlen_q, seqlen_q_padded, seqlen_k, heads, heads_kv")


def compiled_at_tiles(program, tiles: dict, pass_configs=lambda **_build: FAST_MATH):
    """`program` compiled at its head dim's tile of `tiles` ((block_m, block_n, stages) by head
    dim) with `pass_configs(**build)`, cached as the forward is: a function of head_dim, arch and
    the program's options (an A/B variant's among them may set the tile's own: perf/backward_ab.py)."""

    @functools.cache
    def compiled(*, head_dim: int, arch: str | None = None, **options):
        block_m, block_n, stages = tiles[head_dim]
        build = dict(block_m=block_m, block_n=block_n, num_stages=stages) | options
        return compile_program(program(head_dim=head_dim, **build), arch, pass_configs(**build))

    return compiled


def probabilities_and_ds(*, block_m: int, block_n: int, threads: int):
    """The dK/dV step's P and dS without a softcap, as a macro (both dK/dV kernels'): Pᵀ =
    2^(Sᵀ·scale_log2 − LSE₂) once Sᵀ's GEMM is done (the select where the tile needs one), cast
    while dPᵀ's runs; then dSᵀ = Pᵀ∘(dPᵀ − D), before dV's GEMM: the fp32 Sᵀ and dPᵀ are then
    dead while dV and dK run (in the other order ptxas serialises every wgmma at head_dim 64:
    C7512, with spills, docs/performance.md). q_start a register (T.Ref: its uses load it, as the
    kernel's own do)."""

    @T.macro
    def probabilities_and_ds(rule, acc_s, acc_dp, p_cast, ds_cast, kv_start, q_start: T.Ref, lse, delta, scale_log2):
        T.wait_wgmma(1)
        T.warpgroup_fence_operand(acc_s, num_regs=block_n * block_m // threads)
        if tile_needs_mask(rule, kv_start, q_start, block_n, block_m):
            for i, j in T.Parallel(block_n, block_m):
                visible = rule.sees(kv_start + i, q_start + j, rows_checked=True)
                acc_s[i, j] = T.if_then_else(visible, T.exp2(acc_s[i, j] * scale_log2 - lse[j]), 0)
        else:
            for i, j in T.Parallel(block_n, block_m):
                acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - lse[j])
        T.copy(acc_s, p_cast)
        T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_dp, num_regs=block_n * block_m // threads)
        for i, j in T.Parallel(block_n, block_m):
            ds_cast[i, j] = acc_s[i, j] * (acc_dp[i, j] - delta[j])

    return probabilities_and_ds
