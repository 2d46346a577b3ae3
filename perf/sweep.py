"""Sweep the kernel variants of perf/variants.py on the GPU against torch SDPA (cuDNN).

From the repository root on the H200:

    source .gpu/env.sh && PYTHONPATH=$PWD/src:$PWD:$PYTHONPATH python perf/sweep.py
    ... python perf/sweep.py --variants shipped pairwise_max --cases d128 d128c
    ... python perf/sweep.py --configs 128x128/2/256 128x176/2/256 --cases d128

Phases:
 1. compile every (variant, config, case) for sm_90a in a process pool (no GPU needed; the
    kernels land in TileLang's disk cache); a config that fails is reported in one line;
 2. in a GPU worker process: for each compiled kernel, check it on small odd shapes against
    fa_kernel.reference.judge (all must pass), then time it at B=8 H=32 N=4096 with
    fa_kernel.bench.cuda_median_ms; cuDNN (and torch's flash backend) are timed in the
    same process on the same shapes. A kernel that hangs or crashes the CUDA context only
    costs its own row: the worker is restarted after it (--stall-s) and continues.
Prints a table per case (TFLOP/s, ratio to cuDNN, correct) and writes $OUT/sweep.json
(or --json PATH) with every number, error and verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "src"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

ARCH = "sm_90a"
BATCH, HEADS, SEQLEN = 8, 32, 4096

# name: (head_dim, causal, dtype)
CASES = {
    "d128": (128, False, "float16"),
    "d128c": (128, True, "float16"),
    "d64": (64, False, "float16"),
    "d64c": (64, True, "float16"),
    "d128bf16": (128, False, "bfloat16"),
    "d64bf16": (64, False, "bfloat16"),
}

# (block_m, block_n, num_stages, threads); threads = consumer threads (+128 producer).
CONFIGS = {
    128: ["128x128/2/256", "128x128/1/256", "128x64/2/256", "128x176/2/256"],
    64: ["128x128/2/256", "192x128/2/384", "192x128/2/384/free", "192x192/2/384"],
}

# Correctness shapes: (batch, heads, heads_kv, seqlen_q, seqlen_k).
CHECK_SHAPES = [(2, 4, 2, 257, 300), (1, 2, 1, 1000, 1000), (2, 4, 4, 300, 257)]


def parse_config(text: str):
    from fa_kernel.configs import TileConfig

    if "st/" in text:  # the form TileConfig prints, e.g. 192x128/2st/384thr/free
        return TileConfig.parse(text)
    # "192x128/2/384", then optionally "/free", "/persistent", "/overlap" (with persistent: the
    # next tile's first Q.K^T under the epilogue), "/2persm" (two blocks per SM)
    tile, stages, threads, *flags = text.split("/")
    known = ("free", "persistent", "overlap", "2persm")
    unknown = set(flags) - set(known)
    if unknown:
        raise ValueError(f"config {text!r}: unknown flags {sorted(unknown)}, expected {', '.join(known)}")
    block_m, block_n = tile.split("x")
    return TileConfig(
        int(block_m),
        int(block_n),
        int(stages),
        int(threads),
        take_turns="free" not in flags,
        persistent="persistent" in flags,
        blocks_per_sm=2 if "2persm" in flags else 1,
        overlap_epilogue="overlap" in flags,
    )


def job_key(job: dict) -> str:
    return f"{job['variant']}|{job['config']}|{job['case']}"


# ---------------------------------------------------------------------------- compile phase


def compile_job(job: dict) -> dict:
    """Runs in a pool process: compile for sm_90a (fills TileLang's cache), no GPU."""
    t0 = time.time()
    try:
        from perf.variants import compile_variant

        head_dim, causal, dtype = CASES[job["case"]]
        compile_variant(job["variant"], head_dim, causal, dtype, parse_config(job["config"]), arch=ARCH)
        return {**job, "compiled": True, "compile_s": round(time.time() - t0, 1)}
    except BaseException as exc:  # noqa: BLE001 - one line per failure, keep going
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "rror" in ln or "Check failed" in ln), lines[-1] if lines else "")
        return {**job, "compiled": False, "error": f"{type(exc).__name__}: {why}"[:240]}


