"""Every check this project runs, by hand or in CI: `nox -l` lists them.

Arguments after `--` go to the tool the session wraps (pytest, asv, the mutant runner).

Offline runners whose Python already holds torch, TileLang and the test tools run any
session with `nox --no-venv -s NAME`: nothing is created or installed then, and the
package is imported from `src/`.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = os.environ.get("FA_KERNEL_NOX_PYTHON")  # None: the Python that runs nox


def install(session: nox.Session, *extras: str) -> None:
    """Install the package with these extras, or, without a venv, import it from src/."""
    if session.venv_backend == "none":
        session.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
        return
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


def require_gpu(session: nox.Session) -> None:
    """GPU sessions fail, never skip, where there is no CUDA device: a silent skip is a hole."""
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    if session.run("python", "-c", probe, success_codes=[0, 1], silent=True, return_code=True) != 0:
        session.error("this session needs a CUDA device, and torch.cuda.is_available() is False here")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite: CPU tests everywhere, GPU tests too where a CUDA device exists."""
    install(session, "test")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def gpu(session: nox.Session) -> None:
    """GPU verification: kernel tests and the property suite (hypothesis profile 'gpu')."""
    install(session, "test")
    require_gpu(session)
    session.env["HYPOTHESIS_PROFILE"] = os.environ.get("HYPOTHESIS_PROFILE", "gpu")
    session.env["FA_KERNEL_REQUIRE_GPU"] = "1"
    session.run("pytest", "-m", "gpu", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (format and lint), mypy on src/, actionlint on the workflows."""
    install(session, "lint")
    session.run("ruff", "format", "--check", ".")
    session.run("ruff", "check", ".")
    session.run("mypy", "src")


@nox.session(python=PYTHON)
def mutants(session: nox.Session) -> None:
    """Apply each known kernel bug in turn; fail unless the test suite kills every one.

    `nox -s mutants` targets the TileLang kernel (GPU); `nox -s mutants -- --target emulator`
    runs the same bugs against the CPU tile emulator.
    """
    install(session, "test")
    session.run("python", "tests/mutants.py", *session.posargs)


@nox.session(python=PYTHON)
def sanitize(session: nox.Session) -> None:
    """compute-sanitizer memcheck and racecheck over representative shapes (GPU)."""
    install(session, "test")
    require_gpu(session)
    for tool in ("memcheck", "racecheck"):
        session.run(
            "compute-sanitizer", f"--tool={tool}", "--error-exitcode=1", "--target-processes=all",
            "python", "tests/sanitize_cases.py", *session.posargs, external=True,
        )
