"""`python -m tools.mutants`: the command (see the package's docstring)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import tools.mutants
from tools.ast_mutants import generate
from tools.equivalent_mutants import BITWISE
from tools.mutants import ROOT
from tools.mutants.catalogue import EMULATOR_MUTANTS, KERNEL_MUTANTS
from tools.mutants.records import VERDICTS, append_record, cpu_tier_passed, load_record, recorded_kills
from tools.mutants.runner import prebuild, run_mutant, stop_running_tiers
from tools.mutants.tiers import (
    BUILD_SECONDS,
    PYTEST_ARGS,
    bitwise_seed_folder,
    first_build_tiers,
    first_tier_seconds,
    gpu_count,
    mutant_tiers,
    precompile_args,
    run_script,
    seed_readable,
    smoke_nodes_by_build,
    tilelang_cache,
    unmutated_env,
    unmutated_failures,
)
from tools.mutants.triage import (
    GENERATED_FILES,
    GPU_TARGETS,
    PROGRAM_BUILDERS,
    prune_cache,
    recorded_equivalents,
    triage,
    triage_programs,
)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.mutants", description=tools.mutants.__doc__.split("\n\n")[0].replace("\n", " ")
    )
    parser.add_argument("--target", choices=sorted(PYTEST_ARGS), default="kernel")
    parser.add_argument("--generated", action="store_true", help="the generated mutants (tools/ast_mutants.py)")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop (no GPU)")
    parser.add_argument("--triage-only", action="store_true", help="generated: run the CPU triage and stop")
    parser.add_argument("--only", nargs="+", help="run these mutants only (names or generated ids)")
    parser.add_argument("--functions", nargs="+", help="generated: only mutants inside these functions")
    parser.add_argument(
        "--smoke-only", action="store_true", help="stop after the smoke tier: its survivors are reported, not run"
    )
    parser.add_argument(
        "--first-build-only",
        action="store_true",
        help="the cheapest kills: stop after the smoke tier of each mutant's first changed build (one compile); "
        "its survivors are reported, and run whole later",
    )
    parser.add_argument("--cpu-only", action="store_true", help="run the CPU tier only (no GPU needed)")
    parser.add_argument(
        "--status",
        action="store_true",
        help="print each mutant's verdict so far (triage, the checked equivalents, --record) and stop (no GPU)",
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip running the tiers' tests on the unmutated kernel first (they must pass for a kill to mean anything)",
    )
    parser.add_argument("--jobs", type=int, default=None, help="mutants at once (default: 2 per GPU, at least 4)")
    parser.add_argument("--keep", metavar="DIR", help="keep logs here")
    parser.add_argument("--select", nargs="+", metavar="TEST", help="run only these pytest node ids, every case")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one mutant's tests may run")
    parser.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="end the run this many seconds after it starts (triage and the seeding included): a mutant whose "
        "first compiling tier is not expected to end by then is not started, one still running then is stopped "
        "(neither is recorded)",
    )
    parser.add_argument("--sm-count", type=int, default=132, help="the GPU's SM count, for triage's shipped builds")
    parser.add_argument(
        "--prebuild",
        type=Path,
        metavar="DIR",
        help="no GPU: compile for sm_90a, into the TileLang cache DIR, every sweep build the selected kernel.py "
        "mutants change (for backward.py and decode.py mutants, every build their own tests launch), then stop; a "
        "GPU host that merges DIR into its TileLang cache (the seed) loads them instead of compiling (run it there "
        "with --build-seconds 5)",
    )
    parser.add_argument(
        "--build-seconds",
        type=float,
        default=BUILD_SECONDS,
        help=f"--deadline's estimate of a tier's time per kernel it builds (default {BUILD_SECONDS}: a compile "
        "with a mutant per core)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        metavar="FILE.jsonl",
        help="append each verdict here, and skip mutants this file already judged on the same source and tests "
        "(a run cut short resumes where it stopped)",
    )
    parser.add_argument(
        "--triage-cache",
        type=Path,
        default=Path("~/.cache/fa-kernel/mutant-triage.json").expanduser(),
        help="each mutated kernel's PrimFunc digests, kept between runs (and machines: copy it along)",
    )
    parser.add_argument(
        "--seed-cache",
        type=Path,
        default=None,
        help="TileLang cache of the unmutated build, linked into each mutant's own (TileLang's own cache, "
        "filled by tools/precompile.py first, by default)",
    )
    args = parser.parse_args()
    run_start = time.perf_counter()
    for stop in (signal.SIGTERM, signal.SIGINT):  # a time limit, or Ctrl-C
        signal.signal(stop, stop_running_tiers)

    if args.generated:
        files = GENERATED_FILES[args.target]
        mutants: list = generate(files=files) if files else generate()
    else:
        if args.target in ("backward", "decode"):
            parser.error("target: the backward's and split-KV kernels' hand-written mutants are the kernel target's")
        mutants = KERNEL_MUTANTS if args.target == "kernel" else EMULATOR_MUTANTS
    if args.only:
        mutants = [m for m in mutants if m.id in args.only]
    if args.functions:
        mutants = [m for m in mutants if m.function in args.functions]
    if args.list:
        for mutant in mutants:
            print(mutant.line_for_list() if args.generated else f"{mutant.name}  {mutant.file}")
        print(f"{len(mutants)} mutants")
        return 0

    settled: dict[str, tuple[str, str]] = {}
    # mutant id: the sweep builds (ids) its kernel differs on; a gradient mutant's, triage's build dicts
    changed: dict[str, list] = {}
    if args.target == "kernel" and not args.select:
        from suite.boundaries import build_id

        start = time.perf_counter()
        found = triage(mutants, os.cpu_count() or 1, args.sm_count, args.triage_cache)
        changed = {key: [build_id(build) for build in builds] for key, builds in found.changed_builds.items()}
        if args.generated:
            settled = found.verdicts
            settled.update(recorded_equivalents([m for m in mutants if m.id not in settled]))
        else:
            # A hand-written bug that changes no kernel is a defect of the list, not a verdict;
            # one whose own tests build a kernel triage does not (test_kernel's schedules) runs them.
            first = {m.id for m in mutants if m.first}
            settled = {
                key: ("ERROR", "changes no kernel: " + reason) if verdict == "equivalent" else (verdict, reason)
                for key, (verdict, reason) in found.verdicts.items()
                if not (verdict == "equivalent" and key in first)
            }
        counts = Counter(verdict for verdict, _ in settled.values())
        print(
            f"triage: {counts['equivalent']} equivalent (identical kernels, or recorded and checked),"
            f" {counts['killed']} killed at build, of {len(mutants)}; {len(changed)} to run, on"
            f" {sum(map(len, changed.values()))} changed sweep builds ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        if args.triage_only:
            if args.triage_cache is not None and args.triage_cache.exists():
                kept, dropped = prune_cache(args.triage_cache, args.sm_count)
                print(f"triage cache: {kept} entries kept, {dropped} no source uses any more dropped")
            for mutant in mutants:
                verdict = settled.get(mutant.id, ("to run", ""))[0]
                builds = f"  [{len(changed[mutant.id])} sweep builds]" if mutant.id in changed else ""
                line = mutant.line_for_list() if args.generated else f"{mutant.name}  {mutant.file}"
                print(f"{verdict:<10}  {line}{builds}")
            return 0
    if args.generated and args.target == "emulator":
        settled.update(recorded_equivalents(mutants))
    if args.generated and args.target in ("backward", "decode") and not args.select:
        start = time.perf_counter()
        found = triage_programs(mutants, os.cpu_count() or 1, args.triage_cache)
        settled, changed = found.verdicts, found.changed_builds
        counts = Counter(verdict for verdict, _ in settled.values())
        print(
            f"triage: {counts['equivalent']} equivalent (identical PrimFuncs), {counts['killed']} killed at build,"
            f" of {len(mutants)} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        if args.triage_only:
            for mutant in mutants:
                print(f"{settled.get(mutant.id, ('to run', ''))[0]:<10}  {mutant.line_for_list()}")
            return 0
    if args.record is not None:
        # A recorded kill outweighs a recorded reason: that reason is wrong, and is said so.
        for key, (verdict, detail, _) in recorded_kills(args.record, mutants).items():
            if settled.get(key, ("",))[0] == "equivalent":
                print(f"{key}: recorded as equivalent in tools/equivalent_mutants.py, but killed: {detail}")
            settled[key] = (verdict, detail)
    to_run = [m for m in mutants if m.id not in settled]
    smoke_nodes = smoke_nodes_by_build() if args.target == "kernel" and not args.select else {}
    tiers = {
        m.id: [("selected", ["-rf", *args.select])]
        if args.select
        else mutant_tiers(m, args.target, changed.get(m.id), smoke_nodes, args.smoke_only, args.cpu_only)
        for m in to_run
    }
    whole_tiers = tiers
    if args.first_build_only:
        tiers, deferred = first_build_tiers(whole_tiers)
        settled.update({key: ("NOT RUN", why) for key, why in deferred.items()})
        to_run = [m for m in to_run if m.id not in deferred]
    recorded: dict[str, tuple[str, str, float]] = {}
    if args.record is not None:
        recorded = load_record(args.record, to_run, whole_tiers)  # a verdict on every build holds for the first
        recorded.update(load_record(args.record, [m for m in to_run if m.id not in recorded], tiers))
        to_run = [m for m in to_run if m.id not in recorded]
        print(f"{len(recorded)} verdicts taken from {args.record}, {len(to_run)} mutants to run", flush=True)
    if args.status:
        # Where a run stands, without running anything: triage's verdicts, the CPU-checked
        # equivalents and the record's, and the tiers each other mutant would run.
        known = {**{key: (*verdict, 0.0) for key, verdict in settled.items()}, **recorded}
        for mutant in mutants:
            if mutant.id in known:
                verdict, detail, _ = known[mutant.id]
            else:
                verdict, detail = "to run", " > ".join(name for name, _ in tiers[mutant.id])
            print(f"{mutant.id:<48}  {verdict:<10}  {detail[:110]}")
        counts = Counter(verdict for verdict, _, _ in known.values())
        print(
            f"\nkilled / equivalent / survived: {counts['killed']} / {counts['equivalent']} / {counts['SURVIVED']},"
            f" not yet judged {len(mutants) - sum(counts.values()) + counts['NOT RUN']} of {len(mutants)}"
        )
        return 0

    if args.prebuild is not None:
        kernels = ("kernel.py", *PROGRAM_BUILDERS)
        if args.first_build_only:  # the build its first smoke tier compiles (mutant_tiers: changed[0])
            changed = {key: builds[:1] for key, builds in changed.items()}
        return prebuild([m for m in to_run if m.file in kernels], changed, args.prebuild, args.jobs)
    if args.seed_cache is None:  # resolved only here: --list runs where TileLang is not installed
        args.seed_cache = tilelang_cache()
    gpus = gpu_count() if args.target in GPU_TARGETS and not args.cpu_only else 0
    if args.target in GPU_TARGETS and not args.cpu_only and not gpus:
        # Without one the GPU tiers' tests fail (FA_KERNEL_REQUIRE_GPU), which would read as kills.
        parser.error("the kernel's mutants need a CUDA device (--list, --triage-only and --cpu-only do not)")
    if gpus and args.seed_cache.resolve() == tilelang_cache().resolve():
        # Seed the mutants' caches with every kernel of the unmutated suite: a kernel a mutant
        # leaves alone then loads instead of compiling in each mutant's own cache.
        command = [*run_script("tools/precompile.py"), *precompile_args(tiers.values(), args.target)]
        subprocess.run(command, cwd=ROOT, check=True)
    if gpus and to_run and not args.no_baseline:
        failing = unmutated_failures(tiers.values())
        if failing:
            # Every mutant would read as killed by these: a kill means something only where the
            # unmutated kernel passes.
            print(f"the unmutated kernel fails tests the mutants' tiers run: {', '.join(failing[:5])}")
            return 2
    bitwise_builds = sorted(
        {build for m in to_run for name, tier_args in tiers[m.id] if name == "bitwise" for build in tier_args[1:]}
    )
    bitwise_seed = None
    if gpus and bitwise_builds:
        # The unmutated kernel's bits, for the mutants whose recorded reason is checked bitwise:
        # recorded once per host and source (a minute and more for the 12 builds).
        bitwise_seed = bitwise_seed_folder()
        missing = [build for build in bitwise_builds if not seed_readable(bitwise_seed, build)]
        if missing:
            command = [*run_script(BITWISE), "record", str(bitwise_seed), *missing]
            subprocess.run(command, cwd=ROOT, env=unmutated_env(), check=True)
    # A mutant's smoke tier is mostly one kernel's compile, on one core: one mutant per core.
    jobs = args.jobs or max(4, os.cpu_count() or 1)
    # Each mutant's share of the cores for torch's CPU threads (its tests draw inputs and compare
    # there): by default every process starts one per core, mutants x cores threads on the cores.
    running = max(1, min(jobs, len(to_run)))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // running)))
    if gpus:  # each mutant's share of its GPU's memory (tests/conftest.py applies it)
        os.environ.setdefault("FA_KERNEL_GPU_MEMORY_FRACTION", f"{0.9 / -(-running // gpus):.3f}")
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="fa-mutants-"))
    workdir.mkdir(parents=True, exist_ok=True)
    width = max([len(m.id) for m in mutants] + [6])
    # The longest first tiers first: a run cut by --deadline (or a time limit) then ends on short ones.
    to_run.sort(key=lambda m: -first_tier_seconds(tiers[m.id], args.build_seconds))
    started = time.perf_counter()
    stop_at = None if args.deadline is None else run_start + args.deadline
    # Each result is printed as it comes (a run cut short still shows what it finished), then
    # the table in the list's order. Mutant i runs on GPU i mod gpus.
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            pool.submit(
                run_mutant,
                mutant,
                args.target,
                workdir,
                tiers[mutant.id],
                args.timeout,
                index % gpus if gpus else None,
                args.seed_cache,
                bool(args.select),
                bitwise_seed,
                stop_at,
                args.build_seconds,
            ): mutant
            for index, mutant in enumerate(to_run)
        }
        outcomes = {}
        for done in as_completed(futures):
            status, detail, seconds = done.result()
            mutant = futures[done]
            if args.cpu_only and args.target in GPU_TARGETS:
                status, detail, seconds = cpu_tier_passed(status, detail, seconds)
            outcomes[mutant.id] = (status, detail, seconds)
            print(f"{mutant.id:<{width}}  {status:<10}  {seconds:7.1f}  {detail}", flush=True)
            if args.record is not None:
                append_record(args.record, mutant, tiers[mutant.id], (status, detail, seconds))
    outcomes.update(recorded)
    outcomes.update({mutant_id: (verdict, reason, 0.0) for mutant_id, (verdict, reason) in settled.items()})
    print(f"\n{'mutant':<{width}}  result      seconds  first failing test / reason")
    for mutant in mutants:
        status, detail, seconds = outcomes[mutant.id]
        print(f"{mutant.id:<{width}}  {status:<10}  {seconds:7.1f}  {detail}")
    counts = Counter(status for status, _, _ in outcomes.values())
    survived = len(mutants) - counts["killed"] - counts["equivalent"]
    print(f"logs in {workdir}")
    # Which tier killed each: the smoke tier's share is what a mutant costs without the suite.
    tier_of = Counter(
        re.sub(r"^smoke on .*", "smoke", detail.split(":")[0])
        for status, detail, _ in outcomes.values()
        if status == "killed"
    )
    print("killed by: " + ", ".join(f"{tier} {count}" for tier, count in tier_of.most_common()))
    others = ", ".join(f"{status} {count}" for status, count in sorted(counts.items()) if status not in VERDICTS)
    print(
        f"\nkilled / equivalent / survived: {counts['killed']} / {counts['equivalent']} / {counts['SURVIVED']}"
        + (f" (and {others})" if others else "")
        + f" of {len(mutants)} ({args.target}, {gpus} GPU(s), {time.perf_counter() - started:.0f} s)"
    )
    return 0 if survived == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
