# mypy: disable-error-code="valid-type,index,operator"
# (T.Tensor annotations are TileLang's signature; an option's values are None without it.)
"""The dK/dV kernel with dQ's reduce-adds issued by a warp of their own (an A/B build:
`backward_program(dq_writer=True)`, perf/backward_ab.py's `dq_writer`).

The shipped kernel leaves its warp specialisation to T.Pipelined: a producer warpgroup for the
loads, and the consumer warpgroups' elected thread issuing each step's bulk reduce-add of dQ,
which holds its warp, and with it its warpgroup's next GEMMs, while it computes the address,
fences and issues. FlashAttention-3 gives that work a warp of its own. TileLang's typed
warp-specialisation schedule (`T.WSSchedule`, materialised before layout inference) names the
roles here, each a warp range with its register budget, and the pipelines between them:

    MMA     warps 0-7   the step's GEMMs, P and dS, dQᵀ's image written into dQ_shared
    TMA     warp 8      K and V once; Q, dO, LSE₂ and D of each query tile into a ring
    Writer  warp 9      each image bulk-added into dQ_accum, its read waited for, the slot freed

    kv  K, V                 TMA -> MMA, once a block
    q   Q, dO, LSE₂, D       TMA -> MMA, `num_stages` deep
    dq  dQ_shared            MMA -> Writer, `dq_slots` deep

The step's math and GEMM order are the shipped kernel's own where it places its syncs by hand
(dS before dV's GEMM, dQᵀ = Kᵀ·dSᵀ issued before dK's, which stays in flight under dQ's
staging), and so are the MMA role's syncs (compiled without TileLang's planner): dS in two
slots takes one consumer sync a step, in one two. `ordered_dq` adds dQ in a fixed order, its
waits in the writer warp (writer_program). Batched launches without the variants (plain and
causal), head_dim 64 and 128; the shipped kernel's launch signature (`ordered_dq`: the turns
after it). tools/codegen_orders.writer_handoff_gaps checks the orderings the kernel places.
"""

import tilelang.language as T

from fa_kernel.backward_preprocess import dq_row
from fa_kernel.gradient_parts import (
    CONSUMER_REGISTERS,
    CONSUMERS_BARRIER,
    PRODUCER_REGISTERS,
    gradient_sizes,
    probabilities_and_ds,
)
from fa_kernel.mask import variant_visibility
from fa_kernel.scheduler import heavy_first_block
from fa_kernel.toolchain import DTYPES
from fa_kernel.variants import PLAIN, kernel_parameter

MMA_THREADS = 256
# ordered_dq's polls of a turn, far more than any wait takes (a turn a step old, microseconds),
# and few enough that a turn never passed ends the wait in seconds with a wrong dQ, not a hang:
# the schedule gives a `while` no role, so the wait is a bounded loop left by a break.
SPIN_LIMIT = 1 << 24


def first_query_tile(visibility, kv_start, block_m: int):
    """The first query tile a K/V tile's walk visits: under a right edge (causal), the rows before
    the first that sees its first key add nothing; else the first."""
    return T.max(visibility.first_row(kv_start), 0) // block_m if visibility.limits_right else 0


def walk_turn(visibility, tile, kv_block, block_m: int, block_n: int):
    """ordered_dq on the plain walk: the K/V tile's place among those whose walks reach query tile
    `tile`, the last first (under a right edge, the last that sees its last row)."""
    key_tiles = T.ceildiv(visibility.seqlen_k, block_n)
    last_key = visibility.last_key((tile + 1) * block_m - 1) if visibility.limits_right else visibility.seqlen_k - 1
    return T.min(key_tiles, T.ceildiv(last_key + 1, block_n)) - 1 - kv_block


def shifted_turn(tile, kv_block, key_tiles, q_tiles):
    """ordered_dq on the shifted walk (K/V tile n walks the Q query tiles from tile n on,
    cyclically; no more K/V tiles than query tiles): how many blocks reach query tile `tile` before
    K/V tile `kv_block`, which does d = (tile - kv_block) mod Q steps in: the blocks of the range
    tile - d + 1 ... tile (wrapping below 0 where that start is negative). Expressions or ints."""
    start = tile - T.truncmod(tile - kv_block + q_tiles, q_tiles) + 1
    within = T.min(tile, key_tiles - 1) + 1
    wrapped = within + T.max(0, key_tiles - (start + q_tiles))
    return T.if_then_else(start >= 0, T.max(0, within - start), wrapped)


