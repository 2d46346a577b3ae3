"""The house rules (docs/testing.md's table): the product stays small enough to read, and the
workbench smaller than the product. Each rule is a line a newcomer can check by hand; these
tests check them on every run, so an edit that breaks one fails here, not in a later review.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "fa_kernel"
# A module a reader holds in mind at once; a function that fits on two screens.
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 150
# What the workbench may keep as data in the tree (mutant verdicts, perf results).
MAX_RECORD_BYTES = 200 * 1024


def python_lines(*folders: Path) -> int:
    return sum(len(path.read_text().splitlines()) for folder in folders for path in folder.rglob("*.py"))


def own_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines less those of the functions defined in it (a kernel builder's macros
    and PrimFunc are functions of their own)."""
    nested, stack = 0, list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nested += node.end_lineno - node.lineno + 1
        else:
            stack.extend(ast.iter_child_nodes(node))
    return function.end_lineno - function.lineno + 1 - nested


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    return [
        (node.name, own_lines(node))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and own_lines(node) > limit
    ]


def test_no_module_of_the_package_is_over_the_line_limit():
    long = {path.name: n for path in SRC.rglob("*.py") if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_of_the_package_is_over_the_line_limit():
    found = {path.name: long_functions(path.read_text(), MAX_FUNCTION_LINES) for path in SRC.rglob("*.py")}
    long = {name: functions for name, functions in found.items() if functions}
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines of their own: {long}"


def test_own_lines_leave_out_nested_functions_and_count_the_rest():
    source = "def outer():\n    x = 1\n    def inner():\n        return 2\n    return x\n"
    assert long_functions(source, 2) == [("outer", 3)]  # 5 lines, 2 of them inner's
    assert long_functions(source, 3) == []


def test_the_workbench_is_no_larger_than_the_product():
    workbench, product = python_lines(ROOT / "tools", ROOT / "perf"), python_lines(ROOT / "src")
    assert workbench <= product, f"tools/ and perf/ hold {workbench} lines of Python, src/ {product}"


def test_the_kept_records_are_small():
    kept = [path for folder in ("tools/records", "perf/results") for path in (ROOT / folder).rglob("*")]
    size = sum(path.stat().st_size for path in kept if path.is_file())
    assert size < MAX_RECORD_BYTES, f"tools/records and perf/results hold {size} bytes"


def test_nothing_edits_the_import_path():
    # The folders import each other as packages from the repository root (pyproject's pytest
    # pythonpath), never by editing the interpreter's search path (spelt in two pieces here, so
    # that a grep of the folders for it finds nothing, this test included).
    search_path = "sys" + ".path"
    edits = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("tools", "tests", "perf", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if search_path in line
    ]
    assert edits == []


@pytest.mark.parametrize(
    "script", sorted(path.stem for path in (ROOT / "perf").glob("*.py") if path.stem != "__init__")
)
def test_every_perf_script_imports(script):
    # A script whose imports rot (a name the kernels no longer have) fails here, not on the GPU.
    importlib.import_module(f"perf.{script}")
