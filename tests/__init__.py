"""The test suite, a package so that its modules import as tests.*; what tools/ reads too lives in
suite/, which imports neither."""
