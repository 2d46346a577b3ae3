"""tools/precompile.py: its stamp, skipped only for the same builds of the same source, and the
smoke tier's share of the builds (no GPU needed)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from tools import precompile  # noqa: E402

import fa_kernel
from fa_kernel.workbench.builds import built_stamp


def test_the_stamp_names_the_builds_and_the_package_source(tmp_path, monkeypatch):
    builds = precompile.suite_builds(132, "sm_90a")
    stamp = built_stamp(builds)
    assert stamp == built_stamp(list(builds))
    assert stamp != built_stamp(builds[1:])
    # A mutant's copy of the package: one byte of kernel.py changed, another stamp.
    copy = tmp_path / "fa_kernel"
    shutil.copytree(Path(fa_kernel.__file__).parent, copy)
    monkeypatch.setattr(fa_kernel, "__file__", str(copy / "__init__.py"))
    assert built_stamp(builds) == stamp
    (copy / "kernel.py").write_text((copy / "kernel.py").read_text() + "\n")
    assert built_stamp(builds) != stamp


def test_the_smoke_builds_are_the_smoke_tiers_and_part_of_the_suites():
    from fa_kernel.workbench.builds import unique
    from tests import test_boundary_sweep

    smoke = precompile.smoke_builds("sm_90a")
    assert smoke == [dict(build, arch="sm_90a") for build in test_boundary_sweep.BUILDS]
    suite = precompile.suite_builds(132, "sm_90a")
    assert all(build in suite for build in smoke) and len(unique(smoke)) == len(smoke) < len(suite)


def test_builds_of_several_kinds_share_one_pool_and_keep_their_builder():
    from fa_kernel.backward import compiled_gradient_kernels
    from fa_kernel.decode import compiled_decode_kernels
    from fa_kernel.workbench.builds import distinct_tasks

    # The same arguments build a gradient kernel and a split-KV one: both are kept, once each.
    build = dict(head_dim=64, causal=False, dtype="bfloat16", arch="sm_90a")
    builders = [compiled_gradient_kernels, compiled_decode_kernels, compiled_gradient_kernels]
    tasks = distinct_tasks([build, build, build], builders)
    assert tasks == [(compiled_gradient_kernels, build), (compiled_decode_kernels, build)]
    assert built_stamp([build], [compiled_gradient_kernels]) != built_stamp([build], [compiled_decode_kernels])
    assert built_stamp([build], compiled_decode_kernels) == built_stamp([build], [compiled_decode_kernels])
    with pytest.raises(ValueError, match="builder: expected one per build"):
        distinct_tasks([build, build], [compiled_decode_kernels])


def test_building_for_another_gpu_names_both_of_its_arguments(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["precompile.py", "--arch", "sm_90a"])
    with pytest.raises(SystemExit) as stop:
        precompile.main()
    assert stop.value.code == 2
    assert "--arch and --sm-count go together" in capsys.readouterr().err


def test_the_gradients_option_builds_the_gradient_kernels_alone(monkeypatch):
    from fa_kernel.backward import compiled_gradient_kernels
    from fa_kernel.workbench import builds

    built = {}

    def record(everything, jobs, builder):
        built.update(everything=everything, builders=builder)

    monkeypatch.setattr(builds, "build_unless_built", record)
    monkeypatch.setattr(sys, "argv", ["precompile.py", "--gradients", "--arch", "sm_90a", "--sm-count", "132"])
    precompile.main()
    everything, builders = precompile.every_build(132, "sm_90a")
    gradients = [
        build for build, builder in zip(everything, builders, strict=True) if builder is compiled_gradient_kernels
    ]
    assert built["everything"] == gradients and len(gradients) > 40
    assert built["builders"] == [compiled_gradient_kernels] * len(gradients)


class _Unpicklable(Exception):
    """As TileLang's tvm_ffi.Error: it cannot cross from a worker process to the pool, nor can
    the error its pickling raises, so the worker dies (and, unhandled, the pool with it)."""

    def __reduce__(self):
        raise _Unpicklable("cannot pickle")


def _builder_failing_on(*, fail: bool, number: int) -> None:
    if fail:
        raise _Unpicklable(f"build {number} does not fit")


def test_a_build_whose_error_does_not_pickle_leaves_the_pool_building_the_rest():
    from fa_kernel.workbench.builds import build_all

    builds = [dict(fail=True, number=1), dict(fail=False, number=2), dict(fail=False, number=3)]
    errors = build_all(builds, jobs=1, builder=_builder_failing_on)
    assert isinstance(errors[0], RuntimeError) and "_Unpicklable: build 1 does not fit" in str(errors[0])
    assert errors[1:] == [None, None]
