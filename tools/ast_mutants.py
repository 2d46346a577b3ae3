"""Generate the kernel's mutants from its source: small rewrites, each of one spot, that a
test suite worth its GPU time should notice.

    python -m tools.ast_mutants --list                       # every mutant, then a count
    python -m tools.ast_mutants --list --file kernel.py --operator relational

Operators (the names are what `--operator` takes and what ids and keys carry):

- relational: one comparison operator swapped, `<` <-> `<=`, `>` <-> `>=`, `==` <-> `!=`;
- off_by_one: an integer expression made one larger or one smaller (`(expr + 1)`, `(expr - 1)`,
  or the next literal): each operand of an ordering or equality comparison, each argument of
  `T.ceildiv(...)`, each bound of a slice (`a:b`, and the builtin `slice(a, b)`), and each index
  of a subscript that is not a bare name or literal (`LSE[b, head, q_start + i]` mutates
  `q_start + i`; `acc_s[i, j]` mutates nothing);
- min_max: `T.min` <-> `T.max` (and the builtin `min` <-> `max` of the Python-level helpers);
- or_and: `T.Or` <-> `T.And`, and every `and` / `or` of one Python boolean expression swapped;
- guard_always / guard_never: a branch taken always / never: an `if` statement's (or a
  conditional expression's) test replaced by `True` / `False`, `T.if_then_else(c, a, b)` by `a`
  / `b`. Python-level tests such as `if causal:` count: they choose the kernel's code;
- constant: a named module-level number (`UPPER_CASE = <int or float literal>`) times 2,
  halved (`//` for ints), plus 1 and minus 1. Tuples and computed values are left alone.

Scope (each mutant costs a GPU run): in kernel.py everything inside `forward_program` (its
nested helpers and the `@T.prim_func` included) and the module-level constants; in pipeline.py
the bodies of `consumer_registers`, `own_output_buffer` and `pipeline_parts`, and its constants;
in epilogue.py `epilogue_parts`; in mask.py the methods of `Visibility` and
`forward_score_parts`, in softmax.py everything inside `online_softmax` (the parts every
kernel shares); in interface.py the bodies of `_attention` and `forward_kernel_attention` (the
launch); in configs.py the bodies of `select_config`, `key_ranges`, `split_kv_serves` and
`forward_keys_per_sm` (the dispatch). Inside that, nothing is mutated in validation (an `if`
whose body only raises, its test included; a `raise`; an `assert`), in f-strings, in
`T.dynamic(...)` or in function signatures (the `T.Tensor(...)` annotations, defaults). Files
outside that table (tests' synthetic sources) get every top-level function and their module-
level constants.

A mutant replaces the exact source span of one node (found from the stdlib `ast` positions)
with that node's text changed in one place: the rest of the file stays byte-for-byte what it
was. The span is the smallest node that shows the change in context (the comparison, the
`T.ceildiv(...)` call, the subscript, the `if` test), which is also what `before` / `after`
print and what `key` is made of. Every new piece is parenthesised where it could otherwise
bind differently, and kept on the lines of the text it replaces, so comments and line
structure survive and the mutated file compiles (checked for every mutant).

Why not mutmut, cosmic-ray or libcst: TileLang re-parses the `@T.prim_func`'s Python source
to build the kernel, so mutmut's in-process trampolines (which dispatch to mutants at run
time) cannot reach it; the operators that matter here, T.min/T.max, T.Or/T.And, the guards
of tile logic, the named constants, are domain-specific; cosmic-ray mutates the tree in place
and has no notion of running each mutant on a GPU with a kernel cache of its own. Each mutant
here is a whole source file that the runner writes to a copy of the package. libcst is not
needed: only exact spans are replaced, so formatting elsewhere is already kept.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import itertools
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "fa_kernel"
FILES = (
    "kernel.py",
    "scheduler.py",
    "pipeline.py",
    "epilogue.py",
    "mask.py",
    "softmax.py",
    "numerics.py",
    "interface.py",
    "configs.py",
)
OPERATORS = ("relational", "off_by_one", "min_max", "or_and", "guard_always", "guard_never", "constant")


@dataclass(frozen=True)
class Scope:
    """What of one file is mutated."""

    functions: tuple[str, ...] | None  # top-level functions whose bodies are mutated; None: all
    constants: bool  # the module-level numeric constants too


SCOPES = {
    "kernel.py": Scope(("forward_program",), constants=True),
    "scheduler.py": Scope(("tile_scheduler",), constants=False),
    "pipeline.py": Scope(("consumer_registers", "own_output_buffer", "pipeline_parts"), constants=True),
    "epilogue.py": Scope(("epilogue_parts",), constants=False),
    # The kernels' shared parts: the visibility rule (a class: its methods, and the forward's
    # score mask) and the online softmax.
    "mask.py": Scope(("Visibility", "forward_score_parts"), constants=False),
    "softmax.py": Scope(("online_softmax", "capped_score"), constants=False),
    "interface.py": Scope(("_attention", "forward_kernel_attention"), constants=False),
    "configs.py": Scope(("select_config", "key_ranges", "split_kv_serves", "forward_keys_per_sm"), constants=False),
    "numerics.py": Scope((), constants=True),
    # The gradient and split-KV kernels, for `tools/mutants/ --generated --target backward`
    # (`decode`): judged by their own GPU tests, apart from the forward's campaign.
    "backward.py": Scope(("backward_program",), constants=True),
    "backward_dq.py": Scope(("dq_program",), constants=True),
    "gradient_parts.py": Scope(("tile_needs_mask", "gradient_sizes"), constants=True),
    "backward_preprocess.py": Scope(("preprocess_program",), constants=True),
    "decode.py": Scope(("split_plan", "split_program", "combine_program"), constants=True),
    # The emulator's tile loop, mutated for `tools/mutants/ --generated --target emulator`:
    # the CPU suite's own measure of how well its cases find bugs.
    "emulator.py": Scope(("_attend_one_head",), constants=False),
}
OTHER_FILES = Scope(None, constants=True)

RELATIONAL_SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}
COMPARISON_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
# Comparisons whose operands are numbers: `x is not None` or `a in b` get no off-by-one.
NUMERIC_COMPARISONS = tuple(COMPARISON_TEXT)
CONSTANT_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
# What may stand between two operands of a comparison or a boolean expression besides its
# operator: the operands' closing and opening parentheses, whitespace, line continuations and
# comments (blanked out before the operator is looked for).
COMMENT = re.compile(r"#[^\n]*")
COMPARISON_TOKEN = re.compile(r"<=|>=|==|!=|<|>|\bnot\s+in\b|\bis\s+not\b|\bin\b|\bis\b")
BOOLEAN_TOKEN = re.compile(r"\b(?:and|or)\b")


@dataclass(frozen=True)
class GeneratedMutant:
    """One rewrite of one file: the span [start, end) of its text, `original`, becomes
    `replacement`."""

    id: str  # "<file stem>-<function>-<operator>-<n>", n counting in source order
    file: str  # relative to the package root, e.g. "kernel.py"
    line: int  # where the changed piece starts: 1-based line,
    col: int  # 0-based column in characters (as ast's, but not in bytes)
    operator: str
    before: str  # the replaced span's text, newlines (and the indentation after them) collapsed
    after: str  # the replacement, collapsed the same way
    function: str  # innermost enclosing function; "<module>" for constants
    start: int  # character offsets of the replaced span in the file's text
    end: int
    first_line: int  # the lines the replaced span covers: a diff of the file stays within them
    last_line: int
    original: str  # the replaced span's exact text (may span lines)
    replacement: str  # its exact replacement (spans the same lines where the original did)
    key_index: int = 1  # which occurrence of the same normalised key within the file
    root: Path = field(default=ROOT, compare=False, repr=False)  # where `file` was read from

    def mutated_source(self, root: Path | None = None) -> str:
        """The whole file with this one rewrite applied (read from `root`, by default the root
        it was generated from)."""
        text = _read(Path(root or self.root) / self.file)
        if text[self.start : self.end] != self.original:
            raise ValueError(f"{self.id}: {self.file} changed since the mutant was generated; generate again")
        return text[: self.start] + self.replacement + text[self.end :]

    def other_sources(self) -> dict[str, str]:
        """No other file: a generated mutant rewrites one (a hand-written one may patch more)."""
        return {}

    @property
    def key(self) -> str:
        """Names the rewrite by what it changes, not where: stable when lines move, so a list
        of equivalent mutants (with the reason each is equivalent) can be keyed on it."""
        key = f"{self.file}:{self.function}:{self.operator}:{_normalise(self.original)}->{_normalise(self.replacement)}"
        return key if self.key_index == 1 else f"{key}#{self.key_index}"

    def line_for_list(self) -> str:
        return f"{self.id}  {self.file}:{self.line}  {self.operator}  {self.before} -> {self.after}"


def generate(root: Path = ROOT, files: Sequence[str] = FILES) -> list[GeneratedMutant]:
    """Every mutant of `files` (paths relative to `root`), by file (in the order given), line,
    column and operator; rewrites that change nothing, or give the same file as an earlier
    mutant, are left out."""
    root = Path(root)
    mutants: list[GeneratedMutant] = []
    for file in files:
        text = _read(root / file)
        source = SourceText(text)
        collector = _Collector(source, SCOPES.get(file, OTHER_FILES))
        collector.collect(ast.parse(text, filename=file))
        candidates = sorted(collector.candidates, key=lambda c: (c.line, c.col, c.operator, c.order))
        stem = Path(file).stem
        seen_sources = {text}
        numbers: Counter[tuple[str, str]] = Counter()
        keys: Counter[str] = Counter()
        for c in candidates:
            mutated = text[: c.start] + c.replacement + text[c.end :]
            if mutated in seen_sources:
                continue  # no change, or the same file as a mutant before it
            seen_sources.add(mutated)
            try:
                # compile, not ast.parse: faster (no Python AST objects) and stricter.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", SyntaxWarning)
                    compile(mutated, file, "exec", dont_inherit=True)
            except SyntaxError as error:  # the engine's bug, never the source's: say which rewrite
                raise RuntimeError(
                    f"{file}:{c.line}: {c.operator} rewrite does not compile: {c.replacement!r}"
                ) from error
            numbers[c.id_scope, c.operator] += 1
            mutant = GeneratedMutant(
                id=f"{stem}-{c.id_scope}-{c.operator}-{numbers[c.id_scope, c.operator]}",
                file=file,
                line=c.line,
                col=c.col,
                operator=c.operator,
                before=_collapse(c.original),
                after=_collapse(c.replacement),
                function=c.function,
                start=c.start,
                end=c.end,
                first_line=source.line_of(c.start),
                last_line=source.line_of(c.end),
                original=c.original,
                replacement=c.replacement,
                root=root,
            )
            keys[mutant.key] += 1
            if keys[mutant.key] > 1:
                mutant = dataclasses.replace(mutant, key_index=keys[mutant.key])
            mutants.append(mutant)
    return mutants


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="one line per mutant: id, file:line, operator, change")
    parser.add_argument("--file", choices=FILES, action="append", help="only this file (repeatable)")
    parser.add_argument("--operator", choices=OPERATORS, action="append", help="only this operator (repeatable)")
    args = parser.parse_args(argv)
    mutants = [
        m for m in generate(files=tuple(args.file or FILES)) if args.operator is None or m.operator in args.operator
    ]
    if args.list:
        for m in mutants:
            print(m.line_for_list())
    print(summary(mutants))
    return 0


def summary(mutants: Sequence[GeneratedMutant]) -> str:
    """'N mutants: kernel.py M (relational a, ...); ...', operators in OPERATORS' order."""
    parts = []
    for file in dict.fromkeys(m.file for m in mutants):
        counts = Counter(m.operator for m in mutants if m.file == file)
        per_operator = ", ".join(f"{op} {counts[op]}" for op in OPERATORS if counts[op])
        parts.append(f"{file} {sum(counts.values())} ({per_operator})")
    return f"{len(mutants)} mutants: " + "; ".join(parts)


