"""The mutation engine of tools/ast_mutants.py (CPU, no TileLang): the mutants it generates from
the kernel's source as it is now, and the exact mutants of small synthetic modules."""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

import pytest
from tools.ast_mutants import FILES, OPERATORS, ROOT, generate, main  # noqa: E402


@pytest.fixture(scope="module")
def mutants():
    return generate()


def _source(file: str, root: Path = ROOT) -> str:
    with open(root / file, encoding="utf-8", newline="") as f:
        return f.read()


def _find(mutants, function, operator, before, after):
    found = [
        m
        for m in mutants
        if m.function == function and m.operator == operator and m.before == before and m.after == after
    ]
    assert len(found) == 1, f"{function} {operator}: {before} -> {after}: {len(found)} found"
    return found[0]


def test_every_mutant_parses_and_changes_its_file(mutants):
    originals = {file: _source(file) for file in {m.file for m in mutants}}
    for m in mutants:
        mutated = m.mutated_source()
        assert mutated != originals[m.file], m.id
        ast.parse(mutated, filename=m.file)


def test_no_two_mutants_give_the_same_file(mutants):
    assert len({(m.file, m.mutated_source()) for m in mutants}) == len(mutants)


def test_ids_and_keys_are_unique(mutants):
    assert len({m.id for m in mutants}) == len(mutants)
    assert len({m.key for m in mutants}) == len(mutants)


def test_mutants_are_ordered_by_file_line_column_operator(mutants):
    order = [(FILES.index(m.file), m.line, m.col, m.operator) for m in mutants]
    assert order == sorted(order)


@pytest.mark.parametrize("operator", OPERATORS)
def test_every_operator_mutates_the_kernel(mutants, operator):
    # The forward kernel and its parts: its constants live in pipeline.py.
    kernel_files = ("kernel.py", "pipeline.py", "mask.py", "softmax.py")
    assert any(m.file in kernel_files and m.operator == operator for m in mutants)


def test_every_file_has_mutants(mutants):
    assert {m.file for m in mutants} == set(FILES)


def test_known_mutants_exist(mutants):
    _find(
        mutants,
        "tile_needs_mask",
        "relational",
        "kv_start + block_n > self.seqlen_k",
        "kv_start + block_n >= self.seqlen_k",
    )
    tile = _find(
        mutants,
        "kv_end",
        "off_by_one",
        "T.ceildiv(rule.keys_before(q_start + block_m), block_n)",
        "T.ceildiv((rule.keys_before(q_start + block_m) + 1), block_n)",
    )
    assert tile.id.startswith("scheduler-kv_end-off_by_one-")
    _find(
        mutants,
        "warpgroup_kv_blocks",
        "min_max",
        "T.min(first_row + rows_per_warpgroup, rule.seqlen_q)",
        "T.max(first_row + rows_per_warpgroup, rule.seqlen_q)",
    )
    limit = _find(mutants, "<module>", "constant", "STALE_SUM_LIMIT = 4096.0", "STALE_SUM_LIMIT = 8192.0")
    assert limit.id == "numerics-STALE_SUM_LIMIT-constant-1"
    # Python-level branches are the kernel's too.
    _find(mutants, "tile_needs_mask", "guard_never", "self.limits_right", "False")
    # A guard of tile logic, and an index that is computed (not a bare name).
    _find(
        mutants,
        "place_in_round",
        "guard_always",
        "T.if_then_else(tile_round % 2 == 0, worker, workers - 1 - worker)",
        "worker",
    )
    _find(
        mutants,
        "epilogue",
        "off_by_one",
        "LSE[b, head, q_start + i]",
        "LSE[b, head, (q_start + i + 1)]",
    )
    _find(
        mutants,
        "forward_program",
        "or_and",
        "config.take_turns and warpgroups > 1",
        "config.take_turns or warpgroups > 1",
    )


def test_validation_is_not_mutated(mutants):
    source = _source("kernel.py").split("\n")
    validation = [n for n, line in enumerate(source, 1) if "raise ValueError" in line or "if consumers % 128" in line]
    assert validation
    assert not [m.id for m in mutants if m.file == "kernel.py" and m.line in validation]
    # Nothing inside a raise's message either (its f-string spans the lines after `raise`).
    tree = ast.parse("\n".join(source))
    raised = {
        line
        for node in ast.walk(tree)
        if isinstance(node, ast.Raise)
        for line in range(node.lineno, node.end_lineno + 1)
    }
    assert not [m.id for m in mutants if m.file == "kernel.py" and m.line in raised]


