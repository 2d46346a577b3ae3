"""Mutation testing: apply each kernel bug to a copy of the source, run the suite against it,
and fail unless every mutant is killed (or, for generated mutants, shown equivalent).

    python -m tools.mutants                          # the hand-written mutants, on the GPU
    python -m tools.mutants --generated --list       # the generated mutants, one line each (no GPU)
    python -m tools.mutants --generated              # triage on the CPU, then the GPU
    python -m tools.mutants --target emulator        # the hand-written bugs in the CPU emulator
    python -m tools.mutants --only rescale_after_gemm --select tests/test_kernel.py::test_every_consumer_schedule
        # one test, every parameter (no -x): which of its cases catch the mutant

Two kinds of mutant:
- hand-written (KERNEL_MUTANTS, EMULATOR_MUTANTS): the semantic bugs a kernel author makes
  (a rescale after the GEMM, the last tile's sum). Each patch is anchored on the AST, not on
  whitespace: `old` is a Python fragment (an expression, or one or more statements in a row)
  that must occur exactly once, compared as `ast.unparse` writes it, so a reformat of the
  kernel leaves every mutant applying;
- generated (tools/ast_mutants.py): every relational swap, off-by-one, min/max and or/and swap,
  guard forced, and named constant perturbed in the kernel's tile logic.

Each mutant is judged in tiers, the cheap ones first:
1. triage (CPU, generated kernel.py mutants): the mutant's PrimFunc of every kernel the tables
   ship and the boundary sweep builds is compared with the unmutated one's. Identical for all:
   the mutant is **equivalent** (the compiled kernels are the same, as TileLang's cache key is
   that PrimFunc's script); the reason is that check, recorded with the count. A build that
   raises kills the mutant. Mutants that change the code but not the results are listed in
   tools/equivalent_mutants.py, each with its reason and the test that checks it, which runs
   first;
2. the mutant's own tests (`first`), then the smoke tier (`-m smoke`: the boundary sweep);
3. the whole GPU suite, for the survivors of the smoke tier.
Mutants spread over every GPU of the host (CUDA_VISIBLE_DEVICES per mutant), each with a
TileLang cache of its own seeded from the unmutated build's, so that kernels the mutant does
not change load instead of compiling.

The package, by job: `catalogue` (the hand-written mutants, as data), `triage` (the CPU's
verdicts: identical programs, recorded equivalents), `tiers` (which tests judge a mutant, in what
order), `runner` (a mutant's copy of the package and its tiers' processes), `records` (verdicts
kept between runs) and `__main__` (the command).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "fa_kernel"