# ---- reading the source ----


def _read(path: Path) -> str:
    # newline="": line endings as in the file, so that everything outside a span is kept exactly.
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _collapse(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text)


def _normalise(text: str) -> str:
    """The text as ast.unparse writes it: the same code with other line breaks, spaces or
    parentheses gives the same key."""
    for wrapped, mode in ((f"(\n{text}\n)", "eval"), (text, "exec")):
        try:
            return ast.unparse(ast.parse(wrapped, mode=mode))
        except SyntaxError:
            continue
    return _collapse(text)


class SourceText:
    """Character offsets of ast positions (whose columns count UTF-8 bytes)."""

    def __init__(self, text: str):
        self.text = text
        # Lines as the tokenizer counts them: split on "\n" only ("\r\n" leaves its "\r" at the
        # end of a line, harmless to the columns; str.splitlines would split on more).
        self.lines = text.split("\n")
        self.line_starts = [0]
        for line in self.lines[:-1]:
            self.line_starts.append(self.line_starts[-1] + len(line) + 1)

    def offset(self, lineno: int, byte_col: int) -> int:
        line = self.lines[lineno - 1]
        return self.line_starts[lineno - 1] + len(line.encode("utf-8")[:byte_col].decode("utf-8"))

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        return self.text[self.start(node) : self.end(node)]

    def line_of(self, offset: int) -> int:
        return self.text.count("\n", 0, offset) + 1

    def position(self, offset: int) -> tuple[int, int]:
        line = self.line_of(offset)
        return line, offset - self.line_starts[line - 1]


