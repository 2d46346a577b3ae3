"""The forward's epilogue: what a work tile does after its last K/V tile. Each row's sink joins
its sum (where compiled in), O is normalised once, the LSE is written, and O leaves by TMA store
through shared memory: from a buffer of its own, each consumer warpgroup its rows as soon as it
is done, or from the V ring's first rows once every consumer's last P.V has read it. A ragged
batch's last, partial query block stores its rows element by element: a TMA box clips only at
the packed tensor's end, not at the sequence's."""

import tilelang.language as T

from fa_kernel.numerics import LN2, LOG2E
from fa_kernel.pipeline import OUTPUT_BARRIERS


def epilogue_parts(
    *,
    head_dim: int,
    block_m: int,
    consumers: int,
    o_buffer: bool,
    overlap_epilogue: bool,
    sinks: bool,
    varlen: bool,
    softmax,
    store_output,
):
    """The epilogue macro (pipe, regs, tile, LSE, Output, Sinks, thread) of a forward kernel with
    `consumers` consumer threads and `block_m` × `head_dim` output tiles: O through a buffer of
    its own (`o_buffer`) or the V ring; `softmax` the kernel's online softmax (softmax.py),
    `store_output` its pipeline's O store (pipeline.py)."""
    rows_per_warpgroup = block_m // (consumers // 128)
    neg_inf = -T.infinity(T.float32)

    def lse_of_row(rows, i):
        """Row i's LSE (natural log): -inf for a row that saw no key (its sum 0)."""
        return T.if_then_else(rows.row_sum[i] == 0, neg_inf, softmax.log2_sum(rows, i) * LN2)

    @T.macro
    def store_sequence_rows(O_tile, Output, tile, first_row, rows, storing_threads, thread):
        """A ragged batch's O: rows first_row.. of the staged tile into the packed output, the
        sequence's last, partial block element by element, the storing threads each a share; a
        full block by TMA."""
        head, q_start, seqlen = tile.head, tile.q_start, tile.rule.seqlen_q
        if q_start + block_m <= seqlen:
            store_output(O_tile, Output, None, head, tile.q_offset + q_start, first_row, rows, storing_threads)
        else:
            for step in T.serial(T.ceildiv(rows * head_dim, storing_threads)):
                element = step * storing_threads + thread % storing_threads
                row = first_row + element // head_dim
                if T.And(element < rows * head_dim, q_start + row < seqlen):
                    Output[tile.q_offset + q_start + row, head, element % head_dim] = O_tile[row, element % head_dim]

    @T.macro
    def epilogue(pipe, regs, tile, LSE, Output, Sinks, thread):
        """One normalisation after the loop, the LSE, and O's TMA store. The normalisation runs
        on O's way into shared memory, except for the V ring without the overlapped epilogue,
        where it runs in place before the sync (while the other warpgroups finish). Under the
        overlapped epilogue S_0 is in flight, and nothing but wgmma may write an accumulator.
        Sinks: each row's sink joins its sum here (softmax.join_sink), once."""
        acc_o, row_sum = regs.acc_o, regs.rows.row_sum
        b, head, q_start = tile.b, tile.head, tile.q_start
        kept = None  # what acc_o's weights keep of their worth once a sink joined (alpha)
        if sinks:
            softmax.join_sink(regs.rows, Sinks[head] * LOG2E)
            kept = regs.rows.alpha
        if not (overlap_epilogue or o_buffer):
            for i, d in T.Parallel(block_m, head_dim):
                acc_o[i, d] = softmax.normalised(acc_o, row_sum, i, d, kept)
        for i in T.Parallel(block_m):
            if q_start + i < tile.rule.seqlen_q:
                if varlen:
                    LSE[head, tile.q_offset + q_start + i] = lse_of_row(regs.rows, i)
                else:
                    LSE[b, head, q_start + i] = lse_of_row(regs.rows, i)
        # The TMA store reads by the async proxy what the threads wrote by the generic one:
        # each thread fences its writes before the sync that lets the store go.
        if o_buffer:
            # Each warpgroup writes and stores its own rows, so none waits for another at a
            # tile's end; it waits only for its own last store to have read the buffer.
            first_row = thread // 128 * rows_per_warpgroup
            T.tma_store_wait(0)
            T.sync_threads(OUTPUT_BARRIERS[0] + thread // 128, 128)
            for i, d in T.Parallel(block_m, head_dim):
                pipe.O[i, d] = softmax.normalised(acc_o, row_sum, i, d, kept)
            T.fence_proxy_async()
            T.sync_threads(OUTPUT_BARRIERS[0] + thread // 128, 128)
            if varlen:
                store_sequence_rows(pipe.O, Output, tile, first_row, rows_per_warpgroup, 128, thread)
            else:
                store_output(pipe.O, Output, b, head, q_start, first_row, rows_per_warpgroup, 128)
        else:
            # In the V ring: the other warpgroups' last P.V may still be reading it.
            T.sync_threads(OUTPUT_BARRIERS[0], consumers)
            if overlap_epilogue:
                for i, d in T.Parallel(block_m, head_dim):
                    pipe.V[i, d] = softmax.normalised(acc_o, row_sum, i, d, kept)
            else:
                T.copy(acc_o, pipe.V[0:block_m, :])
            T.fence_proxy_async()
            T.sync_threads(OUTPUT_BARRIERS[0], consumers)
            if varlen:
                store_sequence_rows(pipe.V, Output, tile, 0, block_m, consumers, thread)
            else:
                store_output(pipe.V, Output, b, head, q_start, 0, block_m, consumers)
            T.tma_store_wait(0)
            # The next V lands by TMA (the async proxy) where O was written and read.
            T.fence_proxy_async()
            T.mbarrier_arrive(pipe.o_stored)

    return epilogue
