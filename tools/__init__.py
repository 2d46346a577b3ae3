"""Tools beside the package: the mutation engine and runner, the precompile step (run as scripts,
or imported from the repository root as `tools.*`)."""