# ---- patches anchored on the AST (hand-written mutants, perf/variants.py) ----


def _statement_runs(tree: ast.AST, length: int):
    """Every run of `length` consecutive statements of one body in the tree."""
    for node in ast.walk(tree):
        for body_name in ("body", "orelse", "finalbody"):
            body = getattr(node, body_name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                for index in range(len(body) - length + 1):
                    yield body[index : index + length]


def apply_patch(text: str, old: str, new: str, within: str | None = None) -> str:
    """`text` with the one occurrence of the fragment `old` replaced by `new`.

    `old` is matched by its AST (as ast.unparse writes it): first as statements in a row, which
    are replaced by `new`'s lines at their indentation (`new` empty deletes them); else as an
    expression, whose exact span is replaced by `new`."""
    tree = ast.parse(text)
    if within is not None:
        scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == within]
        if len(scopes) != 1:
            raise ValueError(f"function {within!r} found {len(scopes)} times, not once")
        tree = scopes[0]
    source = SourceText(text)
    statements = ast.parse(old).body
    wanted = [ast.unparse(statement) for statement in statements]
    runs = [run for run in _statement_runs(tree, len(statements)) if [ast.unparse(s) for s in run] == wanted]
    if len(runs) == 1:
        first, last = runs[0][0], runs[0][-1]
        line_start = source.offset(first.lineno, 0)
        line_end = source.offset(last.end_lineno, 0) + len(source.lines[last.end_lineno - 1]) + 1
        indent = " " * first.col_offset
        lines = "".join(f"{indent}{line}\n" for line in new.splitlines())
        return text[:line_start] + lines + text[line_end:]
    if len(statements) == 1 and isinstance(statements[0], ast.Expr) or not runs:
        expression = ast.unparse(ast.parse(old, mode="eval"))
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.expr) and ast.unparse(n) == expression]
        if len(nodes) == 1:
            return text[: source.start(nodes[0])] + new + text[source.end(nodes[0]) :]
        found = len(nodes)
    else:
        found = len(runs)
    raise ValueError(f"fragment {old!r} found {found} times, not once")


