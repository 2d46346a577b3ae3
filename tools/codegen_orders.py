"""Orderings a gradient kernel's generated CUDA keeps where it places its own syncs and fences,
read off the source text TileLang emits; tests/test_codegen.py holds each such build to them.

racecheck sees neither a wgmma's read of shared memory nor a bulk reduce-add's, so the order of
writes, fences, barriers and waits around dS's and dQ's shared images is checked on the code. Not
the mutant triage's rules (tools/codegen_rules.BUILD_RULES): an edit here lowers nothing again.
"""

from __future__ import annotations

import re

from tools.codegen_rules import enclosing_loop_body, in_order


def dq_staging_gaps(source: str, consumers: int = 256) -> list[str]:
    """What the dK/dV kernel's generated walk lacks to pass dS and dQ through shared memory, []
    if nothing, where it places its own barriers (backward.syncs_by_hand).

    dS_shared is written by both consumer warpgroups and read by each one's dQ wgmma; dQ_shared
    is written by both and read by the bulk reduce-add. Each read needs the writes behind a
    consumer sync and a proxy fence; each write needs the last step's reads behind a sync (for
    the bulk add: the issuing thread's wait, then a sync). The walk repeats, so the last step's
    reads are the loop body's tail before its head. Neither reader is one racecheck sees."""
    store = re.search(r"tl::tma_store_add\(", source)
    body = enclosing_loop_body(source, store.start()) if store else None
    if body is None:
        return ["dQ's bulk reduce-add inside the walk not found"]
    loop = source[body[0] : body[1]]
    element = r"\(\((?:half_t|bfloat16_t)\*\)dS_shared\)"
    ds_write = re.search(element, loop)
    ds_operand = re.search(rf"initialize_wgmma_descriptor<[^>]*>\(\w+, \(&\({element}", loop)
    ds_read = ds_operand and re.compile(r"tl::wgmma_\w+<").search(loop, ds_operand.end())
    # <1> where dK's GEMM, issued after dQ's, stays in flight under dQ's staging.
    dq_wait = ds_read and re.compile(r"(?:warpgroup_wait|wait_wgmma)<[01]>").search(loop, ds_read.end())
    # A vector store at an offset, or (dQᵀ written transposed) an element at an index.
    dq_write = dq_wait and re.compile(r"\(\(float\*\)dQ_shared\)(?: \+|\[)").search(loop, dq_wait.end())
    add = re.search(r"tl::tma_store_add\(", loop)
    if not (ds_write and ds_read and dq_wait and dq_write and add and ds_write.start() < ds_read.start()):
        return ["dS's write, its wgmma, dQ's write and its bulk add, in that order, not found"]
    sync, fence = rf"__sync_thread_partial\(\d+, {consumers}\)", r"fence_proxy_async\(\)"

    def synced_and_fenced(text: str) -> bool:
        return in_order(text, fence, sync) or in_order(text, sync, fence)

    gaps = []
    if not synced_and_fenced(loop[ds_write.end() : ds_read.start()]):
        gaps.append("no consumer sync and proxy fence between dS's write and dQ's wgmma")
    if not in_order(loop[dq_wait.end() :] + loop[: ds_write.start()], sync):
        gaps.append("no consumer sync between dQ's wgmma and the next step's write of dS")
    if not synced_and_fenced(loop[dq_write.end() : add.start()]):
        gaps.append("no consumer sync and proxy fence between dQ's write and its bulk add")
    if not in_order(loop[add.end() :] + loop[: dq_write.start()], r"tma_store_wait<0", sync):
        gaps.append("no wait for the last bulk add, then a consumer sync, before dQ's write")
    return gaps


def writer_handoff_gaps(source: str, consumers: int = 256) -> list[str]:
    """What the dq_writer build's generated walks lack to hand dS and dQ over in shared memory, []
    if nothing (fa_kernel/backward_writer.py). The MMA warps' dS: its stores, a proxy fence, then
    a consumer sync before a dQ wgmma reads it. dQ's image: the MMA warps wait for its slot's
    empty barrier before writing it, and fence before arriving on its full one; the writer warp
    waits for the full barrier, adds, waits for the add's read of the image, then arrives on the
    empty one. The schedule's materializer places the barriers; the fences, the sync and the
    writer's wait are the kernel's own, and racecheck sees neither the wgmma's read nor the add's."""
    add = re.search(r"tl::tma_store_add\(", source)
    full = re.search(r"dq_full\[[^\]]*\]\.arrive\(\)", source)
    writer = enclosing_loop_body(source, add.start()) if add else None
    mma = enclosing_loop_body(source, full.start()) if full else None
    if writer is None or mma is None:
        return ["the MMA warps' arrival on dQ's full barrier or the writer's bulk add inside a walk not found"]
    loop = source[mma[0] : mma[1]]
    ds_write = re.search(r"stmatrix[^\n]*\(\((?:half_t|bfloat16_t)\*\)dS_", loop)
    ds_read = re.search(r"initialize_wgmma_descriptor<[^>]*>\(\w+, \(&\(\(\((?:half_t|bfloat16_t)\*\)dS_", loop)
    dq_writes = list(re.finditer(r"\(\(float\*\)dQ_shared\)(?: \+|\[)", loop))
    if not (ds_write and ds_read and dq_writes and ds_write.start() < ds_read.start()):
        return ["dS's write, its wgmma and dQ's write, in that order, not found"]
    sync, fence = rf"__sync_thread_partial\(\d+, {consumers}\)", r"fence_proxy_async\(\)"
    gaps = []
    if not in_order(loop[ds_write.end() : ds_read.start()], fence, sync):
        gaps.append("no proxy fence, then a consumer sync, between dS's write and dQ's wgmma")
    if not re.search(r"dq_empty\[[^\]]*\]\.wait\(", loop[: dq_writes[0].start()]):
        gaps.append("no wait for dQ's empty slot before its write")
    if not in_order(loop[dq_writes[-1].end() :], fence, r"dq_full\[[^\]]*\]\.arrive\(\)"):
        gaps.append("no proxy fence between dQ's write and its full barrier's arrival")
    steps = (r"dq_full\[[^\]]*\]\.wait\(", r"tl::tma_store_add\(", r"tma_store_wait<0", r"dq_empty\[[^\]]*\]\.arrive\(")
    if not in_order(source[writer[0] : writer[1]], *steps):
        gaps.append("the writer does not wait for the full slot, add, wait for the add's read, then free the slot")
    return gaps