# ---------------------------------------------------------------------------- GPU worker


def _emit(fh, record: dict) -> None:
    fh.write(json.dumps(record) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def worker(jobs_path: str, results_path: str, baselines_needed: list[str], warmup: int, repeats: int) -> None:
    import torch

    from fa_kernel.bench import Shape, cuda_median_ms, runners
    from fa_kernel.numerics import LOG2E
    from fa_kernel.reference import judge
    from perf.variants import compile_variant

    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    jobs = json.loads(Path(jobs_path).read_text())
    with open(results_path, "a") as fh:
        for case in baselines_needed:
            head_dim, causal, dtype = CASES[case]
            shape = Shape(BATCH, HEADS, SEQLEN, head_dim, causal, torch_dtype[dtype])
            _emit(fh, {"event": "start", "key": f"baseline|{case}"})
            for name, fn in runners(shape).items():
                if name == "fa_kernel":
                    continue  # the shipped kernel is measured as variant "shipped"
                ms = cuda_median_ms(fn, warmup, repeats)
                _emit(fh, {"event": "baseline", "case": case, "impl": name, "ms": ms, "tflops": shape.flops / ms / 1e9})
            torch.cuda.empty_cache()

        for job in jobs:
            _emit(fh, {"event": "start", "key": job_key(job)})
            head_dim, causal, dtype = CASES[job["case"]]
            config = parse_config(job["config"])
            record = {"event": "result", **job}
            kernel = compile_variant(job["variant"], head_dim, causal, dtype, config, arch=ARCH)
            scale_log2 = LOG2E / math.sqrt(head_dim)

            failures = []
            for batch, heads, heads_kv, seqlen_q, seqlen_k in CHECK_SHAPES:
                gen = torch.Generator(device="cuda").manual_seed(seqlen_q * 7 + seqlen_k)
                q = torch.randn(batch, seqlen_q, heads, head_dim, generator=gen, device="cuda").to(torch_dtype[dtype])
                k = torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=gen, device="cuda").to(q.dtype)
                v = torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=gen, device="cuda").to(q.dtype)
                out = torch.empty_like(q)
                lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device="cuda")
                kernel(q, k, v, out, lse, scale_log2)
                torch.cuda.synchronize()
                verdict = judge(q, k, v, out, lse, causal)
                if not verdict.passed:
                    failures.append(f"{(batch, heads, heads_kv, seqlen_q, seqlen_k)}: {verdict}"[:400])
            record["correct"] = not failures
            if failures:
                record["check_failures"] = failures

            # Timed even when incorrect (marked in the table), at the benchmark shape.
            shape = Shape(BATCH, HEADS, SEQLEN, head_dim, causal, torch_dtype[dtype])
            q, k, v = shape.inputs()
            out = torch.empty_like(q)
            lse = torch.empty(BATCH, HEADS, SEQLEN, dtype=torch.float32, device="cuda")
            args = (q, k, v, out, lse, scale_log2)
            ms = cuda_median_ms(lambda kernel=kernel, args=args: kernel(*args), warmup, repeats)
            record.update(ms=ms, tflops=shape.flops / ms / 1e9)
            _emit(fh, record)


# ---------------------------------------------------------------------------- driver


