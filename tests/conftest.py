"""Test gating and hypothesis profiles.

- `@pytest.mark.gpu` tests need a CUDA device. Without one they skip with that reason,
  unless FA_KERNEL_REQUIRE_GPU=1 (set by `nox -s gpu`), which turns the skip into a failure.
- `@pytest.mark.compile` tests need nvcc to compile for sm_90a; they run without a GPU.
- Under pytest-xdist with FA_KERNEL_GPUS=n (`nox -s gpu`), each worker is pinned to one GPU.
- HYPOTHESIS_PROFILE picks `ci` (default: derandomized, few examples), `gpu` (hundreds),
  `thorough` (thousands, nightly) or `mutants` (ci without shrinking: tools/mutants/).
  Deadlines are off everywhere: a first call compiles.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Under pytest-xdist (`nox -s gpu`), worker gwN uses the (N mod FA_KERNEL_GPUS)-th visible GPU
# alone (of CUDA_VISIBLE_DEVICES where the runner set it): set before torch first touches CUDA,
# which fixes the devices a process sees.
if "PYTEST_XDIST_WORKER" in os.environ and int(os.environ.get("FA_KERNEL_GPUS", "0")) > 1:
    _gpus = int(os.environ["FA_KERNEL_GPUS"])
    _visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(_gpus)))).split(",")
    _worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    os.environ["CUDA_VISIBLE_DEVICES"] = _visible[_worker % _gpus]

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, settings

_slow_ok = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=25,
    deadline=None,
    suppress_health_check=_slow_ok,
    print_blob=True,
)
# The mutant runner's: a failing example is enough, shrinking it (hundreds of launches) is not needed.
settings.register_profile(
    "mutants",
    settings.get_profile("ci"),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    report_multiple_bugs=False,
)
settings.register_profile("gpu", max_examples=300, deadline=None, suppress_health_check=_slow_ok, print_blob=True)
settings.register_profile("thorough", max_examples=3000, deadline=None, suppress_health_check=_slow_ok, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

HAS_CUDA = torch.cuda.is_available()
REQUIRE_GPU = os.environ.get("FA_KERNEL_REQUIRE_GPU") == "1"
HAS_NVCC = shutil.which("nvcc") is not None


def pytest_configure(config):
    # The mutant runner points PYTHONPATH at a mutated copy of src/; make sure that is what loaded.
    expected = os.environ.get("FA_KERNEL_EXPECT_SRC")
    if expected:
        import fa_kernel

        if not Path(fa_kernel.__file__).resolve().is_relative_to(Path(expected).resolve()):
            pytest.exit(f"FA_KERNEL_EXPECT_SRC mismatch: imported {fa_kernel.__file__}", returncode=3)


def pytest_collection_modifyitems(config, items):
    # Property tests (hundreds of examples each) first: pytest-xdist hands tests out in this
    # order, and a long test handed out last is the run's tail.
    def runs_examples(item) -> bool:
        return "examples" in item.keywords or getattr(getattr(item, "obj", None), "is_hypothesis_test", False)

    items.sort(key=lambda item: not runs_examples(item))
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA and not REQUIRE_GPU:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)"))
        if "compile" in item.keywords and not HAS_NVCC:
            item.add_marker(pytest.mark.skip(reason="needs nvcc on PATH to compile for sm_90a"))


def pytest_runtest_setup(item):
    if "gpu" in item.keywords and REQUIRE_GPU and not HAS_CUDA:
        pytest.fail("FA_KERNEL_REQUIRE_GPU=1 but there is no CUDA device: GPU tests must run here, not skip")


@pytest.fixture(autouse=True, scope="session")
def _gpu_memory_share():
    # FA_KERNEL_GPU_MEMORY_FRACTION of a GPU, split among the xdist workers that share it: `nox -s
    # gpu` sets it so that one worker's allocator cache cannot starve the others (an H100 ran out
    # with one worker holding 67 GiB), and a test that needs more than its share fails by name;
    # tools/mutants/ sets each mutant's share, so that one mutant's tests cannot take the memory
    # another's need (an out-of-memory failure there is no kill).
    fraction = os.environ.get("FA_KERNEL_GPU_MEMORY_FRACTION")
    if fraction and HAS_CUDA:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        gpus = max(1, int(os.environ.get("FA_KERNEL_GPUS", "1")))
        torch.cuda.set_per_process_memory_fraction(float(fraction) / -(-workers // gpus))
    yield


@pytest.fixture(autouse=True)
def _exact_fp32_matmul():
    # The fp32 reference must be fp32: TF32 matmuls would put 1e-3 errors into it.
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = previous


def pytest_terminal_summary(terminalreporter):
    # How many kernels this run compiled: hundreds of shapes should cost a handful of compiles.
    import sys

    kernel = sys.modules.get("fa_kernel.kernel")
    if kernel is not None:
        info = kernel.compiled_forward.cache_info()
        terminalreporter.write_line(
            f"fa_kernel: {info.misses} kernel builds (compiles or disk-cache loads), {info.hits} reuses"
        )
