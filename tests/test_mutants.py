"""The mutant list (tests/mutants.py) is in step with the source it patches (no GPU needed).

A mutant whose patch text no longer matches is reported as an error only when the mutants
run, on the GPU machine; an edit of kernel.py that moves such a text must fail here first.
"""

from __future__ import annotations

import ast

import pytest

import mutants


@pytest.mark.parametrize("mutant", mutants.KERNEL_MUTANTS + mutants.EMULATOR_MUTANTS, ids=lambda m: m.name)
def test_every_mutant_patches_its_file_once_and_still_parses(mutant):
    text = mutants.mutated_source(mutant)
    assert text != (mutants.ROOT / "src" / "fa_kernel" / mutant.file).read_text()
    ast.parse(text)  # a mutant must die of its bug, not of a syntax error