def run_gpu_phase(jobs: list[dict], cases: list[str], args, results: list[dict], baselines: dict) -> None:
    """Run the GPU worker, restarting it after a hang or crash, until every job has a row."""
    pending = list(jobs)
    need_baselines = [c for c in cases if c not in baselines]
    tmp = Path(tempfile.mkdtemp(prefix="fa_sweep_"))
    attempt = 0
    while (pending or need_baselines) and time.time() < args.deadline:
        attempt += 1
        jobs_path, results_path = tmp / f"jobs{attempt}.json", tmp / f"results{attempt}.jsonl"
        jobs_path.write_text(json.dumps(pending))
        results_path.write_text("")
        cmd = [sys.executable, __file__, "--worker", str(jobs_path), str(results_path), "--warmup", str(args.warmup),
               "--repeats", str(args.repeats), "--shape", args.shape, "--baselines", *need_baselines]  # fmt: skip
        err_path = tmp / f"worker{attempt}.err"
        err_fh = open(err_path, "w")  # noqa: SIM115 - closed after the worker exits
        proc = subprocess.Popen(cmd, env=os.environ.copy(), stderr=err_fh)
        seen, last_progress, started = 0, time.time(), None
        done_keys: set[str] = set()
        while True:
            exited = proc.poll() is not None
            lines = results_path.read_text().splitlines()
            complete = lines if exited else lines[:-1] if lines and not lines[-1].endswith("}") else lines
            for line in complete[seen:]:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                last_progress = time.time()
                if rec["event"] == "start":
                    started = rec["key"]
                elif rec["event"] == "baseline":
                    baselines.setdefault(rec["case"], {})[rec["impl"]] = rec
                    started = None
                else:
                    results.append(rec)
                    done_keys.add(job_key(rec))
                    _print_row(rec, baselines)
                    started = None
            seen = len(complete)
            if exited:
                break
            stalled = time.time() - last_progress > args.stall_s
            if stalled or time.time() > args.deadline:
                proc.kill()
                proc.wait()
                why = f"hang (no progress in {args.stall_s}s)" if stalled else "sweep time budget exhausted"
                if started and not started.startswith("baseline|") and stalled:
                    variant, config, case = started.split("|")
                    rec = {
                        "event": "result",
                        "variant": variant,
                        "config": config,
                        "case": case,
                        "correct": False,
                        "error": why,
                    }
                    results.append(rec)
                    done_keys.add(started)
                    _print_row(rec, baselines)
                break
            time.sleep(0.5)
        err_fh.close()
        err_tail = [
            ln for ln in err_path.read_text(errors="replace").splitlines() if ln.strip() and "TileLang" not in ln
        ]
        if proc.returncode not in (0, None):
            print(f"  [worker exited rc={proc.returncode}: {err_tail[-1][:200] if err_tail else ''}]", flush=True)
        if proc.returncode not in (0, None) and started and started not in done_keys:
            if started.startswith("baseline|"):
                baselines.setdefault(started.split("|")[1], {})["error"] = f"worker died (rc {proc.returncode})"
            else:
                variant, config, case = started.split("|")
                last = err_tail[-1][:160] if err_tail else ""
                rec = {"event": "result", "variant": variant, "config": config, "case": case, "correct": False,
                       "error": f"worker died (rc {proc.returncode}): {last}"}  # fmt: skip
                results.append(rec)
                done_keys.add(started)
                _print_row(rec, baselines)
        pending = [j for j in pending if job_key(j) not in done_keys]
        need_baselines = [c for c in need_baselines if c not in baselines]
        if attempt > len(jobs) + 3:
            break
    for job in pending:
        results.append({"event": "result", **job, "correct": False, "error": "not run (time budget)"})


def _cudnn(baselines: dict, case: str) -> float | None:
    rec = baselines.get(case, {}).get("cudnn")
    return rec["tflops"] if rec else None


def _print_row(rec: dict, baselines: dict) -> None:
    ref = _cudnn(baselines, rec["case"])
    tf = rec.get("tflops")
    ratio = f"{tf / ref:5.3f}" if tf and ref else "    -"
    ok = "yes" if rec.get("correct") else "NO"
    extra = rec.get("error") or ("; ".join(rec.get("check_failures", []))[:160] if not rec.get("correct") else "")
    tf_s = f"{tf:7.1f}" if tf else "      -"
    print(
        f"  {rec['case']:9} {rec['variant']:20} {rec['config']:14} {tf_s} TFLOP/s  x{ratio}  correct={ok} {extra}",
        flush=True,
    )


