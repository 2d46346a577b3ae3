"""What the test suite and the tools both read: the boundary sweep's builds and shapes
(`boundaries`), the hypothesis strategies and hard score distributions (`strategies`), a build's
launch (`launch`) and the builds each GPU test launches (`builds`). It imports neither tests/ nor
tools/, so that tools/ (precompile, the mutant runner) need not import the tests, which import
the tools they test."""
