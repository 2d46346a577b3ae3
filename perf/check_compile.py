"""Compile every variant for sm_90a without a GPU and summarise the generated code.

    PYTHONPATH=$PWD/src:$PWD python perf/check_compile.py [--variants a b] [--head-dims 64 128]
        [--dtypes float16 bfloat16] [--causal 0 1] [--config 128x128/2st/256thr 192x128/2st/384thr/free]
        [--jobs 2] [--save DIR]

Per (variant, case) it prints: wgmma issue sites (ss / rs) in the CUDA source, TMA loads,
the warpgroup wait values, setmaxnreg values, whether local arrays / stack appear, and what
ptxas says (registers, stack frame, spills, and the C7514/C7515/C7517 notes that mean
"wgmma serialised": the overlap did not survive). ptxas is run by this script on the
generated source (nvcc -Xptxas -v), with the flags TileLang itself uses.

The last column, `ex2_under_pv`, reads the SASS (cuobjdump: on PATH, or the copy Triton's
wheel carries): of the MUFU.EX2 between the steady-state loop's wait for S_j
(`WARPGROUP.DEPBAR.LE gsb0, 0x1`) and the next instruction after it that touches the tensor
cores, how many come before the wait for P_{j-1}.V_{j-1} (`DEPBAR.LE gsb0, 0x0`). "0/90"
means ptxas placed that wait before the exponentials: the softmax runs after the P.V GEMM,
not under it (docs/perf-log.md); "-" where the loop has no separate wait for S_j.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "src", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def _features(src: str) -> dict:
    waits = re.findall(r"(?:warpgroup_wait|wait_wgmma)<(\d+)>", src)
    return {
        "wgmma_ss": len(re.findall(r"wgmma_ss<", src)),
        "wgmma_rs": len(re.findall(r"wgmma_rs<", src)),
        "tma_load": len(re.findall(r"tma_load\(", src)),
        "tma_store": len(re.findall(r"tma_store\(", src)),
        "cp_async": len(re.findall(r"cp_async_gs", src)),
        "waits": ",".join(waits),
        "setmaxnreg": ",".join(
            re.findall(r"warpgroup_reg_(?:alloc|dealloc)<(\d+)>", src) + re.findall(r"set_max_nreg<(\d+)", src)
        ),
        "launch_bounds": ",".join(re.findall(r"__launch_bounds__\((\d+)", src)),
        "named_bar": len(re.findall(r"bar\.(?:sync|arrive)|sync_threads\(|named_barrier", src)),
    }


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton.backends.nvidia as triton_nvidia
    except ImportError:
        return None
    bundled = Path(triton_nvidia.__file__).parent / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else None


def ex2_under_pv(sass: str) -> str:
    """'before/total' MUFU.EX2 of the loop's softmax relative to the P.V wait (see above)."""
    lines = sass.splitlines()
    starts = [i for i, line in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line]
    if not starts:
        return "-"
    before = after = 0
    seen_wait0 = False
    for line in lines[starts[0] + 1 :]:
        if "HGMMA" in line or "WARPGROUP.ARRIVE" in line:
            break
        if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line:
            seen_wait0 = True
        elif "MUFU.EX2" in line:
            after += seen_wait0
            before += not seen_wait0
    return f"{before}/{before + after}"


