"""What the forward kernel takes of a Hopper SM, and the objects its parts pass around: threads
and registers (a producer warpgroup, setmaxnreg budgets), named barriers, shared memory (whether
O gets a buffer of its own), and the pipeline state (shared buffers and mbarriers), the work
tile's registers and a consumer thread's registers. kernel.py's macros read these; numbers
here are hardware facts or the kernel's own choices, each with its reason."""

from dataclasses import dataclass
from typing import Any, NamedTuple

import tilelang.language as T

from fa_kernel.configs import TileConfig
from fa_kernel.softmax import RowState

PRODUCER_THREADS = 128  # one warpgroup; it needs few registers, the consumers get the rest
PRODUCER_REGISTERS = 24
# Named barriers for taking turns: TURN_BARRIERS[w] = "consumer warpgroup w may issue its
# GEMMs". TileLang allocates its own named barriers from 3 upwards.
TURN_BARRIERS = (13, 14, 15)
# TMA copies move one panel of 64 columns (128 bytes, the width of the shared-memory swizzle) at
# a time: the K/V rings keep each panel of all their rows together, and TileLang lowers a copy
# to TMA only where its shared-memory box is contiguous.
TMA_PANEL = 64
# Named barriers for the stale-max decision (numerics.STALE_SUM_LIMIT), one per consumer
# warpgroup (bar.red.or: does any of its 128 threads have a row over the limit).
VOTE_BARRIERS = (10, 11, 12)
# The vote, in PTX: TileLang 0.1.15 has warp votes and block-wide __syncthreads_or, but no
# reduction over a named barrier's threads.
WARPGROUP_ANY = r"""
__device__ __forceinline__ int warpgroup_any(int barrier_id, int predicate) {
  int result;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.s32 p, %2, 0;\nbar.red.or.pred q, %1, 128, p;\nselp.s32 %0, 1, 0, q;\n}\n"
      : "=r"(result) : "r"(barrier_id), "r"(predicate) : "memory");
  return result;
}
"""
# Named barriers for O's way out: with a buffer of its own, consumer warpgroup w syncs on
# OUTPUT_BARRIERS[w]; staged in the V ring, every consumer thread on OUTPUT_BARRIERS[0].
OUTPUT_BARRIERS = (7, 8, 9)
# Shared memory one thread block of an H100/H200 may use (227 KB), and what an SM has (228 KB,
# 1 KB of it reserved per resident block): O gets a buffer of its own where it fits.
BLOCK_SHARED_BYTES = 232448
SM_SHARED_BYTES = 233472
# Streaming multiprocessors of an H100/H200 SXM: the persistent grid's size when compiling
# without a GPU (`fa_kernel.interface` passes the device's own count).
H100_SM_COUNT = 132


@dataclass(frozen=True)
class Pipeline:
    """Shared memory and its mbarriers: Q's tile, the rings of `num_stages` K and V tiles, O's
    own buffer (None: O leaves through the V ring), and the barriers that hand each over
    between the producer and the consumers (forward_program's allocations say which does what)."""

    Q: object
    K: object
    V: object
    O: object
    q_full: object
    q_empty: object
    o_stored: object
    k_full: object
    k_empty: object
    v_full: object
    v_empty: object


@dataclass(frozen=True)
class WorkTile:
    """A work tile, in T.alloc_var registers: its batch, query head, K/V head, first query row
    and the K/V tiles its block visits (with a left edge, from its kv_first-th; else None); and
    the visibility rule of its lengths (mask.Visibility: the launch's, or a ragged batch's
    sequence's)."""

    b: object
    head: object
    kv_head: object
    q_start: object
    num_kv_blocks: object
    kv_first: object = None
    rule: Any = None
    # A ragged batch's (else None): the sequence's first query row and first key in the packed
    # [total, heads, head_dim] tensors.
    q_offset: object = None
    k_offset: object = None

    def registers(self) -> tuple:
        """(b, head, kv_head, q_start, num_kv_blocks): a macro binds its names to these buffers,
        so that reading a name loads the register and assigning to it stores."""
        return self.b, self.head, self.kv_head, self.q_start, self.num_kv_blocks


@dataclass(frozen=True)
class ConsumerRegisters:
    """A consumer thread's share of the tile: the score, P~ and output accumulators, the row
    state, the stale-max vote (a row of this thread over STALE_SUM_LIMIT) and the K/V tiles its
    warpgroup's rows see."""

    acc_s: object
    acc_p: object
    acc_o: object
    rows: RowState
    row_over: object
    own_kv_blocks: object