def roles_schedule(buffers: dict, num_stages: int, dq_slots: int):
    """The kernel's T.WSSchedule over its buffers (by name) and ops (by T.WSID)."""
    sync = T.WSSync
    loads, kv_loads = ["load_q", "load_do", "load_lse", "load_delta"], ["load_k", "load_v"]
    step = [
        sync.consumer_wait("q"), "scores", "probabilities", "dv_gemm", "store_ds", "dq_gemm", "dk_gemm",
        "wait_dv_dq", sync.producer_acquire("dq"), "stage_dq", sync.producer_commit("dq"), "wait_dk",
        sync.consumer_release("q"),
    ]  # fmt: skip
    return T.WSSchedule(
        num_warps=12,
        roles=[
            T.WSRole("MMA", warps_lo=0, warps_hi=8, max_nreg=CONSUMER_REGISTERS),
            T.WSRole("TMA", warps_lo=8, warps_hi=9, max_nreg=PRODUCER_REGISTERS),
            T.WSRole("Writer", warps_lo=9, warps_hi=10, max_nreg=PRODUCER_REGISTERS),
        ],
        pipelines=[
            T.WSPipeline("kv", [buffers["K"], buffers["V"]], depth=1),
            T.WSPipeline("q", [buffers[name] for name in ("Q", "dO", "lse", "delta")], depth=num_stages),
            T.WSPipeline("dq", [buffers["dQ"]], depth=dq_slots),
        ],
        scopes=[
            T.WSScope(
                "walk",
                {
                    "TMA": ["step_tile", sync.producer_acquire("q"), *loads, sync.producer_commit("q")],
                    "MMA": ["step_tile", *step],
                    "Writer": ["step_tile", sync.consumer_wait("dq"), "add_dq", sync.consumer_release("dq")],
                },
            ),
            T.WSScope(
                T.WSScope.ROOT,
                {
                    "TMA": ["block", sync.producer_acquire("kv"), *kv_loads, sync.producer_commit("kv"), "walk"],
                    "MMA": [
                        "block",
                        sync.consumer_wait("kv"),
                        "start_sums",
                        "walk",
                        "store_dk_dv",
                        sync.consumer_release("kv"),
                    ],  # fmt: skip
                    "Writer": ["block", "walk"],
                },
            ),
        ],
    )


