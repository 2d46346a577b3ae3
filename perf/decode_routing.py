"""Where `configs.split_kv_serves` should send a step of a few queries: the forward kernel and
the split-KV kernels on a ladder of query counts, causal and not, alternated in one process.

From the repository root on the GPU machine:

    PYTHONPATH=$PWD/src:$PWD python perf/decode_routing.py [--rounds 3] [--repeats 30]

Each shape runs both launches flash_attn_func chooses between (`bench.forward_kernel_call`,
`bench.split_kv_call`), whatever split_kv_serves says now; the rows name what it says. The
ladder walks the query count of a GQA group of 4 and of 8 and of no GQA up to one row block
of the split kernels (`decode.BLOCK_M` rows), on grids of one batch to a full GPU, at 2048 and
8192 keys. `--boundaries` runs shapes either side of each of split_kv_serves' limits instead.
`--graphs` times each launch as GPU time, replays of a CUDA graph of `host_overhead.GRAPH_CALLS`
launches, so that the host's path per call (which a step this short can outlast) is out of it.
GB/s of K/V read (`Shape.kv_bytes`); the split kernels' ratio to the forward kernel's round by
round. `--compile-only sm_90a` builds every kernel without a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in (ROOT, ROOT / "src") if str(path) not in sys.path]

import torch  # noqa: E402

from fa_kernel.bench import Shape, cuda_median_ms, forward_kernel_call, split_kv_call  # noqa: E402
from fa_kernel.builds import device_target, quiet_tilelang  # noqa: E402
from fa_kernel.configs import forward_keys_per_sm, select_config, tiles_per_sm  # noqa: E402
from fa_kernel.decode import BLOCK_M, compiled_decode_kernels, serves_launch  # noqa: E402
from fa_kernel.kernel import H100_SM_COUNT, compiled_forward  # noqa: E402
from perf import ab  # noqa: E402
from perf.host_overhead import GRAPH_CALLS, graph_us  # noqa: E402

# (batch, query heads, K/V heads): a group of 4 on one batch and on a full GPU, a group of 8,
# and no GQA on grids of 32 and 96 (batch, head) pairs, either side of half the SMs.
GRIDS = ((1, 32, 8), (16, 32, 8), (8, 64, 8), (1, 32, 32), (3, 32, 32))
# (batch, query heads, K/V heads, seqlen_q, seqlen_k) either side of split_kv_serves' limits, on
# 132 SMs: the forward kernel's keys per SM at 4096 against 6144 and 8192 on one wave of tiles (a
# group of 4, no GQA), 1024 and 2048 on one wave of 4 batches, 8192 and 16384 on 16 tiles; 8
# queries against 9 and 16 without GQA and with a group of 4 at 2048 keys; 16 queries of that
# group at 3072 keys against 4096.
BOUNDARIES = (
    *((1, 32, 8, 1, keys) for keys in (4096, 6144, 8192)),
    *((4, 32, 8, 1, keys) for keys in (1024, 2048)),
    *((1, 32, 32, 1, keys) for keys in (4096, 6144, 8192)),
    *((1, 16, 16, 1, keys) for keys in (8192, 16384)),
    *((1, 32, 32, queries, 8192) for queries in (8, 9, 16)),
    *((16, 32, 8, queries, 2048) for queries in (8, 9, 16)),
    *((16, 32, 8, queries, keys) for queries, keys in ((9, 4096), (16, 3072), (16, 4096))),
)


def boundaries() -> list[Shape]:
    return [
        Shape(batch, heads, seqlen_q, 128, causal, torch.bfloat16, nheads_kv=heads_kv, seqlen_k=seqlen_k)
        for batch, heads, heads_kv, seqlen_q, seqlen_k in BOUNDARIES
        for causal in (False, True)
    ]


def ladder() -> list[Shape]:
    shapes = []
    for batch, heads, heads_kv in GRIDS:
        group = heads // heads_kv
        queries = [n for n in (1, 2, 4, 8, 16, 32, 64) if group * n <= BLOCK_M]
        for seqlen_k in (2048, 8192):
            for causal in (True, False):
                for seqlen_q in queries:
                    shapes.append(
                        Shape(
                            batch, heads, seqlen_q, 128, causal, torch.bfloat16, nheads_kv=heads_kv, seqlen_k=seqlen_k
                        )
                    )
    return shapes


def served(shape: Shape, sm_count: int) -> str:
    keys = forward_keys_per_sm(shape.batch, shape.nheads, shape.seqlen_q, shape.keys, sm_count)
    split = serves_launch(shape.batch, shape.seqlen_q, shape.keys, shape.nheads, shape.heads_kv, sm_count)
    return f"forward keys per SM {keys}; serves: {'split-KV' if split else 'forward'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--boundaries", action="store_true", help="shapes either side of split_kv_serves' limits")
    parser.add_argument("--graphs", action="store_true", help="GPU time: replays of a CUDA graph of the launches")
    parser.add_argument("--compile-only", metavar="ARCH", help="compile every kernel for ARCH (sm_90a), no GPU")
    args = parser.parse_args()
    shapes = boundaries() if args.boundaries else ladder()
    if args.compile_only:
        quiet_tilelang()
        builds = set()
        for s in shapes:
            grid = tiles_per_sm(s.batch, s.nheads, s.seqlen_q, H100_SM_COUNT)
            builds.add((s.causal, select_config("sm_90", 128, s.causal, s.keys, grid)))
        for causal, config in sorted(builds, key=str):
            compiled_forward(
                head_dim=128,
                causal=causal,
                dtype="bfloat16",
                config=config,
                arch=args.compile_only,
                sm_count=H100_SM_COUNT,
            )
            print(f"forward {'causal' if causal else 'full'} {config}: compiled", flush=True)
        for causal in (False, True):
            compiled_decode_kernels(head_dim=128, causal=causal, dtype="bfloat16", arch=args.compile_only)
        print("split-KV kernels: compiled", flush=True)
        return 0

    sm_count = device_target(torch.device("cuda"))[0]
    ab.print_header("GB/s of K and V read", ["forward kernel", "split-KV"])

    def gb_per_s(call, kv_bytes: int) -> float:
        if not args.graphs:
            return kv_bytes / (cuda_median_ms(call, 10, args.repeats) * 1e-3) / 1e9
        us = graph_us(call, GRAPH_CALLS)
        if us is None:
            raise RuntimeError("a launch could not be captured in a CUDA graph (printed above)")
        return kv_bytes / (us * 1e-6) / 1e9

    for shape in shapes:
        q, k, v = shape.inputs()
        calls = {
            "forward kernel": forward_kernel_call(q, k, v, shape.causal),
            "split-KV": split_kv_call(q, k, v, shape.causal),
        }
        timers = {name: (lambda call=call, kv=shape.kv_bytes: gb_per_s(call, kv)) for name, call in calls.items()}
        ab.print_row(f"{shape.label()} ({served(shape, sm_count)})", timers, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
