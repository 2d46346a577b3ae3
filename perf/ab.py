"""What perf/backward_ab.py and perf/decode_ab.py share: their command line, and the table of
variants timed alternated in one process against the shipped kernel, round by round."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterable

from fa_kernel.bench import alternated


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