def writer_program(
    *,
    head_dim: int,
    causal: bool,
    dtype: str,
    block_m: int,
    block_n: int,
    num_stages: int = 2,
    heavy_first: bool = False,
    ordered_dq: bool = False,
    shifted_walk: bool = False,
):
    """The dK/dV kernel adding dQ through a writer warp, as a TileLang PrimFunc: the arguments and
    results of `backward_program`'s batched build without the variants.

    `ordered_dq`: dQ's adds in a fixed order, so that dQ_accum is the same to the bit on every
    run (FlashAttention-3's deterministic mode, its waits in the writer warp, off the MMA path):
    a query tile's adds go from the last K/V tile that sees it down to the first, each waiting
    on an int32 turn [B, H, query tiles] (a launch parameter after the others, zeroed by the
    caller) that the add before passes once written. The blocks go last K/V tile first, so a
    block waits only on blocks dispatched before it; under a right edge K/V tile n reaches a
    query tile a step after tile n + 1 did. Two dQ slots, so the MMA warps run on while the
    writer waits (and dS in one slot, for the room: two consumer syncs a step).

    `shifted_walk` (with ordered_dq; under causal the plain walk already reaches a query tile a
    step later from each K/V tile down, and it is kept): without causal, K/V tile n walks its
    head's Q query tiles from tile n on, cyclically, so that at each step the blocks add into
    different query tiles and each turn waits on an add a step old, where in the plain walk they
    all add into the same tile, a chain of waits. The turns then count the blocks that reach a
    tile at an earlier step. A launch with more K/V tiles than query tiles (two blocks would reach
    a tile at the same step) takes the plain walk; a launch must keep a (batch, K/V head)'s blocks
    on the SMs at once (a block may wait on one dispatched after it)."""
    if block_n != 2 * 64 or head_dim not in (64, 128):
        raise ValueError(f"dq_writer: expected head_dim 64 or 128 on 128 keys, got {head_dim}, {block_n}")
    if ordered_dq and heavy_first:
        raise ValueError("ordered_dq: expected the last K/V tile first (heavy_first=False)")
    if shifted_walk and not ordered_dq:
        raise ValueError("shifted_walk: expected ordered_dq")
    shifted_walk = shifted_walk and not causal
    # dQ's slots and dS's (two of each would not fit beside K, V and two stages of Q and dO).
    dq_slots, ds_slots = (2, 1) if ordered_dq else (1, 2)
    batch, seqlen_q, seqlen_q_padded, seqlen_k, heads, heads_kv = gradient_sizes(block_m)
    visibility, window_left, window_right, softcap_log2 = variant_visibility(seqlen_q, seqlen_k, causal, PLAIN)
    dtype = DTYPES[dtype]
    accum = T.float32
    pairs_per_group = T.dynamic("pairs_per_group")
    DQ_ROW = dq_row(head_dim)
    kv_regs, dq_regs = block_n * head_dim // MMA_THREADS, block_m * head_dim // MMA_THREADS
    probabilities = probabilities_and_ds(block_m=block_m, block_n=block_n, threads=MMA_THREADS)

    def shifts(q_tiles):
        """Whether the launch walks shifted: asked for, and no more K/V tiles than query tiles."""
        return shifted_walk and T.ceildiv(seqlen_k, block_n) <= q_tiles

    def turn_at(tile, kv_block):
        """ordered_dq: the K/V tile's place among those that add into query tile `tile`."""
        plain = walk_turn(visibility, tile, kv_block, block_m, block_n)
        if not shifted_walk:
            return plain
        q_tiles = T.ceildiv(seqlen_q, block_m)
        shifted = shifted_turn(tile, kv_block, T.ceildiv(seqlen_k, block_n), q_tiles)
        return T.if_then_else(shifts(q_tiles), shifted, plain)

    @T.macro
    def take_turn(turns, b, head, q_start, kv_block, turn: T.Ref):
        """ordered_dq: wait for the K/V tile's turn at the query tile from q_start (turn_at; `turn`
        a register, set once before the polls)."""
        turn = turn_at(q_start // block_m, kv_block)
        for _ in T.serial(SPIN_LIMIT):
            if T.atomic_load(turns[b, head, q_start // block_m], memory_order="acquire") == turn:
                T.loop_break()

    @T.macro
    def add_image(dQ_shared, dQ_accum, turns, b, head, q_start, kv_block, turn: T.Ref):
        """The writer's step: one bulk reduce-add of dQ's image into dQ_accum's rows from q_start,
        its read waited for; ordered, after the K/V tile's turn, and written before passing it."""
        if T.shuffle_elect(32):
            if ordered_dq:
                take_turn(turns, b, head, q_start, kv_block, turn)
            T.call_extern(
                "handle", "tl::tma_store_add", T.address_of(dQ_shared[0, 0]),
                T.address_of(dQ_accum[b, head, q_start, 0]), block_m * DQ_ROW * 4,
            )  # fmt: skip
            T.tma_store_arrive()
            if ordered_dq:  # the add written, not only read, before the turn passes
                T.tma_store_wait(0, read=False)
                T.call_extern("handle", "__threadfence")
                T.atomic_add(turns[b, head, q_start // block_m], 1, memory_order="release")
            else:
                T.tma_store_wait(0)

    @T.prim_func
    def flash_attention_backward(
        Q: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        K: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        V: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        dO: T.Tensor([batch, seqlen_q, heads, head_dim], dtype),
        Delta: T.Tensor([batch, heads, seqlen_q_padded], accum),
        LSE_log2: T.Tensor([batch, heads, seqlen_q_padded], accum),
        dQ_accum: T.Tensor([batch, heads, seqlen_q_padded, DQ_ROW], accum),
        dK: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        dV: T.Tensor([batch, seqlen_k, heads_kv, head_dim], dtype),
        scale_log2: T.float32,
        softmax_scale: T.float32,
        window_left: window_left,
        window_right: window_right,
        softcap_log2: softcap_log2,
        PairsPerGroup: kernel_parameter(pairs_per_group, heavy_first),
        DqTurns: kernel_parameter(T.Tensor([batch, heads, T.dynamic("q_tiles")], T.int32), ordered_dq),
    ):
        key_tiles = T.ceildiv(seqlen_k, block_n)
        grid = (key_tiles * heads_kv * batch, 1, 1) if heavy_first else (key_tiles, heads_kv, batch)
        with T.Kernel(*grid, threads=MMA_THREADS + 128) as (block_x, block_y, block_z):
            K_shared = T.alloc_shared([block_n, head_dim], dtype)
            V_shared = T.alloc_shared([block_n, head_dim], dtype)
            Q_shared = T.alloc_shared([block_m, head_dim], dtype)
            dO_shared = T.alloc_shared([block_m, head_dim], dtype)
            lse = T.alloc_shared([block_m], accum)
            delta = T.alloc_shared([block_m], accum)
            # dS in `ds_slots` whole buffers (a region of one would be stored element by element,
            # not by stmatrix): two take turns by the step's parity.
            dS_even = T.alloc_shared([block_n, block_m], dtype)
            dS_odd = T.alloc_shared([block_n, block_m], dtype) if ds_slots == 2 else None
            dQ_shared = T.alloc_shared([block_m, DQ_ROW], accum)
            acc_s = T.alloc_fragment([block_n, block_m], accum)  # Sᵀ, then Pᵀ
            acc_dp = T.alloc_fragment([block_n, block_m], accum)  # dPᵀ
            p_cast = T.alloc_fragment([block_n, block_m], dtype)
            ds_cast = T.alloc_fragment([block_n, block_m], dtype)
            acc_dk = T.alloc_fragment([block_n, head_dim], accum)
            acc_dv = T.alloc_fragment([block_n, head_dim], accum)
            acc_dq = T.alloc_fragment([head_dim, block_m], accum)  # dQᵀ
            # The block's and the step's indices, each role's own copy (a name bound to an
            # expression would be a statement the schedule cannot place).
            kv_block, kv_head, b = T.alloc_var(T.int32), T.alloc_var(T.int32), T.alloc_var(T.int32)
            kv_start, first_q_block, q_blocks = T.alloc_var(T.int32), T.alloc_var(T.int32), T.alloc_var(T.int32)
            head, q_start, turn = T.alloc_var(T.int32), T.alloc_var(T.int32), T.alloc_var(T.int32)
            buffers = dict(K=K_shared, V=V_shared, Q=Q_shared, dO=dO_shared, lse=lse, delta=delta, dQ=dQ_shared)
            T.annotate_ws_schedule(roles_schedule(buffers, num_stages, dq_slots))

            with T.ws_op("block"):
                if heavy_first:
                    kv_block, kv_head, b = heavy_first_block(block_x, key_tiles, heads_kv, batch, PairsPerGroup)
                elif ordered_dq:  # the last K/V tile first: a block waits only on blocks dispatched before it
                    kv_block, kv_head, b = key_tiles - 1 - block_x, block_y, block_z
                else:
                    kv_block, kv_head, b = block_x, block_y, block_z
                kv_start = kv_block * block_n
                first_q_block = first_query_tile(visibility, kv_start, block_m)
                q_blocks = T.max(T.ceildiv(seqlen_q, block_m) - first_q_block, 0)
            T.copy(K[b, kv_start : kv_start + block_n, kv_head, :], K_shared, annotations={T.WSID: "load_k"})
            T.copy(V[b, kv_start : kv_start + block_n, kv_head, :], V_shared, annotations={T.WSID: "load_v"})
            with T.ws_op("start_sums"):
                T.clear(acc_dk)
                T.clear(acc_dv)
            for step in T.serial(heads // heads_kv * q_blocks, annotations={T.WSID: "walk"}):
                with T.ws_op("step_tile"):
                    head = kv_head * (heads // heads_kv) + step // q_blocks
                    if shifted_walk:  # from the block's own K/V tile on, cyclically, where it shifts
                        shift = T.if_then_else(shifts(q_blocks), kv_block, 0)
                        q_start = T.truncmod(step % q_blocks + shift, q_blocks) * block_m
                    else:
                        q_start = (first_q_block + step % q_blocks) * block_m
                T.copy(Q[b, q_start : q_start + block_m, head, :], Q_shared, annotations={T.WSID: "load_q"})
                T.copy(dO[b, q_start : q_start + block_m, head, :], dO_shared, annotations={T.WSID: "load_do"})
                T.copy(LSE_log2[b, head, q_start : q_start + block_m], lse, annotations={T.WSID: "load_lse"})
                T.copy(Delta[b, head, q_start : q_start + block_m], delta, annotations={T.WSID: "load_delta"})
                with T.ws_op("scores"):  # Sᵀ and dPᵀ issued together: Pᵀ is computed while dPᵀ runs
                    T.wgmma_gemm(K_shared, Q_shared, acc_s, transpose_B=True, clear_accum=True,
                                 policy=T.GemmWarpPolicy.FullRow)  # fmt: skip
                    T.wgmma_gemm(V_shared, dO_shared, acc_dp, transpose_B=True, clear_accum=True,
                                 policy=T.GemmWarpPolicy.FullRow)  # fmt: skip
                with T.ws_op("probabilities"):
                    probabilities(visibility, acc_s, acc_dp, p_cast, ds_cast, kv_start, q_start, lse, delta, scale_log2)
                with T.ws_op("dv_gemm"):
                    T.wgmma_gemm(p_cast, dO_shared, acc_dv, policy=T.GemmWarpPolicy.FullRow)
                with T.ws_op("store_ds"):
                    # Every row of dS written before either warpgroup's dQ GEMM reads it: a consumer
                    # sync after the stores. Before them, on one slot, another: both warpgroups' dQ
                    # GEMMs of the step before have read it. On two, a slot is written again two
                    # steps on, after both passed the sync after the stores a step after their
                    # dQ GEMM's wait.
                    if ds_slots == 1:
                        T.sync_threads(CONSUMERS_BARRIER, MMA_THREADS)
                        T.copy(ds_cast, dS_even)
                    elif step % 2 == 0:
                        T.copy(ds_cast, dS_even)
                    else:
                        T.copy(ds_cast, dS_odd)
                    T.fence_proxy_async()  # dS's stores, seen by the wgmma (the async proxy)
                    T.sync_threads(CONSUMERS_BARRIER, MMA_THREADS)
                with T.ws_op("dq_gemm"):  # dQᵀ = Kᵀ·dSᵀ
                    if ds_slots == 1 or step % 2 == 0:
                        T.wgmma_gemm(K_shared, dS_even, acc_dq, transpose_A=True, clear_accum=True,
                                     policy=T.GemmWarpPolicy.FullRow)  # fmt: skip
                    else:
                        T.wgmma_gemm(K_shared, dS_odd, acc_dq, transpose_A=True, clear_accum=True,
                                     policy=T.GemmWarpPolicy.FullRow)  # fmt: skip
                with T.ws_op("dk_gemm"):
                    T.wgmma_gemm(ds_cast, Q_shared, acc_dk, policy=T.GemmWarpPolicy.FullRow)
                with T.ws_op("wait_dv_dq"):
                    T.wait_wgmma(1)
                    T.warpgroup_fence_operand(acc_dv, num_regs=kv_regs)
                    T.warpgroup_fence_operand(acc_dq, num_regs=dq_regs)
                with T.ws_op("stage_dq"):
                    # As the shipped kernel's: a thread's pair lands on two rows dq_row floats apart
                    # (a warp's 32 stores on 32 banks); the pad columns are added as zeros.
                    for i, j in T.Parallel(head_dim, block_m):
                        dQ_shared[j, i] = acc_dq[i, j]
                    for i, j in T.Parallel(block_m, DQ_ROW - head_dim):
                        dQ_shared[i, head_dim + j] = 0
                    T.fence_proxy_async()  # every writer's stores, seen by the bulk copy
                with T.ws_op("wait_dk"):
                    T.wait_wgmma(0)
                    T.warpgroup_fence_operand(acc_dk, num_regs=kv_regs)
                with T.ws_op("add_dq"):
                    add_image(dQ_shared, dQ_accum, DqTurns, b, head, q_start, kv_block, turn)
            with T.ws_op("store_dk_dv"):  # dK scaled once, here
                for i, j in T.Parallel(block_n, head_dim):
                    acc_dk[i, j] = acc_dk[i, j] * softmax_scale
                T.copy(acc_dk, dK[b, kv_start : kv_start + block_n, kv_head, :])
                T.copy(acc_dv, dV[b, kv_start : kv_start + block_n, kv_head, :])

    return flash_attention_backward
