"""What the `fa-kernel` commands share: exit codes, dtype names, the console and its tables, and
building kernels over all cores with a progress bar (a line per kernel in a log)."""

from __future__ import annotations

import sys
import time

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from fa_kernel.workbench.builds import build_unless_built, distinct_tasks

EXIT_FAILED, EXIT_NO_GPU, EXIT_COMPILED_ONLY = 1, 2, 3
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def make_console(stderr: bool = False) -> Console:
    """A console that does not fold tables to 80 columns when writing to a file or CI log."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def print_table(console: Console, headers: list[str], rows: list[list[str]], markdown: bool, title: str) -> None:
    if markdown:
        print(f"**{title}**\n")
        print_markdown_row(headers)
        print("|" + "---|" * len(headers), flush=True)
        for row in rows:
            print_markdown_row(row)
        return
    table = Table(*headers, title=title)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def print_markdown_row(cells: list[str]) -> None:
    """One row of a markdown table, flushed: a log read while the run goes on, or cut short, has it."""
    print("| " + " | ".join(cells) + " |", flush=True)


def build_with_progress(
    console: Console, builds: list[dict], jobs: int, verbose: bool, quiet: bool = False, builder=None
) -> bool:
    """Build every kernel over `jobs` processes (`builder`: other kernels than the forward, from
    the builds' arguments; one for all, or one per build), with a progress bar and one line per
    build that fails; True if all built."""
    count = len(distinct_tasks(builds, builder))
    failures = []
    with Progress(console=console, transient=True, disable=quiet) as progress:
        task = progress.add_task(f"building {count} kernels on {jobs} processes", total=count)

        def done(build, seconds, error):
            progress.advance(task)
            if error is not None:
                failures.append(f"  {build_label(build)}: {type(error).__name__}: {error}")
            elif not (quiet or console.is_terminal):
                # A log (CI, a pipe) shows no progress bar: a line per kernel instead.
                finished = int(progress.tasks[0].completed)
                console.print(f"built {finished}/{count}: {build_label(build)} in {seconds:.0f} s")

        start = time.perf_counter()
        errors = build_unless_built(builds, jobs, done, verbose, builder)
    if errors is None:
        if not quiet:
            console.print(f"{count} kernels built already (TileLang's cache holds them)")
        return True
    for line in failures:
        console.print(line)
    if not quiet:
        console.print(f"{count - len(failures)}/{count} kernels built in {time.perf_counter() - start:.0f} s")
    return not failures


def build_label(build: dict) -> str:
    return f"{build['dtype']} head_dim={build['head_dim']} causal={build['causal']} {build.get('config', '')}".rstrip()
