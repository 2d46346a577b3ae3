"""What perf/backward_ab.py and perf/decode_ab.py share: their command line, and the table of
variants timed alternated in one process against the shipped kernel, round by round."""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import os
import re
import statistics
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from fa_kernel.workbench.bench import alternated


def arguments(
    description: str,
    variants: Iterable[str],
    repeats: int,
    more: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[argparse.Namespace, list[str]]:
    """(the parsed command line, the variants to measure: 'shipped' first, always); `more` adds a
    script's own options to the parser."""
    names = list(variants)
    parser = argparse.ArgumentParser(description=description)
    if more is not None:
        more(parser)
    parser.add_argument("--variants", nargs="+", default=names, help="shipped is always measured")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    parser.add_argument("--compile-only", metavar="ARCH", help="compile every variant for ARCH (sm_90a), no GPU")
    args = parser.parse_args()
    if unknown := sorted(set(args.variants) - set(names)):
        parser.error(f"--variants: expected names among {', '.join(names)}, got {unknown}")
    return args, ["shipped", *[name for name in args.variants if name != "shipped"]]


def within_the_bound(variants: list[str], failures: Callable[[str], Iterable[str]]) -> list[str] | None:
    """The variants none of whose checks fail (`failures(name)`: what failed, as text), each
    failure printed: a variant outside the bound is left out of the timing. None where the
    shipped kernel itself fails."""
    failed = set()
    for name in variants:
        for failure in failures(name):
            print(f"{name}: FAILED {failure}", flush=True)
            failed.add(name)
    if "shipped" in failed:
        return None
    return [name for name in variants if name not in failed]


def print_header(unit: str, variants: list[str]) -> None:
    """The table's head: `variants`' columns, the first the base of the ratios (print_row)."""
    others = [f"{name} / {variants[0]}" for name in variants[1:]]
    print(f"{unit}, medians of the rounds; each variant's ratio to {variants[0]} round by round (range)\n")
    print(f"| shape | {' | '.join(variants)} | {' | '.join(others)} |")
    print("|---|" + "---|" * (len(variants) + len(others)))


def print_row(label: str, timers: dict[str, Callable[[], float]], rounds: int) -> None:
    """Time `timers` (variant -> one figure, higher is faster; the first the base of the ratios,
    'shipped' in the A/B scripts) alternated over `rounds` and print the shape's row."""
    samples = alternated(timers, rounds)
    medians = " | ".join(f"{statistics.median(figures):.0f}" for figures in samples.values())
    base_name, ratios = next(iter(samples)), []
    for name, figures in samples.items():
        if name != base_name:
            each = [ours / base for ours, base in zip(figures, samples[base_name], strict=True)]
            ratios.append(f"{statistics.median(each):.3f}x ({min(each):.3f}-{max(each):.3f})")
    print(f"| {label} | {medians} | {' | '.join(ratios)} |", flush=True)


@functools.cache
def module_copy(module, name: str):
    """A copy of `module` (one of fa_kernel's kernel modules) under a name of its own, so that a
    variant may edit its tables without touching the shipped module's or its kernel caches;
    imported from a file, as TileLang reads a kernel's source from its module's file."""
    stem = Path(module.__file__).stem
    source = Path(module.__file__).read_text()
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    slug = re.sub(r"\W", "_", name)  # a variant's name may hold spaces and dashes; a module's may not
    path = Path(tempfile.gettempdir()) / "fa_kernel_variants" / f"{stem}_{slug}_{digest}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: two processes may copy the same module at once, and TileLang
    # re-reads the file; a half-written one fails with "could not get source code".
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(source)
    os.replace(partial, path)
    spec = importlib.util.spec_from_file_location(f"fa_kernel_{stem}_variant_{slug}", path)
    variant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(variant)
    return variant
