"""Rules the kernel's generated CUDA must keep, read off the source text TileLang emits.

No test's numbers can see an asynchronous operation left running when a thread block exits: the
block's shared memory is handed to the next block on its SM while a wgmma or a TMA store still
reads it, and the outputs come out right unless that block writes it first. PTX requires the
waits (wgmma.wait_group, cp.async.bulk.wait_group.read) before the memory is reused; the block's
exit is that point for the last operations, and a bulk store's source may not be written again
before its read is waited for. So these rules check the code instead:
tests/test_codegen.py on every shipped build, and the mutant runner's triage on every build a
mutant changes (a build that breaks one is a kill, as a build that raises is), both through
`broken_rules`, which also holds every TMA copy's shared side 128-byte aligned. A kernel's own
orderings of its shared buffers are tools/codegen_orders.py's, which triage does not apply: the
triage cache keys its generated-code entries by this file's text.
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


# A bulk (TMA) store from shared memory, and the buffer it reads: `tl::tma_store[_add](` with a
# tensor map first or not, then the source's address.
BULK_STORE = re.compile(r"\btl::tma_store(?:_add)?\((?:\w+, )?\(&\(\(\(\w+\*\)(\w+)\)")
BULK_READ_WAIT = re.compile(r"\btl::tma_store_wait<0\b")


BRACKETS = {"{": "}", "[": "]", "(": ")"}


def closing(source: str, opening: int) -> int:
    """The index of the bracket that closes the one at `opening`."""
    depth = 0
    for index in range(opening, len(source)):
        if source[index] == source[opening]:
            depth += 1
        elif source[index] == BRACKETS[source[opening]]:
            depth -= 1
            if depth == 0:
                return index
    raise ValueError(f"nothing closes the {source[opening]} at {opening}")


def enclosing_loop_body(source: str, position: int) -> tuple[int, int] | None:
    """(start, end) of the body of the innermost `for` loop around `position`, or None."""
    for header in reversed([m for m in re.finditer(r"\bfor \(", source) if m.start() < position]):
        opening = source.index("{", header.end())
        end = closing(source, opening)
        if opening < position < end:
            return opening + 1, end
    return None


def bulk_source_rewritten_in_flight(source: str) -> list[str]:
    """Writes of a bulk store's shared-memory source that can come while the store still reads
    it: for a store issued in a loop, a write of its buffer reached from the store, the rest of
    the iteration then the next one's, with no wait for the stores' reads between (PTX: the
    source may be reused only after cp.async.bulk.wait_group.read). No output shows the race
    unless the write overtakes the copy, which a step's length of work between them hides."""
    problems = []
    for store in BULK_STORE.finditer(source):
        body = enclosing_loop_body(source, store.start())
        if body is None:
            continue
        buffer = store.group(1)
        # A line writing the buffer: it stands left of an assignment, or a stmatrix's target.
        assigned = rf"^[^=\n]*\b{buffer}\b[^=\n]*[^=!<>]=[^=]"
        writes = re.compile(rf"{assigned}|ptx_stmatrix\w*\(\(&\(\(\(\w+\*\){buffer}\)", re.M)
        events = sorted(
            [(m.start(), "wait") for m in BULK_READ_WAIT.finditer(source, *body)]
            + [(m.start(), "write") for m in writes.finditer(source, *body)]
            + [(store.start(), "store")]
        )
        pending = False
        for position, kind in events + events:  # twice: the next iteration follows this one
            if kind == "store":
                pending = True
            elif kind == "wait":
                pending = False
            elif pending:
                line = source.count("\n", 0, position) + 1
                problems.append(
                    f"{buffer}, read by a bulk store at line {source.count(chr(10), 0, store.start()) + 1}, "
                    f"is written at line {line} before a wait for the store's read"
                )
                break
    return problems


def in_order(text: str, *patterns: str) -> bool:
    """Whether the patterns occur in `text` one after another, in this order."""
    position = 0
    for pattern in patterns:
        found = re.compile(pattern).search(text, position)
        if found is None:
            return False
        position = found.end()
    return True


# Bytes of an element of a shared buffer as the generated code casts it.
ELEMENT_BYTES = {"float": 4, "int": 4, "uint": 4, "bfloat16_t": 2, "half_t": 2}
# A TMA tensor copy's shared-memory side must be 128-byte aligned (PTX cp.async.bulk.tensor).
TMA_SHARED_ALIGNMENT = 128


def misaligned_tma_destinations(source: str) -> list[str]:
    """The TMA tensor copies (tl::tma_load or tl::tma_store with a tensor map) whose shared-memory
    address can leave 128-byte alignment, [] if none: the buffer's offset in dynamic shared
    memory and every constant of the index (a stage's or a box's stride, an offset), in bytes,
    must be multiples of 128. No output shows it on the CPU; on the GPU the launch stops with
    "misaligned address" (two stages of 80 fp32 rows, 320 bytes apart, did)."""
    bases = {
        name: int(offset)
        for name, offset in re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\);", source)
    }
    problems = []
    copy = re.compile(r"tl::tma_(?:load|store)\(\w+_desc, (?:[^,]+, )?\(&\(\(\((\w+)\*\)(\w+)\)\[")
    for match in copy.finditer(source):
        element, buffer = match.groups()
        index = source[match.end() - 1 : closing(source, match.end() - 1) + 1]
        size = ELEMENT_BYTES.get(element, 1)
        constants = [int(c) for c in re.findall(r"(?:[*+-] |\[)\(?(\d+)\)?(?=\)|\]| )", index)]
        offsets = [bases.get(buffer, 0)] + [c * size for c in constants]
        if any(offset % TMA_SHARED_ALIGNMENT for offset in offsets):
            problems.append(f"{buffer}{index}: offsets {offsets} bytes, not all multiples of {TMA_SHARED_ALIGNMENT}")
    return problems


# The rules every build is held to: the shipped ones by tests/test_codegen.py, each mutant's by
# the triage (a build that breaks one is a kill).
BUILD_RULES = (outstanding_at_exit, bulk_source_rewritten_in_flight, misaligned_tma_destinations)


def broken_rules(source: str) -> list[str]:
    """What the generated CUDA `source` breaks of BUILD_RULES, [] if nothing."""
    return [problem for rule in BUILD_RULES for problem in rule(source)]