def main() -> None:
    global BATCH, HEADS, SEQLEN  # noqa: PLW0603 - --shape sets them, here and in the worker process
    from perf.variants import KNOWN_INCORRECT, VARIANTS, is_variant

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--variants", nargs="*", default=[v for v in VARIANTS if v not in KNOWN_INCORRECT],
        help=f"default: all but {sorted(KNOWN_INCORRECT)} (fails the correctness check; name it to run it)",
    )  # fmt: skip
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--configs", nargs="*", default=None, help="e.g. 128x128/2/256 (else the per-head_dim list)")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 4), help="compile processes")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--stall-s", type=int, default=90, help="restart the GPU worker after this long without progress")
    ap.add_argument("--budget-s", type=int, default=340, help="stop starting new work after this many seconds")
    ap.add_argument("--json", default=None, help="output path (default $OUT/sweep.json if OUT is set)")
    ap.add_argument("--shape", default=f"{BATCH},{HEADS},{SEQLEN}", help="B,H,N of the timed shape")
    ap.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--baselines", nargs="*", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    BATCH, HEADS, SEQLEN = (int(x) for x in args.shape.split(","))

    if args.worker:
        worker(args.worker[0], args.worker[1], args.baselines, args.warmup, args.repeats)
        return

    t_start = time.time()
    args.deadline = t_start + args.budget_s
    unknown = [v for v in args.variants if not is_variant(v)]
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {list(VARIANTS)}, or file:PATH to a copy of kernel.py")
    jobs = [
        {"variant": v, "config": cfg, "case": case}
        for case in args.cases
        for cfg in (args.configs or CONFIGS[CASES[case][0]])
        for v in args.variants
    ]
    print(f"{len(jobs)} kernels: compiling with {args.jobs} processes ...", flush=True)
    compiled, failures = [], []
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(compile_job, job) for job in jobs]
        for fut in as_completed(futures):
            res = fut.result()
            (compiled if res["compiled"] else failures).append(res)
    order = {job_key(j): i for i, j in enumerate(jobs)}
    compiled.sort(key=lambda r: order[job_key(r)])
    print(f"compiled {len(compiled)}/{len(jobs)} in {time.time() - t_start:.0f}s", flush=True)
    for f in sorted(failures, key=lambda r: order[job_key(r)]):
        print(f"  COMPILE FAILED {f['variant']} {f['config']} {f['case']}: {f['error']}", flush=True)

    results: list[dict] = []
    baselines: dict = {}
    print("GPU phase (rows as they come):", flush=True)
    run_gpu_phase(
        [{k: r[k] for k in ("variant", "config", "case")} for r in compiled], args.cases, args, results, baselines
    )

    # ---- summary table, per case, fastest first
    print("\n" + "=" * 100)
    for case in args.cases:
        ref = _cudnn(baselines, case)
        head = ", ".join(
            f"{impl} {rec['tflops']:.1f}" for impl, rec in baselines.get(case, {}).items() if isinstance(rec, dict)
        )
        print(f"{case} (B={BATCH} H={HEADS} N={SEQLEN}, {CASES[case]}): {head or 'no baseline'} TFLOP/s")
        rows = [r for r in results if r["case"] == case]
        rows.sort(key=lambda r: -(r.get("tflops") or 0) if r.get("correct") else 1e9 - (r.get("tflops") or 0))
        print(f"  {'variant':20} {'config':14} {'TFLOP/s':>8} {'x cuDNN':>8}  correct")
        for r in rows:
            tf = r.get("tflops")
            ratio = f"{tf / ref:8.3f}" if tf and ref else "       -"
            tf_s = f"{tf:8.1f}" if tf else "       -"
            note = r.get("error", "") or ("" if r.get("correct") else (r.get("check_failures") or [""])[0][:120])
            print(f"  {r['variant']:20} {r['config']:14} {tf_s} {ratio}  {'yes' if r.get('correct') else 'NO '} {note}")
    for f in failures:
        print(f"compile failed: {f['variant']} {f['config']} {f['case']}: {f['error']}")
    print(f"total {time.time() - t_start:.0f}s")

    out_path = args.json or (os.path.join(os.environ["OUT"], "sweep.json") if os.environ.get("OUT") else None)
    if out_path:
        try:
            import torch

            gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        except Exception:  # noqa: BLE001
            gpu = None
        payload = {
            "gpu": gpu,
            "shape": {"batch": BATCH, "heads": HEADS, "seqlen": SEQLEN},
            "cases": {k: list(v) for k, v in CASES.items() if k in args.cases},
            "baselines": baselines,
            "results": results,
            "compile": [{k: v for k, v in r.items()} for r in compiled + failures],
            "seconds": round(time.time() - t_start, 1),
        }
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(payload, indent=1))
        print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