def _ptxas(src: str) -> dict:
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / "k.cu"
        cubin = Path(tmp) / "k.cubin"
        cu.write_text(src)
        cmd = [
            "nvcc", "--cubin", "-O3", "-arch=sm_90a", "-std=c++20", "--use_fast_math",
            f"-I{TILELANG_TEMPLATE_PATH}", f"-I{CUTLASS_INCLUDE_DIR}",
            "-diag-suppress", "1444,20012,177,550,1046", "-Xptxas", "-v",
            "-o", str(cubin), str(cu),
        ]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True)
        out = res.stdout + res.stderr
        cuobjdump = _cuobjdump()
        sass = ""
        if cuobjdump and cubin.exists():
            sass = subprocess.run([cuobjdump, "--dump-sass", str(cubin)], capture_output=True, text=True).stdout
    regs = re.search(r"Used (\d+) registers", out)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", out)
    notes = sorted(set(re.findall(r"\((C75\d\d)\)", out)))
    return {
        "regs": int(regs.group(1)) if regs else None,
        "stack": int(frame.group(1)) if frame else None,
        "spill": (int(frame.group(2)) + int(frame.group(3))) if frame else None,
        "ptxas_notes": ",".join(notes) or "-",
        "ptxas_text": "\n".join(line for line in out.splitlines() if "C75" in line),
        "ex2_under_pv": ex2_under_pv(sass) if sass else "no cuobjdump",
    }


def check(job: tuple) -> dict:
    name, head_dim, causal, dtype, config, save = job

    from perf.variants import compile_variant

    row = {"variant": name, "head_dim": head_dim, "causal": causal, "dtype": dtype, "config": str(config)}
    t0 = time.time()
    try:
        kernel = compile_variant(name, head_dim, causal, dtype, config, arch="sm_90a")
        src = kernel.get_kernel_source()
    except Exception as exc:  # noqa: BLE001 - report, do not stop
        msg = str(exc).strip().splitlines()
        row["error"] = next((m for m in reversed(msg) if m.strip()), type(exc).__name__)[:300]
        return row
    row["compile_s"] = round(time.time() - t0, 1)
    row.update(_features(src))
    row["local_arrays"] = len(re.findall(r"^\s*(?:float|half_t|bfloat16_t|int)\s+\w+\[\d+\];", src, re.M))
    row.update(_ptxas(src))
    if save:
        Path(save).mkdir(parents=True, exist_ok=True)
        case = f"d{head_dim}_{'c' if causal else 'nc'}_{dtype}"
        tag = re.sub(r"[^A-Za-z0-9_]+", "_", f"{name}_{case}_{config}")  # a file name from config's str
        (Path(save) / f"{tag}.cu").write_text(src)
    return row


def main() -> None:
    from fa_kernel.configs import TileConfig
    from perf.variants import VARIANTS

    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--head-dims", nargs="*", type=int, default=[64, 128])
    ap.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16"])
    ap.add_argument("--causal", nargs="*", type=int, default=[0, 1])
    ap.add_argument(
        "--config",
        nargs="*",
        type=TileConfig.parse,
        default=[TileConfig(128, 128, 2, 256)],
        help="as TileConfig prints them: 128x128/2st/256thr, 192x128/2st/384thr/free",
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--save", default=None, help="folder to write the generated .cu files")
    args = ap.parse_args()

    cfgs = args.config
    jobs = [
        (v, d, bool(c), dt, cfg, args.save)
        for v in args.variants
        for cfg in cfgs
        for d in args.head_dims
        for c in args.causal
        for dt in args.dtypes
    ]
    cols = [
        "wgmma_ss",
        "wgmma_rs",
        "tma_load",
        "cp_async",
        "waits",
        "setmaxnreg",
        "launch_bounds",
        "regs",
        "stack",
        "spill",
        "ptxas_notes",
        "ex2_under_pv",
    ]
    print(f"{'variant':20} {'case':22} {'config':26} " + " ".join(f"{c:>10}" for c in cols))
    failed = 0
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(check, jobs):
            case = f"d{row['head_dim']} {'causal' if row['causal'] else 'full'} {row['dtype']}"
            if "error" in row:
                failed += 1
                print(f"{row['variant']:20} {case:22} {row['config']:26} COMPILE FAILED: {row['error']}")
                continue
            print(f"{row['variant']:20} {case:22} {row['config']:26} " + " ".join(f"{str(row[c]):>10}" for c in cols))
            if row["ptxas_text"]:
                for line in row["ptxas_text"].splitlines()[:3]:
                    print("      ptxas:", line.strip()[:200])
    print(f"{len(jobs) - failed}/{len(jobs)} compiled")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