# ---- finding the mutants ----


@dataclass(frozen=True)
class _Candidate:
    operator: str
    function: str
    id_scope: str  # the function, or the constant's name
    start: int  # the replaced span
    end: int
    original: str
    replacement: str
    line: int  # where the changed piece starts
    col: int
    order: int  # generation order, the last tie-breaker


def _is_t_call(node: ast.AST, *names: str) -> bool:
    """A call of T.<one of names>(...) (tilelang.language imported as T)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "T"
        and node.func.attr in names
    )


def _is_plain_call(node: ast.AST, *names: str) -> bool:
    """A call of a bare name: a builtin such as min(...) or slice(...), or a local function."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names


def _number_literal(node: ast.AST) -> int | float | None:
    """The value of an int or float literal (`3`, `-3`, `0.5`; not True), else None."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number_literal(node.operand)
        return None if inner is None else -inner
    return None


def _int_literal(node: ast.AST) -> int | None:
    value = _number_literal(node)
    return value if type(value) is int else None


def _is_name(node: ast.AST) -> bool:
    """A name or a dotted name (`q.dtype`): nothing computed, as `i` in `acc_s[i, j]`."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _slice_functions(module: ast.Module) -> set[str]:
    """Functions (at any depth) whose every `return` returns `slice(...)`, such as the kernel's
    `panel_columns`: a call of one as an index is a slice, whose bounds are mutated where the
    function writes them; `(slice + 1)` would only fail while tracing, never test a test."""
    names = set()
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            returns = [n for n in ast.walk(node) if isinstance(n, ast.Return)]
            if returns and all(_is_plain_call(r.value, "slice") for r in returns):
                names.add(node.name)
    return names