def test_bare_indices_and_signatures_are_not_mutated(mutants):
    assert not [m for m in mutants if m.before.startswith("acc_s[i, j]")]
    assert not [m for m in mutants if "T.Tensor" in m.before or "T.dynamic" in m.before]
    # panel_columns(panel) is a slice: its bounds are mutated inside panel_columns instead.
    assert not [m for m in mutants if "(panel_columns(panel) + 1)" in m.after]
    assert [m for m in mutants if m.function == "panel_columns" and m.operator == "off_by_one"]


def test_a_mutant_changes_only_its_own_lines(mutants):
    for m in mutants:
        original = _source(m.file).splitlines()
        mutated = m.mutated_source().splitlines()
        lost = m.last_line - m.first_line + 1 - (m.replacement.count("\n") + 1)
        assert len(mutated) == len(original) - lost, m.id
        # Lines before the span and after it are the same lines.
        assert mutated[: m.first_line - 1] == original[: m.first_line - 1], m.id
        assert mutated[m.last_line - lost :] == original[m.last_line :], m.id
        changed = [
            line
            for tag, i1, i2, _, _ in difflib.SequenceMatcher(a=original, b=mutated, autojunk=False).get_opcodes()
            if tag != "equal"
            for line in range(i1 + 1, i2 + 1)
        ]
        assert changed and all(m.first_line <= line <= m.last_line for line in changed), m.id
        assert m.first_line <= m.line <= m.last_line


def test_a_mutant_refuses_a_file_that_changed(tmp_path):
    (tmp_path / "m.py").write_text("def f(a, b):\n    return a < b\n")
    (mutant,) = [m for m in generate(tmp_path, ["m.py"]) if m.operator == "relational"]
    (tmp_path / "m.py").write_text("def f(a, b):\n    return b < a\n")
    with pytest.raises(ValueError, match="changed"):
        mutant.mutated_source()


def test_synthetic_module(tmp_path):
    (tmp_path / "m.py").write_text("def f(a, b):\n    if a < b:\n        return T.min(a, b)\n")
    got = [(m.id, m.line, m.col, m.operator, m.before, m.after) for m in generate(tmp_path, ["m.py"])]
    assert got == [
        ("m-f-guard_always-1", 2, 7, "guard_always", "a < b", "True"),
        ("m-f-guard_never-1", 2, 7, "guard_never", "a < b", "False"),
        ("m-f-off_by_one-1", 2, 7, "off_by_one", "a < b", "(a + 1) < b"),
        ("m-f-off_by_one-2", 2, 7, "off_by_one", "a < b", "(a - 1) < b"),
        ("m-f-relational-1", 2, 9, "relational", "a < b", "a <= b"),
        ("m-f-off_by_one-3", 2, 11, "off_by_one", "a < b", "a < (b + 1)"),
        ("m-f-off_by_one-4", 2, 11, "off_by_one", "a < b", "a < (b - 1)"),
        ("m-f-min_max-1", 3, 15, "min_max", "T.min(a, b)", "T.max(a, b)"),
    ]
    (guard_never,) = [m for m in generate(tmp_path, ["m.py"]) if m.operator == "guard_never"]
    assert guard_never.mutated_source() == "def f(a, b):\n    if False:\n        return T.min(a, b)\n"
    assert guard_never.key == "m.py:f:guard_never:a < b->False"


