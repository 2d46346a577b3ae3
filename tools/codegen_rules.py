"""Rules the kernel's generated CUDA must keep, read off the source text TileLang emits.

No test's numbers can see an asynchronous operation left running when a thread block exits: the
block's shared memory is handed to the next block on its SM while a wgmma or a TMA store still
reads it, and the outputs come out right unless that block writes it first. PTX requires the
waits (wgmma.wait_group, cp.async.bulk.wait_group.read) before the memory is reused; the block's
exit is that point for the last operations. So these rules check the code instead:
tests/test_codegen.py on every shipped build, and the mutant runner's triage on every build a
mutant changes (a build that breaks one is a kill, as a build that raises is).
"""

from __future__ import annotations

import re

# (what is left running, the operations that start it, the wait that ends all of it). TileLang
# spells wgmma.wait_group 0 as wait_wgmma<0> (T.wait_wgmma) or warpgroup_wait<0> (after T.gemm).
ASYNC_OPERATIONS = (
    ("a wgmma", re.compile(r"\btl::wgmma_\w+<"), re.compile(r"\btl::(?:wait_wgmma|warpgroup_wait)<0>\(")),
    ("a TMA store", re.compile(r"\btl::tma_store_arrive\("), re.compile(r"\btl::tma_store_wait<0\b")),
)


def waited_after(source: str, start: int, wait: re.Pattern) -> bool:
    """Whether a `wait` follows position `start` of `source` outside every block (`{...}`) opened
    after `start`: one that an `if` or a loop entered after the operation does not guard."""
    depth = lowest = 0  # braces opened since `start` and still open; the fewest since (< 0: left)
    for match in re.finditer(r"[{}]|" + wait.pattern, source[start:]):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            lowest = min(lowest, depth)
        elif depth == lowest:
            return True
    return False


def outstanding_at_exit(source: str) -> list[str]:
    """What may still be running when the kernel in `source` exits: for each kind of asynchronous
    operation, a message where no wait for all of it follows the last one the source starts."""
    problems = []
    for what, start, wait in ASYNC_OPERATIONS:
        starts = list(start.finditer(source))
        if starts and not waited_after(source, starts[-1].end(), wait):
            line = source.count("\n", 0, starts[-1].start()) + 1
            problems.append(f"{what} started at line {line} of the generated CUDA is not waited for before the exit")
    return problems