def _is_atom(node: ast.AST) -> bool:
    """Binds tighter than any operator, so it can replace a call without parentheses (a
    negative number is a UnaryOp, not a Constant)."""
    return isinstance(node, (ast.Constant, ast.Name, ast.Attribute, ast.Subscript, ast.Call))


class _Collector(ast.NodeVisitor):
    """Walks the scoped code of one module and records each rewrite as a candidate."""

    def __init__(self, source: SourceText, scope: Scope):
        self.source = source
        self.scope = scope
        self.functions: list[str] = []
        self.candidates: list[_Candidate] = []
        self.slice_functions: set[str] = set()

    def collect(self, module: ast.Module) -> None:
        self.slice_functions = _slice_functions(module)
        for statement in module.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if self.scope.functions is None or statement.name in self.scope.functions:
                    self.visit(statement)
            elif self.scope.constants:
                self._constant(statement)

    # -- the rewrites --

    def _add(
        self,
        operator: str,
        context: ast.AST,
        piece: tuple[int, int],
        new: str,
        *,
        id_scope: str = "",
        at: int | None = None,
    ) -> None:
        """Record: the span of `context` with its characters [piece) replaced by `new`; the
        mutant is reported where the piece starts, or at `at`."""
        start, end = self.source.start(context), self.source.end(context)
        original = self.source.text[start:end]
        replacement = original[: piece[0] - start] + new + original[piece[1] - start :]
        line, col = self.source.position(piece[0] if at is None else at)
        function = self.functions[-1] if self.functions else "<module>"
        self.candidates.append(
            _Candidate(
                operator,
                function,
                id_scope or function,
                start,
                end,
                original,
                replacement,
                line,
                col,
                len(self.candidates),
            )
        )

    def _replace_node(self, operator: str, context: ast.AST, node: ast.AST, new: str) -> None:
        self._add(operator, context, (self.source.start(node), self.source.end(node)), new)

    def _off_by_one(self, context: ast.AST, node: ast.AST) -> None:
        value = _int_literal(node)
        if value is not None:
            for new in (value + 1, value - 1):
                self._replace_node("off_by_one", context, node, str(new))
            return
        text = self.source.segment(node)
        for sign in "+-":
            self._replace_node("off_by_one", context, node, f"({text} {sign} 1)")

    def _parenthesised(self, node: ast.AST) -> str:
        """The node's text, safe to put where a call stood."""
        text = self.source.segment(node)
        return text if _is_atom(node) and "\n" not in text else f"({text})"

    def _operator_tokens(
        self, node: ast.AST, operands: list[ast.AST], pattern: re.Pattern
    ) -> Iterator[tuple[int, int]]:
        """The spans of the operator tokens between consecutive operands."""
        text = self.source.text
        for left, right in itertools.pairwise(operands):
            gap_start, gap_end = self.source.end(left), self.source.start(right)
            gap = COMMENT.sub(lambda m: " " * len(m.group()), text[gap_start:gap_end])
            match = pattern.search(gap)
            if match is None:
                raise RuntimeError(f"line {node.lineno}: no operator between two operands in {gap!r}")
            yield gap_start + match.start(), gap_start + match.end()

    def _constant(self, statement: ast.stmt) -> None:
        """UPPER_CASE = <int or float literal>: x2, /2, +1, -1."""
        if not (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and CONSTANT_NAME.fullmatch(statement.targets[0].id)
            and _number_literal(statement.value) is not None
        ):
            return
        value = _number_literal(statement.value)
        halved = value // 2 if isinstance(value, int) else value / 2
        piece = (self.source.start(statement.value), self.source.end(statement.value))
        for new in (value * 2, halved, value + 1, value - 1):
            self._add("constant", statement, piece, repr(new), id_scope=statement.targets[0].id)

    # -- the walk: scopes and what is skipped --

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # The body only: decorators, annotations (T.Tensor(...)) and defaults are signature.
        self.functions.append(node.name)
        for statement in node.body:
            self.visit(statement)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for statement in node.body:
            self.visit(statement)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_Raise(self, node: ast.Raise) -> None:
        pass  # validation: its message and its exception are not the kernel

    def visit_Assert(self, node: ast.Assert) -> None:
        pass  # validation too

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        pass  # f-strings: messages

    def visit_If(self, node: ast.If) -> None:
        if all(isinstance(statement, ast.Raise) for statement in node.body):
            # Validation: `if <bad>: raise ...`. Its test is not a branch of the kernel;
            # an `else` / `elif` after it is.
            for statement in node.orelse:
                self.visit(statement)
            return
        self._guard(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._guard(node.test)
        self.generic_visit(node)

    def _guard(self, test: ast.expr) -> None:
        self._replace_node("guard_always", test, test, "True")
        self._replace_node("guard_never", test, test, "False")

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for op_node, token in zip(node.ops, self._operator_tokens(node, operands, COMPARISON_TOKEN), strict=True):
            expected = COMPARISON_TEXT.get(type(op_node))
            if expected is None:
                continue  # is, is not, in, not in
            found = self.source.text[token[0] : token[1]]
            if found != expected:  # the token found is not the operator ast parsed: a bug here
                raise RuntimeError(f"line {node.lineno}: expected comparison operator {expected!r}, found {found!r}")
            self._add("relational", node, token, RELATIONAL_SWAPS[expected])
        if all(isinstance(op, NUMERIC_COMPARISONS) for op in node.ops):
            for operand in operands:
                if not isinstance(operand, ast.Constant) or _number_literal(operand) is not None:
                    self._off_by_one(node, operand)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        # Every operator of the expression at once: `a or b or c` -> `a and b and c`, the
        # same expression with the other operator (swapping one would regroup it).
        tokens = list(self._operator_tokens(node, node.values, BOOLEAN_TOKEN))
        start = self.source.start(node)
        text = self.source.segment(node)
        new = "and" if isinstance(node.op, ast.Or) else "or"
        for token_start, token_end in reversed(tokens):
            text = text[: token_start - start] + new + text[token_end - start :]
        self._add("or_and", node, (start, self.source.end(node)), text, at=tokens[0][0])
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        indices = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for index in indices:
            if isinstance(index, ast.Slice):
                for bound in (index.lower, index.upper):
                    if bound is not None:
                        self._off_by_one(node, bound)
            elif not (
                _is_name(index)
                or isinstance(index, ast.Constant)
                or _int_literal(index) is not None
                or self._is_slice_call(index)
            ):
                self._off_by_one(node, index)
        self.generic_visit(node)

    def _is_slice_call(self, node: ast.AST) -> bool:
        return _is_plain_call(node, "slice", *self.slice_functions)

    def visit_Call(self, node: ast.Call) -> None:
        if _is_t_call(node, "dynamic"):
            return  # the symbolic shape names
        if _is_t_call(node, "ceildiv") or _is_plain_call(node, "slice"):
            for argument in node.args:
                if not (isinstance(argument, ast.Constant) and argument.value is None):
                    self._off_by_one(node, argument)
        swaps = {"min": "max", "max": "min", "Or": "And", "And": "Or"}
        if _is_t_call(node, "min", "max", "Or", "And") or _is_plain_call(node, "min", "max"):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            operator = "min_max" if name in ("min", "max") else "or_and"
            func = self.source.segment(node.func)
            self._replace_node(operator, node, node.func, func[: len(func) - len(name)] + swaps[name])
        if _is_t_call(node, "if_then_else") and len(node.args) == 3 and not node.keywords:
            _, taken, not_taken = node.args
            self._replace_node("guard_always", node, node, self._parenthesised(taken))
            self._replace_node("guard_never", node, node, self._parenthesised(not_taken))
        self.generic_visit(node)


if __name__ == "__main__":
    sys.exit(main())
