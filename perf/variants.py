"""Alternative builds of the FlashAttention-2 forward kernel, for measurement on the H200.

Every builder here returns a TileLang PrimFunc with exactly the launch signature and the
semantics of the shipped `fa_kernel.kernel.forward_program`:

    kernel(Q [B, Sq, H, D], K [B, Sk, Hkv, D], V [B, Sk, Hkv, D],
           Output [B, Sq, H, D], LSE [B, H, Sq] fp32, scale_log2)

batch, both sequence lengths and both head counts symbolic (`T.dynamic`), GQA by head
groups, bottom-right causal alignment (query i sees key j iff j <= i + Sk - Sq), output 0
and LSE -inf for a row that sees no key, at least one K/V tile processed per block.

Variants (see VARIANTS at the bottom; `build(name, ...)` dispatches):

  shipped              the kernel as shipped (imported, not copied): FA3's schedule with a
                       hand-written producer warpgroup (TMA + mbarriers), P.V of tile j-1
                       overlapping the softmax of tile j, ping-pong between two consumer
                       warpgroups, masks only where needed, causal heaviest-first.
  fa2_auto_ws          the kernel shipped before it: FA2 Algorithm 1 as the TileLang example
                       writes it (T.Pipelined; TileLang warp-specialises it by itself), the
                       mask written into every tile.
  masked_tail          fa2_auto_ws, the mask written only into tiles that need one; every
                       other tile's Q.K^T GEMM starts from a zero accumulator (wgmma scale-d 0).
  sw_pipeline          fa2_auto_ws under T.Pipelined(order=..., stage=...): the QK GEMM of
                       tile k+1 scheduled before the softmax / P.V of tile k.
                       NOTE: in TileLang 0.1.15 a manual order/stage disables the auto
                       warp specialisation (it needs num_stages, and with num_stages the
                       WS pass strips order/stage), so this is a 256-thread cp.async
                       software pipeline with blocking GEMMs. MEASURED INCORRECT on the
                       H200 (fails judge on 257x300 / 1000x1000) and 20-90% slower: kept
                       only as evidence; see KNOWN_INCORRECT.

Patched builds of the shipped kernel (kernel.py's text with literal replacements, loaded as
a module of their own; a patch that no longer applies raises). Levers, correct:

  pinned               a store of the running row sum into LSE (overwritten at the end) just
                       before the P.V wait: ptxas moves that wait above the softmax to start
                       P's down-cast early (the softmax then runs after P.V, not under it),
                       and does not move it above a store. Measured slower (PERF.md).
  skip_rescale         acc_o *= alpha only in threads where some row has alpha != 1 (exact).
                       Within noise of shipped.
  lazy_rescale         skip_rescale, and the running max moves only when a tile's max
                       exceeds it by more than 8 in log2 units (FlashAttention-4), so alpha
                       is 1 after the first tiles almost always. 0-4% slower.
  wait_both            one wait for S_j and P_{j-1}.V_{j-1} together, so no softmax work runs
                       under this warpgroup's own P.V (what ptxas does at d128 anyway, taken
                       to the max reduction and to d64). 0-4% slower.
  wait_both_lazy_rescale  both. 1-6% slower.

Leave-one-out diagnostics, timing only (wrong results by design, in KNOWN_INCORRECT): what
the kernel would gain if a piece of the softmax cost nothing.

  gemm_only            no softmax in the loop: loads, both GEMMs, rescale, down-cast, syncs.
  no_exp               the exp2 of every score left out (the MUFU work).
  no_max               the row-max reduction of every tile left out.

The hand-written warp-specialised variants measured before the shipped kernel took their
schedule (ws_explicit, overlap, overlap_masked_tail, overlap_pingpong) are in git history
(perf/variants.py before the commit that moved overlap_pingpong into kernel.py); PERF.md
has their numbers. `config.threads` counts consumer threads for every variant (TileLang or
the shipped kernel adds the 128-thread producer warpgroup), so a TileConfig means the same
launch everywhere.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path

import tilelang
import tilelang.language as T

from fa_kernel import kernel as shipped_kernel
from fa_kernel.configs import TileConfig
from fa_kernel.kernel import DTYPES, LN2, PASS_CONFIGS, forward_program

# --------------------------------------------------------------------------------------
# Auto warp-specialised family (the shipped structure)
# --------------------------------------------------------------------------------------


def _auto_ws_program(
    *, head_dim: int, causal: bool, dtype: str, config: TileConfig, masked_tail: bool, sw_pipeline: bool
):
    """The shipped kernel, optionally with the mask only where needed / a manual pipeline."""
    batch, seqlen_q, seqlen_k, heads, heads_kv = T.dynamic("batch, seqlen_q, seqlen_k, heads, heads_kv")
    block_m, block_n = config.block_m, config.block_n
    dtype = DTYPES[dtype]
    accum = T.float32
    neg_inf = -T.infinity(accum)
    if sw_pipeline:
        # 13 scheduled statements (kv_start is a replayable Bind): 0 copy K, 1 mask,
        # 2 QK gemm, 3 copy row_max, 4 reduce_max, 5 alpha, 6 exp2, 7 reduce_sum,
        # 8 row_sum, 9 cast P, 10 rescale O, 11 copy V, 12 PV gemm.
        # Body of iteration k: K copy/mask/QK of tile k+1 (stage 0), rescale/V copy/PV of
        # tile k (stage 1), then the softmax of tile k+1 (stage 0).
        pipeline = dict(order=[0, 1, 2, 6, 7, 8, 9, 10, 11, 12, 3, 4, 5], stage=[0] * 10 + [1] * 3)
    else:
        pipeline = dict(num_stages=config.num_stages)

    @T.prim_func
    def flash_attention_forward(
        Q: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        K: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        V: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        Output: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        LSE: T.Tensor([batch, heads, seqlen_q], accum),
        scale_log2: T.float32,
    ):
        with T.Kernel(T.ceildiv(seqlen_q, block_m), heads, batch, threads=config.threads) as (q_block, head, b):
            Q_shared = T.alloc_shared([block_m, head_dim], dtype)
            K_shared = T.alloc_shared([block_n, head_dim], dtype)
            V_shared = T.alloc_shared([block_n, head_dim], dtype)
            O_shared = T.alloc_shared([block_m, head_dim], dtype)
            acc_s = T.alloc_fragment([block_m, block_n], accum)
            acc_p = T.alloc_fragment([block_m, block_n], dtype)
            acc_o = T.alloc_fragment([block_m, head_dim], accum)
            row_max = T.alloc_fragment([block_m], accum)
            row_max_prev = T.alloc_fragment([block_m], accum)
            row_max_scaled = T.alloc_fragment([block_m], accum)
            alpha = T.alloc_fragment([block_m], accum)
            tile_sum = T.alloc_fragment([block_m], accum)
            row_sum = T.alloc_fragment([block_m], accum)

            kv_head = head // (heads // heads_kv)
            diagonal_offset = seqlen_k - seqlen_q
            q_start = q_block * block_m

            T.copy(Q[b, q_start : q_start + block_m, head, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(row_sum, 0)
            T.fill(row_max, neg_inf)

            num_kv_blocks = T.ceildiv(seqlen_k, block_n)
            if causal:
                last_visible = q_start + block_m + diagonal_offset
                num_kv_blocks = T.max(1, T.min(num_kv_blocks, T.ceildiv(last_visible, block_n)))

            for kv_block in T.Pipelined(num_kv_blocks, **pipeline):
                kv_start = kv_block * block_n
                T.copy(K[b, kv_start : kv_start + block_n, kv_head, :], K_shared)
                if masked_tail:
                    # A tile needs the mask iff it holds a key past seqlen_k or (causal) a key
                    # right of the diagonal for the block's first row; the others start the
                    # GEMM from zero (clear_accum: the wgmma ignores the accumulator input).
                    if _tile_needs_mask(causal, kv_start, block_n, q_start, diagonal_offset, seqlen_k):
                        for i, j in T.Parallel(block_m, block_n):
                            acc_s[i, j] = _mask_value(
                                causal, kv_start + j, q_start + i, diagonal_offset, seqlen_k, neg_inf
                            )
                        T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    else:
                        T.gemm(
                            Q_shared,
                            K_shared,
                            acc_s,
                            transpose_B=True,
                            policy=T.GemmWarpPolicy.FullRow,
                            clear_accum=True,
                        )
                else:
                    for i, j in T.Parallel(block_m, block_n):
                        acc_s[i, j] = _mask_value(causal, kv_start + j, q_start + i, diagonal_offset, seqlen_k, neg_inf)
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                T.copy(row_max, row_max_prev)
                T.reduce_max(acc_s, row_max, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    row_max_scaled[i] = T.if_then_else(row_max[i] == neg_inf, 0, row_max[i] * scale_log2)
                    alpha[i] = T.exp2(row_max_prev[i] * scale_log2 - row_max_scaled[i])
                for i, j in T.Parallel(block_m, block_n):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - row_max_scaled[i])
                T.reduce_sum(acc_s, tile_sum, dim=1)
                for i in T.Parallel(block_m):
                    row_sum[i] = row_sum[i] * alpha[i] + tile_sum[i]
                T.copy(acc_s, acc_p)

                for i, d in T.Parallel(block_m, head_dim):
                    acc_o[i, d] *= alpha[i]
                T.copy(V[b, kv_start : kv_start + block_n, kv_head, :], V_shared)
                T.gemm(acc_p, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i, d in T.Parallel(block_m, head_dim):
                acc_o[i, d] = T.if_then_else(row_sum[i] > 0, acc_o[i, d] / row_sum[i], 0)
            for i in T.Parallel(block_m):
                if q_start + i < seqlen_q:
                    LSE[b, head, q_start + i] = T.if_then_else(
                        row_sum[i] > 0, (row_max_scaled[i] + T.log2(row_sum[i])) * LN2, neg_inf
                    )
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[b, q_start : q_start + block_m, head, :])

    return flash_attention_forward


def _mask_value(causal, key, query, diagonal_offset, seqlen_k, neg_inf):
    """-inf where query may not see key, else 0 (the shipped kernel's mask expression)."""
    if causal:
        return T.if_then_else(T.Or(key > query + diagonal_offset, key >= seqlen_k), neg_inf, 0)
    return T.if_then_else(key >= seqlen_k, neg_inf, 0)


def _tile_needs_mask(causal, kv_start, block_n, q_start, diagonal_offset, seqlen_k):
    """Does the K/V tile starting at kv_start hold any key that some row of the block
    starting at q_start may not see? Uniform over the block (no divergence)."""
    past_end = kv_start + block_n > seqlen_k
    if causal:
        # Row q_start sees keys <= q_start + offset; later rows see more.
        return T.Or(past_end, kv_start + block_n - 1 > q_start + diagonal_offset)
    return past_end


# --------------------------------------------------------------------------------------
# Patched builds of the shipped kernel
# --------------------------------------------------------------------------------------

# The P.V wait of the steady-state loop, and the statements the patches below replace.
_PV_WAIT = "                    T.wait_wgmma(0)  # P~_{j-1}.V_{j-1} is done: acc_p may be overwritten"
_K_RELEASE = "                    T.mbarrier_arrive(k_empty[stage])"  # the loop's (tile 0 releases k_empty[0])
_SOFTMAX = "online_softmax(acc_s, row_max, row_max_prev, row_max_scaled, alpha, tile_sum, row_sum, scale_log2)"
_LOOP_SOFTMAX = _K_RELEASE + "\n" + " " * 20 + _SOFTMAX
_EXP = "acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - row_max_scaled[i])"
_MAX = """        T.copy(row_max, row_max_prev)
        T.reduce_max(acc_s, row_max, dim=1, clear=False)"""
_RESCALE = """        for i, d in T.Parallel(block_m, head_dim):
            acc_o[i, d] *= alpha[i]"""
_RESCALE_SKIPPED_WHERE_ALPHA_IS_1 = """        max_grew = T.alloc_local([1], T.int32)
        max_grew[0] = 0
        for i in T.Parallel(block_m):
            if alpha[i] != 1:
                max_grew[0] = 1
        if max_grew[0] != 0:
            for i, d in T.Parallel(block_m, head_dim):
                acc_o[i, d] *= alpha[i]"""
_S_WAIT = "T.wait_wgmma(1)  # S_j is ready; P~_{j-1}.V_{j-1} may still be running"
_BOTH_WAIT = "T.wait_wgmma(0)  # S_j and P~_{j-1}.V_{j-1} both done"
_NEW_MAX_SCALED = "            row_max_scaled[i] = T.if_then_else(row_max[i] == neg_inf, 0, row_max[i] * scale_log2)"
# FlashAttention-4's conditional rescale: the running max moves only when the tile's max
# exceeds it by more than 8 in log2 units, so P~ <= 2^8 (exact in fp16/bf16, and fp32 sums).
# A row whose max stays keeps alpha == 1 and its acc_o is not multiplied. NaN from
# -inf - -inf (a row with no key yet) compares false: the max stays -inf.
_STALE_MAX = (
    "            row_max[i] = T.if_then_else(\n"
    "                (row_max[i] - row_max_prev[i]) * scale_log2 > 8, row_max[i], row_max_prev[i]\n"
    "            )\n"
)

PATCHES: dict[str, tuple[tuple[str, str], ...]] = {
    "pinned": (
        (
            _PV_WAIT,
            """                    for i in T.Parallel(block_m):
                        if q_start + i < seqlen_q:
                            LSE[b, head, q_start + i] = row_sum[i]
"""
            + _PV_WAIT,
        ),
    ),
    "skip_rescale": ((_RESCALE, _RESCALE_SKIPPED_WHERE_ALPHA_IS_1),),
    "wait_both": ((_S_WAIT, _BOTH_WAIT),),
    "lazy_rescale": ((_RESCALE, _RESCALE_SKIPPED_WHERE_ALPHA_IS_1), (_NEW_MAX_SCALED, _STALE_MAX + _NEW_MAX_SCALED)),
    "gemm_only": ((_LOOP_SOFTMAX, _K_RELEASE),),
    "no_exp": ((_EXP, "acc_s[i, j] = acc_s[i, j] * scale_log2 - row_max_scaled[i]"),),
    "no_max": ((_MAX, "        T.copy(row_max, row_max_prev)"),),
}
PATCHES["wait_both_lazy_rescale"] = PATCHES["wait_both"] + PATCHES["lazy_rescale"]


@functools.cache
def _patched_kernel_module(name: str):
    """kernel.py with PATCHES[name] applied, imported from a file (TileLang reads the source)."""
    source = Path(shipped_kernel.__file__).read_text()
    for old, new in PATCHES[name]:
        if source.count(old) != 1:
            raise ValueError(f"variant {name}: patch text found {source.count(old)} times in kernel.py, not once")
        source = source.replace(old, new)
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / "fa_kernel_variants" / f"kernel_{name}_{digest}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"fa_kernel_variant_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _patched_program(name: str, **kwargs):
    return _patched_kernel_module(name).forward_program(**kwargs)


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------

Builder = Callable[..., object]

VARIANTS: dict[str, Builder] = {
    "shipped": forward_program,
    "fa2_auto_ws": functools.partial(_auto_ws_program, masked_tail=False, sw_pipeline=False),
    "masked_tail": functools.partial(_auto_ws_program, masked_tail=True, sw_pipeline=False),
    "sw_pipeline": functools.partial(_auto_ws_program, masked_tail=False, sw_pipeline=True),
    **{name: functools.partial(_patched_program, name) for name in PATCHES},
}


# Measured on the H200 (perf/results/): sw_pipeline fails fa_kernel.reference.judge on the
# odd shapes (and is slower); the leave-one-out diagnostics are wrong by design. The sweep
# leaves these out unless named.
KNOWN_INCORRECT = frozenset({"sw_pipeline", "gemm_only", "no_exp", "no_max"})


def build(name: str, head_dim: int, causal: bool, dtype: str, config: TileConfig):
    """The PrimFunc of variant `name` (dtype "float16" or "bfloat16")."""
    return VARIANTS[name](head_dim=head_dim, causal=causal, dtype=dtype, config=config)


def compile_variant(name: str, head_dim: int, causal: bool, dtype: str, config: TileConfig, arch: str | None = None):
    """tilelang.compile of a variant with the shipped pass configs; arch None = this GPU."""
    target = "auto" if arch is None else {"kind": "cuda", "arch": arch}
    return tilelang.compile(build(name, head_dim, causal, dtype, config), target=target, pass_configs=PASS_CONFIGS)