def test_synthetic_scope_dedupe_and_spans(tmp_path):
    (tmp_path / "m.py").write_text(
        "ZERO = 0\n"
        "HALF = 0.5\n"
        "PAIR = (1, 2)\n"
        "lower = 3\n"
        "def g(x, n):\n"
        '    """Docstring: a < b."""\n'
        "    if n < 0:\n"
        '        raise ValueError(f"n: {n < 0}")\n'
        "    assert x >= 0\n"
        "    y = T.if_then_else(x > 1, x, x)  # always and never give the same file\n"
        "    def inner(z):\n"
        "        return z[n + 1, n] if z and n or x else T.Or(  # spans lines\n"
        "            z > 1, n\n"
        "        )\n"
        "    if True:\n"
        '        s = "é"; return s[n - 1 :]\n'
    )
    mutants = generate(tmp_path, ["m.py"])
    listed = [(m.id, m.line, m.operator, m.before, m.after) for m in mutants]
    assert listed == [
        # ZERO * 2 and ZERO // 2 are ZERO: dropped; tuples and lower-case names are not constants.
        ("m-ZERO-constant-1", 1, "constant", "ZERO = 0", "ZERO = 1"),
        ("m-ZERO-constant-2", 1, "constant", "ZERO = 0", "ZERO = -1"),
        ("m-HALF-constant-1", 2, "constant", "HALF = 0.5", "HALF = 1.0"),
        ("m-HALF-constant-2", 2, "constant", "HALF = 0.5", "HALF = 0.25"),
        ("m-HALF-constant-3", 2, "constant", "HALF = 0.5", "HALF = 1.5"),
        ("m-HALF-constant-4", 2, "constant", "HALF = 0.5", "HALF = -0.5"),
        # The validation (`if ...: raise`), the assert and the docstring give nothing.
        ("m-g-guard_always-1", 10, "guard_always", "T.if_then_else(x > 1, x, x)", "x"),
        # guard_never gives the same file: dropped.
        ("m-g-off_by_one-1", 10, "off_by_one", "x > 1", "(x + 1) > 1"),
        ("m-g-off_by_one-2", 10, "off_by_one", "x > 1", "(x - 1) > 1"),
        ("m-g-relational-1", 10, "relational", "x > 1", "x >= 1"),
        ("m-g-off_by_one-3", 10, "off_by_one", "x > 1", "x > 2"),
        ("m-g-off_by_one-4", 10, "off_by_one", "x > 1", "x > 0"),
        ("m-inner-off_by_one-1", 12, "off_by_one", "z[n + 1, n]", "z[(n + 1 + 1), n]"),
        ("m-inner-off_by_one-2", 12, "off_by_one", "z[n + 1, n]", "z[(n + 1 - 1), n]"),
        ("m-inner-guard_always-1", 12, "guard_always", "z and n or x", "True"),
        ("m-inner-guard_never-1", 12, "guard_never", "z and n or x", "False"),
        ("m-inner-or_and-1", 12, "or_and", "z and n", "z or n"),
        ("m-inner-or_and-2", 12, "or_and", "z and n or x", "z and n and x"),
        ("m-inner-or_and-3", 12, "or_and", "T.Or(  # spans lines z > 1, n )", "T.And(  # spans lines z > 1, n )"),
        ("m-inner-off_by_one-3", 13, "off_by_one", "z > 1", "(z + 1) > 1"),
        ("m-inner-off_by_one-4", 13, "off_by_one", "z > 1", "(z - 1) > 1"),
        ("m-inner-relational-1", 13, "relational", "z > 1", "z >= 1"),
        ("m-inner-off_by_one-5", 13, "off_by_one", "z > 1", "z > 2"),
        ("m-inner-off_by_one-6", 13, "off_by_one", "z > 1", "z > 0"),
        # `if True:` always is the file itself: dropped.
        ("m-g-guard_never-1", 15, "guard_never", "True", "False"),
        ("m-g-off_by_one-5", 16, "off_by_one", "s[n - 1 :]", "s[(n - 1 + 1) :]"),
        ("m-g-off_by_one-6", 16, "off_by_one", "s[n - 1 :]", "s[(n - 1 - 1) :]"),
    ]
    # Columns count characters, not the UTF-8 bytes of ast's col_offset.
    (after_accent,) = [m for m in mutants if m.id == "m-g-off_by_one-5"]
    assert after_accent.col == len('        s = "é"; return s[')
    # A span over several lines keeps them; the rest of the file is untouched.
    (multi_line,) = [m for m in mutants if m.id == "m-inner-or_and-3"]
    assert (multi_line.first_line, multi_line.last_line) == (12, 14)
    assert multi_line.mutated_source() == _source("m.py", tmp_path).replace("T.Or(", "T.And(")


def test_cli_lists_and_filters(capsys):
    assert main(["--list", "--file", "scheduler.py", "--operator", "min_max"]) == 0
    lines = capsys.readouterr().out.strip().split("\n")
    assert lines[-1].startswith(f"{len(lines) - 1} mutants: scheduler.py {len(lines) - 1} (min_max {len(lines) - 1})")
    assert all(" scheduler.py:" in line and "  min_max  " in line and " -> " in line for line in lines[:-1])
