"""Tools beside the package, run from the repository root as `python -m tools.NAME`: the mutation
engine (`ast_mutants`, `equivalent_mutants`) and runner (`mutants`), the precompile step, the
same-kernels proof and the code-generation rules. They read suite/, never tests/."""