def consumer_registers(consumer_threads: int, blocks_per_sm: int = 1) -> int:
    """Registers per consumer thread (setmaxnreg) such that `blocks_per_sm` blocks fit the
    SM's 64K."""
    total_threads = consumer_threads + PRODUCER_THREADS
    # what ptxas gets from the launch bounds
    per_thread = min(255, 65536 // blocks_per_sm // total_threads) // 8 * 8
    warpgroups = consumer_threads // 128
    return min(240, (per_thread * (warpgroups + 1) - PRODUCER_REGISTERS) // warpgroups // 8 * 8)


def own_output_buffer(head_dim: int, config: TileConfig) -> bool:
    """Whether O leaves through a shared buffer of its own, each consumer warpgroup storing its
    rows as soon as it is done; otherwise O is staged in the V ring, once every consumer's last
    P.V has read it. Its own where Q, the K/V rings and O fit the shared memory of
    `config.blocks_per_sm` blocks, unless the epilogue is overlapped (measured slower with its
    own buffer, docs/perf-log.md)."""
    block_bytes = (2 * config.block_m + 2 * config.num_stages * config.block_n) * head_dim * 2  # fp16/bf16
    fits = block_bytes <= BLOCK_SHARED_BYTES and config.blocks_per_sm * (block_bytes + 1024) <= SM_SHARED_BYTES
    return fits and not config.overlap_epilogue


class PipelineParts(NamedTuple):
    """The forward's pipeline helpers, over its tiles (pipeline_parts)."""

    wait_turn: Any  # macro (thread): wait for this warpgroup's turn on the tensor cores
    pass_turn: Any  # macro (thread, kv_block, num_kv_blocks): hand the turn on
    ring_slot: Any  # (count) -> (stage, phase) of the count-th K/V tile through the ring
    ring_stage: Any  # (ring, stage, columns) -> that stage's rows of a K or V ring
    load_tile: Any  # macro: TMA-load a K or V tile into a ring stage
    store_output: Any  # macro: TMA-store rows of the staged output tile
    rows_of: Any  # (tensor, b, start, count, head, columns) -> those rows, batched or packed


def pipeline_parts(*, head_dim: int, block_n: int, stages: int, consumers: int) -> PipelineParts:
    """The helpers of a forward kernel with `consumers` consumer threads, K/V tiles of `block_n`
    rows in a ring of `stages`, and `head_dim` columns."""
    warpgroups = consumers // 128

    @T.macro
    def wait_turn(thread):
        """Wait until the previous consumer warpgroup hands this one the tensor cores (take_turns)."""
        T.sync_threads(TURN_BARRIERS[0] + thread // 128, 256)

    @T.macro
    def pass_turn(thread, kv_block, num_kv_blocks):
        """Hand the tensor cores to the next consumer warpgroup (take_turns); the last one's last
        hand-over of a work tile would have no taker (warpgroup 0 has no next K/V tile)."""
        if thread < consumers - 128 or kv_block < num_kv_blocks - 1:
            T.named_barrier_arrive(TURN_BARRIERS[0] + (thread // 128 + 1) % warpgroups, 256)

    def ring_slot(count):
        """(stage, phase) of the count-th K/V tile through the ring: its buffer, and the parity
        its mbarriers wait for (they flip each time the ring wraps)."""
        return count % stages, (count // stages) & 1

    def ring_stage(ring, stage, columns=slice(None)):
        """Stage `stage` of a K or V ring: rows [stage * block_n, (stage + 1) * block_n)."""
        return ring[stage * block_n : (stage + 1) * block_n, columns]

    def panel_columns(panel):
        return slice(panel * TMA_PANEL, (panel + 1) * TMA_PANEL)

    def rows_of(tensor, b, start, count, head, columns=slice(None)):
        """Rows start.. of one head: of batch b in [batch, seqlen, heads, head_dim], or (b None)
        of a ragged batch's packed [total, heads, head_dim], start its sequence's offset added."""
        if b is None:
            return tensor[start : start + count, head, columns]
        return tensor[b, start : start + count, head, columns]

    @T.macro
    def load_tile(source, b, kv_start, kv_head, ring, empty, full, stage, phase):
        """TMA-load rows kv_start.. of K or V into the ring's stage once the consumers have
        released it, a panel at a time."""
        T.mbarrier_wait_parity(empty[stage], phase ^ 1)
        for panel in T.unroll(head_dim // TMA_PANEL):
            T.tma_copy(
                rows_of(source, b, kv_start, block_n, kv_head, panel_columns(panel)),
                ring_stage(ring, stage, panel_columns(panel)),
                barrier=full[stage],
            )
        T.mbarrier_arrive(full[stage])

    @T.macro
    def store_output(O_tile, Output, b, head, q_start, first_row, rows, storing_threads):
        """TMA-store rows first_row.. of the staged output tile, a panel at a time, from one
        thread of the `storing_threads` that wrote them (no wait: T.tma_store_wait)."""
        for panel in T.unroll(head_dim // TMA_PANEL):
            T.tma_copy(
                O_tile[first_row : first_row + rows, panel_columns(panel)],
                rows_of(Output, b, q_start + first_row, rows, head, panel_columns(panel)),
                leader_scope_threads=storing_threads,
            )

    return PipelineParts(wait_turn, pass_turn, ring_slot, ring_stage, load_tile, store_output, rows_of)
