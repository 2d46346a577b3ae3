"""The hand-written mutant list (tools/mutants/) is in step with the source it patches, and its
AST anchoring survives a reformat (no GPU needed).

A mutant whose fragment no longer matches is reported as an error only when the mutants run,
on the GPU machine; an edit of kernel.py that changes such a fragment must fail here first.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
import time

import pytest
from tools import mutants  # noqa: E402
from tools.ast_mutants import apply_patch, generate  # noqa: E402
from tools.mutants import ROOT, catalogue, records, runner, tiers, triage  # noqa: E402


@functools.cache
def _smoke_nodes() -> dict[str, tuple[str, ...]]:
    return {build: tuple(nodes) for build, nodes in tiers.smoke_nodes_by_build().items()}


def smoke_nodes() -> dict[str, list[str]]:
    """tiers.smoke_nodes_by_build, collected once a process (a pytest collection in a subprocess,
    some 6 s), a fresh copy each call."""
    return {build: list(nodes) for build, nodes in _smoke_nodes().items()}


@functools.cache
def generated_mutants() -> tuple:
    """tools.ast_mutants.generate() once a process (its mutants are frozen)."""
    from tools.ast_mutants import generate

    return tuple(generate())


@pytest.mark.parametrize("mutant", catalogue.KERNEL_MUTANTS + catalogue.EMULATOR_MUTANTS, ids=lambda m: m.name)
def test_every_mutant_patches_its_file_once_and_still_parses(mutant):
    text = mutant.mutated_source()
    assert text != (mutants.PACKAGE / mutant.file).read_text()
    ast.parse(text)  # a mutant must die of its bug, not of a syntax error


REFORMATTED = """\
def f(a, b):
    total = (a
             + b)  # a comment
    if total > 0:
        total = total * 2
        return max(a,
                   b)
    return total
"""


@pytest.mark.parametrize(
    ("old", "new", "expected_line"),
    [
        ("a + b", "a - b", "    total = (a - b)  # a comment"),  # an expression over two lines
        ("total = total * 2\nreturn max(a, b)", "return a", "        return a"),  # statements in a row
        ("total = total * 2", "", "        return max(a,"),  # a statement deleted
    ],
)
def test_patches_match_the_ast_whatever_the_formatting(old, new, expected_line):
    text = apply_patch(REFORMATTED, old, new)
    ast.parse(text)
    assert expected_line in text.splitlines()


def test_a_fragment_found_twice_or_never_is_an_error():
    with pytest.raises(ValueError, match="found 2 times"):
        apply_patch("x = a + 1\ny = a + 1\n", "a + 1", "a")
    with pytest.raises(ValueError, match="found 0 times"):
        apply_patch("x = a + 1\n", "a + 2", "a")
    # `within` narrows the search to one function
    assert "y = a\n" in apply_patch("def f():\n    x = a + 1\ndef g():\n    y = a + 1\n", "a + 1", "a", "g")


def test_a_triaged_mutant_runs_the_smoke_tests_of_the_builds_it_changes_first():
    nodes = smoke_nodes()
    first, second = list(nodes)[:2]
    assert all(f"[{first}-" in node or node.endswith(f"[{first}]") for node in nodes[first])
    assert any(node.endswith(f"[{first}]") for node in nodes[first])  # a test of the build alone
    mutant = catalogue.KERNEL_MUTANTS[0]
    planned = tiers.mutant_tiers(mutant, "kernel", [first, second], nodes, smoke_only=False, cpu_only=False)
    names = [name for name, _ in planned]
    assert names == ["own tests", f"smoke on {first}", "smoke on 1 more changed builds", "suite"]
    assert planned[1][1] == ["-x", *nodes[first]] and planned[2][1] == ["-x", *nodes[second]]
    # A mutant that changes no sweep build goes to the suite after its own tests; untriaged, to the
    # whole smoke tier.
    assert [name for name, _ in tiers.mutant_tiers(mutant, "kernel", [], nodes, False, False)] == [
        "own tests",
        "suite",
    ]
    untriaged = tiers.mutant_tiers(mutant, "kernel", None, nodes, smoke_only=True, cpu_only=False)
    assert untriaged == [("own tests", ["-x", *mutant.first]), ("smoke", ["-x", *tiers.SMOKE_ARGS])]


def test_same_kernels_tells_a_refactor_from_a_change(tmp_path):
    import shutil

    from tools import same_kernels

    compared = same_kernels.compared_builds()
    assert {family for family, _ in compared} == set(same_kernels.ENTRIES)
    builds = [next(build for build in compared if build[0] == family) for family in same_kernels.ENTRIES]
    package = mutants.ROOT / "src"
    # One copy, two edits: decode's loop variable renamed (the same program but for a name) and a
    # bug in the gradient; the forward, untouched, digests the same in another process.
    edited = shutil.copytree(package, tmp_path / "edited")
    decode = edited / "fa_kernel" / "decode.py"
    text = decode.read_text()
    for name in (
        "for r, j in T.Parallel(block_m, block_n):\n",
        "visible = sees(rule, key, r, last_key, first_key)",
        "acc_s[r, j] = T.if_then_else(visible, kept(acc_s[r, j])",
    ):
        text = text.replace(name, name.replace("r,", "x,").replace("[r", "[x"), 1)
    decode.write_text(text)
    parts = edited / "fa_kernel" / "gradient_parts.py"  # the plain step's dS (probabilities_and_ds)
    bug = ("(acc_dp[i, j] - delta[j])", "(acc_dp[i, j] + delta[j])")
    assert parts.read_text().count(bug[0]) == 1
    parts.write_text(parts.read_text().replace(*bug))
    before = same_kernels.program_digests(package, builds)
    after = same_kernels.program_digests(edited, builds)
    assert list(same_kernels.ENTRIES) == ["forward", "gradient", "decode"]
    assert same_kernels.verdicts(before, after) == ["identical", "differs", "names"]


def test_a_recorded_kill_by_the_smoke_tier_holds_for_the_whole_run(tmp_path):
    mutant, other = catalogue.KERNEL_MUTANTS[:2]
    smoke = [("smoke", ["-x", *tiers.SMOKE_ARGS])]
    whole = [*smoke, ("suite", ["-x", "tests"])]
    record = tmp_path / "record.jsonl"
    records.append_record(record, mutant, smoke, ("killed", "smoke: test_x", 3.0))
    records.append_record(record, other, smoke, ("SURVIVED", "every test of the smoke tier passed", 4.0))
    found = records.load_record(record, [mutant, other], {mutant.id: whole, other.id: whole})
    # The kill stands; the survivor of the smoke tier still has the suite to run.
    assert found == {mutant.id: ("killed", "smoke: test_x", 3.0)}
    assert records.load_record(record, [other], {other.id: smoke}) == {
        other.id: ("SURVIVED", "every test of the smoke tier passed", 4.0)
    }


def test_an_equivalence_settled_by_its_check_outlives_a_change_of_the_tests_after_it(tmp_path):
    from tools.equivalent_mutants import BITWISE, EQUIVALENT

    checked = next(m for m in generated_mutants() if m.key in EQUIVALENT and EQUIVALENT[m.key].check == BITWISE)
    check = ("bitwise", [BITWISE, "some-build"])
    record = tmp_path / "record.jsonl"
    records.append_record(record, checked, [check, ("smoke on some-build", ["-x", "node"])], ("equivalent", "r", 9.0))
    # Other smoke tests, or a suite to run after them: the check alone gave the verdict.
    later = [check, ("smoke on some-build", ["-x", "node", "new_node"]), ("suite", ["-x", "tests"])]
    assert records.load_record(record, [checked], {checked.id: later}) == {checked.id: ("equivalent", "r", 9.0)}
    # Another check (other builds) is another verdict.
    other = [("bitwise", [BITWISE, "other-build"]), *later[1:]]
    assert records.load_record(record, [checked], {checked.id: other}) == {}


def test_a_record_depends_on_the_files_its_tiers_run_only():
    smoke = [("smoke", ["-x", *tiers.SMOKE_ARGS])]
    files = {path.name for path in tiers.tier_files(smoke)}
    assert {"test_boundary_sweep.py", "conftest.py", "boundaries.py", "pyproject.toml"} <= files
    # An edit of a test or helper the tier does not run keeps its verdicts.
    assert files.isdisjoint({"test_backward_kernel.py", "sanitize_cases.py", "properties.py"})
    suite = [("suite", ["-x", *tiers.PYTEST_ARGS["kernel"]])]
    assert {"test_backward_kernel.py", "properties.py"} <= {path.name for path in tiers.tier_files(suite)}
    # A check runs its tool, not pytest: the tool and what it imports, not conftest.py.
    from tools.equivalent_mutants import BITWISE

    check = {path.name for path in tiers.tier_files([("bitwise", [BITWISE, "some-build"])])}
    assert check == {"bitwise_sweep.py", "boundaries.py", "launch.py", "strategies.py"}


def test_a_mutant_recorded_as_schedule_only_is_compared_bit_for_bit_first():
    from tools.equivalent_mutants import BITWISE, EQUIVALENT

    generated = generated_mutants()
    schedule = next(m for m in generated if m.key in EQUIVALENT and EQUIVALENT[m.key].check == BITWISE)
    nodes = smoke_nodes()
    build = next(iter(nodes))
    planned = tiers.mutant_tiers(schedule, "kernel", [build], nodes, smoke_only=False, cpu_only=False)
    # The same bits settle it; other bits send it on to the smoke tier and the suite.
    assert [name for name, _ in planned] == ["bitwise", f"smoke on {build}", "suite"]
    assert planned[0][1] == [BITWISE, build]
    assert (mutants.ROOT / BITWISE) in tiers.tier_files(planned)  # the check is part of the verdict
    # Not settled on the CPU before the run: its check needs the GPU.
    assert schedule.id not in triage.recorded_equivalents([schedule])


def test_a_mutant_recorded_as_rounding_only_is_compared_within_rounding_first():
    from tools.equivalent_mutants import BITWISE, EQUIVALENT, ROUNDING

    rounding = next(m for m in generated_mutants() if m.key in EQUIVALENT and EQUIVALENT[m.key].check == ROUNDING)
    nodes = smoke_nodes()
    build = next(iter(nodes))
    planned = tiers.mutant_tiers(rounding, "kernel", [build], nodes, smoke_only=False, cpu_only=False)
    assert [name for name, _ in planned] == ["close", f"smoke on {build}", "suite"]
    assert planned[0][1] == [BITWISE, build]  # the same script, its `close` action
    assert rounding.id not in triage.recorded_equivalents([rounding])


def test_a_mutant_recorded_as_storing_past_the_end_runs_the_guard_regions_then_bitwise():
    from tools.equivalent_mutants import BITWISE, EQUIVALENT, GUARDED

    guarded = next(m for m in generated_mutants() if m.key in EQUIVALENT and EQUIVALENT[m.key].check == GUARDED)
    nodes = smoke_nodes()
    first, second = list(nodes)[:2]
    planned = tiers.mutant_tiers(guarded, "kernel", [first, second], nodes, smoke_only=True, cpu_only=False)
    assert [name for name, _ in planned] == [
        "guard regions",
        "bitwise",
        f"smoke on {first}",
        "smoke on 1 more changed builds",
    ]
    # The guard-region test of each changed build, one node each, from the smoke tier's.
    guard_nodes = planned[0][1][1:]
    assert [node.split("[")[1] for node in guard_nodes] == [f"{first}]", f"{second}]"]
    assert all(node.startswith(tiers.GUARD_TEST) and node in nodes[node.split("[")[1][:-1]] for node in guard_nodes)
    assert planned[1][1] == [BITWISE, first, second]
    assert tiers.first_build_tiers({guarded.id: planned})[0] == {}  # left for a whole run
    assert guarded.id not in triage.recorded_equivalents([guarded])


def test_a_recorded_kill_outlives_a_change_of_tests_and_a_survival_does_not(tmp_path):
    import json

    killed, survived = catalogue.KERNEL_MUTANTS[:2]
    record = tmp_path / "record.jsonl"
    planned = {m.id: [("smoke", ["-x", *tiers.SMOKE_ARGS])] for m in (killed, survived)}
    for mutant, status in ((killed, "killed"), (survived, "SURVIVED")):
        records.append_record(record, mutant, planned[mutant.id], (status, "", 1.0))
    assert set(records.load_record(record, [killed, survived], planned)) == {killed.id, survived.id}
    # Other tests now (a stronger smoke tier): the kill stands, the survival is judged again.
    entries = [json.loads(line) for line in record.read_text().splitlines()]
    record.write_text("".join(json.dumps({**entry, "fingerprint": "tests changed"}) + "\n" for entry in entries))
    assert not records.load_record(record, [killed, survived], planned)
    assert set(records.recorded_kills(record, [killed, survived])) == {killed.id}


def test_first_build_only_keeps_one_compile_and_leaves_checked_equivalents_for_a_whole_run():
    from tools.equivalent_mutants import BITWISE, EQUIVALENT

    nodes = smoke_nodes()
    first, second = list(nodes)[:2]
    plain = catalogue.KERNEL_MUTANTS[0]
    checked = next(m for m in generated_mutants() if m.key in EQUIVALENT and EQUIVALENT[m.key].check == BITWISE)
    whole = {
        plain.id: tiers.mutant_tiers(plain, "kernel", [first, second], nodes, False, False),
        checked.id: tiers.mutant_tiers(checked, "kernel", [first], nodes, False, False),
        "suite only": [("suite", ["-x", *tiers.PYTEST_ARGS["kernel"]])],
    }
    planned, deferred = tiers.first_build_tiers(whole)
    assert [name for name, _ in planned[plain.id]] == ["own tests", f"smoke on {first}"]
    assert set(deferred) == {checked.id, "suite only"} and set(planned) == {plain.id}
    # Then no suite tier is left: the seed cache needs the smoke tier's kernels alone.
    assert tiers.precompile_args(whole.values()) == []
    assert tiers.precompile_args(planned.values()) == ["--smoke"]


def test_a_deadline_starts_only_what_can_end_by_it_and_stops_the_rest(tmp_path, monkeypatch):
    nodes = smoke_nodes()
    first, second = list(nodes)[:2]
    mutant = catalogue.KERNEL_MUTANTS[0]
    planned = tiers.mutant_tiers(mutant, "kernel", [first, second], nodes, smoke_only=True, cpu_only=False)
    # Its own tests compile nothing (the seeded cache); the first build's smoke tier compiles one.
    assert tiers.first_tier_seconds(planned) == 2 * tiers.TIER_SECONDS + tiers.BUILD_SECONDS
    status, detail, _ = runner.run_mutant(mutant, "kernel", tmp_path, planned, stop_at=time.perf_counter() + 1)
    assert status == "NOT RUN" and "would end past --deadline" in detail
    assert not (tmp_path / mutant.id).exists()  # not started: nothing copied

    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    monkeypatch.setattr(tiers, "TIER_SECONDS", 0)
    start = time.perf_counter()
    outcome = runner.run_mutant(mutant, "kernel", tmp_path, [("own tests", [str(slow)])], stop_at=start + 5)
    assert outcome[0] == "NOT RUN" and "stopped at --deadline in the own tests tier" in outcome[1]
    assert time.perf_counter() - start < 30
    assert records.VERDICTS.count(outcome[0]) == 0  # a record does not keep it: the next run judges it


def test_a_sweep_tier_silent_past_the_hang_limit_is_a_hang_and_a_slow_one_that_prints_is_not(tmp_path, monkeypatch):
    # A kernel that never returns prints nothing more: a tier of the sweep silent for
    # HANG_SECONDS is stopped and the mutant killed, however long its time limit; one that goes on
    # printing (a test's dot as each ends) runs on past it.
    monkeypatch.setattr(runner, "HANG_SECONDS", 3)
    mutant = catalogue.KERNEL_MUTANTS[0]
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_hangs.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    (tests / "test_slow.py").write_text(
        "import time\n\nimport pytest\n\n@pytest.mark.parametrize('i', range(6))\n"
        "def test_slow(i):\n    time.sleep(1)\n"
    )
    start = time.perf_counter()
    planned = [("smoke on 2 more changed builds", [str(tests / "test_hangs.py")])]
    status, detail, _ = runner.run_mutant(mutant, "kernel", tmp_path, planned, timeout=600)
    assert status == "killed" and detail.startswith("hang: the smoke on 2 more changed builds tier printed nothing")
    assert time.perf_counter() - start < 30
    assert "(stopped: silence)" in (tmp_path / f"{mutant.id}.log").read_text()  # how far it got

    planned = [("smoke on 2 more changed builds", [str(tests / "test_slow.py")])]
    status, detail, seconds = runner.run_mutant(mutant, "kernel", tmp_path, planned, timeout=600)
    assert status == "SURVIVED" and seconds > 6  # six dots a second apart: never silent for 3 s


def test_a_check_whose_kernel_never_returns_leaves_the_mutant_to_the_tests(tmp_path, monkeypatch):
    # The check shows nothing of the outputs, so it settles nothing: the tiers after it judge.
    monkeypatch.setattr(runner, "HANG_SECONDS", 3)
    mutant = catalogue.KERNEL_MUTANTS[0]
    check = tmp_path / "check.py"
    check.write_text("import time\ntime.sleep(60)\n")
    failing = tmp_path / "test_fails.py"
    failing.write_text("def test_fails():\n    assert False\n")
    planned = [("bitwise", [str(check), "some-build"]), ("smoke on some-build", ["-x", str(failing)])]
    status, detail, _ = runner.run_mutant(mutant, "kernel", tmp_path, planned, timeout=600, bitwise_seed=tmp_path)
    assert status == "killed" and detail.startswith("smoke on some-build:")


def test_the_unmutated_baseline_runs_once_per_source_and_tests(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("HOME", str(tmp_path))
    calls = []

    def passing(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, "1 passed\n", "")

    monkeypatch.setattr(tiers.subprocess, "run", passing)
    planned = [[("own tests", ["-x", "tests/test_kernel.py::test_empty_inputs"]), ("smoke", tiers.SMOKE_ARGS)]]
    assert tiers.unmutated_failures(planned) == [] and len(calls) == 2
    assert tiers.unmutated_failures(planned) == [] and len(calls) == 2  # stamped: not run again
    other = [[("own tests", ["-x", "tests/test_kernel.py::test_matches_reference_head_dim_128"])]]
    assert tiers.unmutated_failures(other) == [] and len(calls) == 3  # other tests: run

    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "FAILED tests/test_x.py::test_y - boom\n", "")

    monkeypatch.setattr(tiers.subprocess, "run", failing)
    broken = [[("own tests", ["-x", "tests/test_api.py::test_nothing"])]]
    assert tiers.unmutated_failures(broken) == ["tests/test_x.py::test_y"]
    assert tiers.unmutated_failures(broken) == ["tests/test_x.py::test_y"]  # a failure is never stamped


def test_a_bitwise_seed_is_reused_whole_and_a_half_written_one_goes(tmp_path):
    build = "d64-full-192x128/2st/384thr/persistent-grid4"
    assert not tiers.seed_readable(tmp_path, build)
    seed = tmp_path / "d64-full-192x128_2st_384thr_persistent-grid4.json"
    seed.write_text('{"shape": "digest"}')
    assert tiers.seed_readable(tmp_path, build)
    seed.write_text('{"shape": "dig')  # a record stopped mid-write
    assert not tiers.seed_readable(tmp_path, build) and not seed.exists()


def test_generated_code_tells_a_change_the_simplifier_undoes_from_a_real_one():
    from suite.boundaries import build_id, sweep_builds

    source = (mutants.PACKAGE / "kernel.py").read_text()
    build = next(b for b in sweep_builds() if build_id(b) == "d128-causal-128x176/2st/256thr")
    original = triage.generated_code_digests(source, [build], [0])
    # T.copy takes its source fragment's extent, so a destination region one row short lowers
    # to the same code, though the PrimFunc differs.
    down_cast = "T.copy(acc_s, acc_p)  # the only down-cast"
    assert source.count(down_cast) == 1
    short_copy = source.replace(down_cast, "T.copy(acc_s, acc_p[0:(block_m - 1), :])  # the only down-cast")
    assert triage.primfunc_digests(short_copy, [build]) != triage.primfunc_digests(source, [build])
    assert triage.generated_code_digests(short_copy, [build], [0]) == original
    dropped_rescale = catalogue.KERNEL_MUTANTS[0].mutated_source()
    assert triage.generated_code_digests(dropped_rescale, [build], [0]) != original


def test_generated_code_that_leaves_a_wait_out_is_a_kill_at_triage():
    from suite.boundaries import build_id, sweep_builds

    source = (mutants.PACKAGE / "kernel.py").read_text()
    # The overlapped epilogue's build: its last wgmma wait ends the S_0 of a tile after the last.
    build = next(b for b in sweep_builds() if build_id(b).endswith("persistent/overlap-grid4"))
    original = triage.generated_code_digests(source, [build], [0])
    assert not original[0].startswith("breaks: ")
    dropped = next(m for m in generated_mutants() if m.key.endswith("guard_never:overlap_epilogue->False#3"))
    mutated = triage.generated_code_digests(dropped.mutated_source(), [build], [0], original)
    assert mutated[0].startswith("breaks: a wgmma started at line")
    # Triage turns it into a kill, from its cache alone; not where the unmutated build breaks it too.
    stored = {triage.GENERATED + name: {0: digest} for name, digest in (("before", original[0]), ("after", mutated[0]))}
    args = ({"after": [0]}, [build], 1, stored, lambda name: name, None, False)
    same, broken = triage.same_generated_code("before", *args)
    assert same == {"after": False} and broken["after"].startswith("a wgmma started at line")
    stored[triage.GENERATED + "before"] = {0: mutated[0]}
    assert triage.same_generated_code("before", *args)[1] == {}


def test_the_gradient_and_split_kv_kernels_are_targets_of_their_own():
    from tools.ast_mutants import generate

    forward = generated_mutants()
    others = {"backward.py", "backward_dq.py", "gradient_parts.py", "backward_preprocess.py", "decode.py"}
    assert {m.file for m in forward}.isdisjoint(others)  # the forward's campaign as it was
    gradient = ("backward.py", "backward_dq.py", "gradient_parts.py", "backward_preprocess.py")
    for target, files in (("backward", gradient), ("decode", ("decode.py",))):
        generated = generate(files=triage.GENERATED_FILES[target])
        assert {m.file for m in generated} == set(files)
        for mutant in {m.file: m for m in generated}.values():  # one of each file
            file = mutant.file
            # Their file's CPU tests where it has some, then their own GPU tests, then their file's
            # suite; the forward's smoke tier never runs them.
            cpu = [("cpu", ["-x", *tiers.CPU_BY_FILE[file]])] if file in tiers.CPU_BY_FILE else []
            planned = tiers.mutant_tiers(mutant, target, None, {}, smoke_only=False, cpu_only=False)
            assert planned == [
                *cpu,
                ("own tests", ["-x", *catalogue.FIRST_BY_FILE[file]]),
                ("suite", ["-x", *tiers.PYTEST_ARGS[target]]),
            ]
            assert tiers.mutant_tiers(mutant, target, None, {}, smoke_only=True, cpu_only=False) == planned[:-1]
            assert tiers.mutant_tiers(mutant, target, None, {}, smoke_only=False, cpu_only=True) == cpu
            # Their kernels are the whole suite's precompile's, not the smoke tier's.
            assert tiers.precompile_args([planned[:-1]], target) == []
    assert tiers.CPU_BY_FILE["gradient_parts.py"] and "decode.py" not in tiers.CPU_BY_FILE


def collected_tests(*arguments: str) -> list[str]:
    """The test ids `pytest --collect-only` lists for `arguments`; a name it cannot find fails."""
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *arguments],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stdout[-2000:]
    return [line for line in listed.stdout.splitlines() if "::" in line]


def answers(selection: str, collected: list[str]) -> bool:
    """Whether a test id, a test (each of its cases) or a file of `selection` is among `collected`."""
    return any(item == selection or item.startswith((selection + "[", selection + "::")) for item in collected)


def test_a_gradient_mutant_first_runs_the_tests_that_launch_the_builds_it_changes():
    # Triage knows which builds a gradient mutant changes; where its own tests (the plain batched
    # sweeps) launch none of them, the tests that do run first (each one pytest collects: the
    # test after the next).
    from fa_kernel.variants import PLAIN, Variants

    capped = dict(head_dim=64, causal=True, deterministic=False, variants=Variants(window_left=True, softcap=True))
    window = dict(capped, variants=Variants(window_left=True), deterministic=True)
    plain = dict(capped, variants=PLAIN, varlen=False)
    softcap_node = "tests/test_variants_kernel.py::test_backward_softcap[64-causal-atomic-dq]"
    window_node = "tests/test_variants_kernel.py::test_backward_window_sweep_with_sinks[64-causal-fixed-order-dq]"
    assert catalogue.changed_build_tests("backward.py", [capped, window, capped]) == (softcap_node, window_node)
    assert catalogue.changed_build_tests("backward.py", [capped, plain]) == ()
    assert catalogue.changed_build_tests("backward.py", []) == ()
    mutant = next(m for m in generate(files=("backward.py",)) if m.file == "backward.py")
    own = ("own tests", ["-x", *catalogue.FIRST_BY_FILE["backward.py"]])
    planned = tiers.mutant_tiers(mutant, "backward", [capped], {}, smoke_only=True, cpu_only=False)
    assert planned == [(tiers.CHANGED_BUILDS_TIER, ["-x", softcap_node]), own]
    assert tiers.mutant_tiers(mutant, "backward", [plain, capped], {}, smoke_only=True, cpu_only=False) == [own]


def test_a_split_kv_mutant_first_runs_the_tests_that_launch_the_paged_and_variant_builds_it_changes():
    # As the gradient's: a paged or variant build's tests first; a plain build without pages
    # among the changed sends it to its own.
    from fa_kernel.variants import Variants

    window = Variants(window_left=True, softcap=True, sinks=True)
    plain = dict(head_dim=128, causal=True, dtype="float16", arch="sm_90a", block_m=16)
    paged = dict(plain, page_size=16)
    paged_window = dict(plain, page_size=64, variants=window, block_m=64)
    windowed = dict(plain, variants=window)
    assert catalogue.changed_build_tests("decode.py", [paged, paged_window, windowed, paged]) == (
        f"{catalogue.PAGED_PLAIN}[128-16]",
        f"{catalogue.PAGED_VARIANTS}[128-group64]",
        f"{catalogue.SPLIT_KV_VARIANTS}[d128-rows16-causal]",
    )
    assert catalogue.changed_build_tests("decode.py", [paged, plain]) == ()
    assert catalogue.changed_build_tests("decode.py", [dict(paged, causal=False)]) == ()  # no test launches it
    mutant = next(m for m in generate(files=("decode.py",)) if m.file == "decode.py")
    own = ("own tests", ["-x", *catalogue.FIRST_BY_FILE["decode.py"]])
    planned = tiers.mutant_tiers(mutant, "decode", [paged], {}, smoke_only=True, cpu_only=False)
    assert planned[-2:] == [(tiers.CHANGED_BUILDS_TIER, ["-x", f"{catalogue.PAGED_PLAIN}[128-16]"]), own]


def test_the_gradient_and_split_kv_tiers_name_tests_pytest_collects():
    # A node no test answers to would fail the tier on every mutant: a false kill. Their suite
    # tiers, their own tests and the tests of each build triage compiles for them, collected in
    # one pytest run (each its GPU tests: -m gpu).
    files = ("backward.py", "backward_dq.py", "gradient_parts.py", "backward_preprocess.py", "decode.py")
    selections = [
        tiers.PYTEST_ARGS["backward"],
        tiers.PYTEST_ARGS["decode"],
        *(catalogue.FIRST_BY_FILE[f] for f in files),
        *(catalogue.changed_build_tests(f, [build]) for f in files for build in triage.program_builds(f)),
    ]
    assert all(selection[-2:] == ["-m", "gpu"] for selection in selections[:2])
    paths = sorted(
        {argument for selection in selections for argument in selection if not argument.startswith("-")} - {"gpu"}
    )
    collected = collected_tests("-m", "gpu", *paths)
    assert all(answers(path, collected) for path in paths), sorted(p for p in paths if not answers(p, collected))


def test_a_mutant_of_the_gradient_parts_is_judged_by_both_gradient_kernels():
    from fa_kernel import backward_dq, gradient_parts

    # backward.py's builder, over builds that compile the fixed-order dQ kernel too ...
    assert triage.PROGRAM_BUILDERS["gradient_parts.py"] == triage.PROGRAM_BUILDERS["backward.py"]
    builds = triage.program_builds("gradient_parts.py")
    assert builds == triage.program_builds("backward.py") and any(build["deterministic"] for build in builds)
    # ... each kernel's compile cache the mutated parts' own, the package's modules left as they were.
    with triage._kernel_module((mutants.PACKAGE / "gradient_parts.py").read_text()) as parts:
        kernels = triage._gradient_kernels_on(parts)
        for cache in (kernels.compiled_backward, kernels.compiled_dk_dv, kernels.compiled_dq):
            assert cache.__wrapped__.__globals__ is vars(parts)
    assert sys.modules["fa_kernel.gradient_parts"] is gradient_parts
    assert sys.modules["fa_kernel.backward_dq"] is backward_dq


def test_the_gradient_and_split_kv_suites_test_every_branch_their_triage_builds():
    from fa_kernel.variants import PLAIN

    # The tests of each build option's branch: a mutant there survives a suite without them.
    tests_of = {"variants": "tests/test_variants_kernel.py", "varlen": "tests/test_varlen.py"}
    tests_of |= {"page_size": "tests/test_paged.py", "head_splits": "tests/test_backward_kernel.py"}
    files = ("backward.py", "backward_dq.py", "gradient_parts.py")
    for target, file in [*(("backward", file) for file in files), ("decode", "decode.py")]:
        taken = {
            option
            for build in triage.program_builds(file)
            for option, value in build.items()
            if option in tests_of and value not in (None, False, PLAIN)
        }
        assert taken, file
        # A file of the suite tier, or tests of it (the split-KV's of test_variants_kernel).
        assert {tests_of[option] for option in taken} <= {arg.split("::")[0] for arg in tiers.PYTEST_ARGS[target]}


def test_program_triage_settles_only_what_the_primfuncs_decide(tmp_path, monkeypatch):
    import dataclasses
    import hashlib
    import json

    from tools.ast_mutants import generate

    # Each file's first two builds (the gradient's batched and ragged; the split kernel's plain
    # and windowed): what triage decides from them is the question, not which builds it takes.
    every_build = triage.program_builds
    monkeypatch.setattr(triage, "program_builds", lambda file: every_build(file)[:2])

    def find(generated, function, operator, before, after):
        (found,) = [
            m for m in generated if (m.function, m.operator, m.before, m.after) == (function, operator, before, after)
        ]
        return found

    def rewritten(generated, function, original, replacement):
        """A stand-in mutant of the first mutant's file that rewrites `original` alone."""
        text = (mutants.PACKAGE / generated[0].file).read_text()
        start = text.index(original)
        fields = dict(start=start, end=start + len(original), original=original, replacement=replacement)
        return dataclasses.replace(generated[0], id=f"{generated[0].file}-{function}", function=function, **fields)

    backward = generate(files=("backward.py",))
    dq = generate(files=("backward_dq.py",))
    parts = generate(files=("gradient_parts.py",))
    decode = generate(files=("decode.py",))
    picked = [
        # A comment of the kernel's body reworded: another text, the same PrimFuncs.
        rewritten(backward, "comment", "# One walk over (query head of the group, query tile)", "# The walk"),
        rewritten(dq, "comment", "# P = 0 by a select at the keys a row cannot see", "# Selected"),
        rewritten(parts, "comment", "# As an int: on the bool,", "# As an int:"),
        # Delta's padding taken as no multiple of block_m: building the gradient kernels raises.
        rewritten(parts, "gradient_sizes", "if PREPROCESS_ROWS % block_m:", "if (PREPROCESS_ROWS + 1) % block_m:"),
        # Host-side: the same PrimFuncs, another split plan at launch. Left to run.
        find(
            decode,
            "split_plan",
            "min_max",
            "max(1, tile.blocks_per_sm * sm_count // max(1, batch * heads_kv * row_blocks))",
            "min(1, tile.blocks_per_sm * sm_count // max(1, batch * heads_kv * row_blocks))",
        ),
        # A kernel change: left to run.
        find(decode, "flash_decoding_split", "relational", "first_row + r < rows", "first_row + r <= rows"),
    ]
    cache = tmp_path / "triage.json"
    found = triage.triage_programs(picked, jobs=1, cache=cache)
    verdicts, changed = found.verdicts, found.changed_builds
    assert [verdicts[mutant.id][0] for mutant in picked[:3]] == ["equivalent"] * 3
    assert verdicts[picked[3].id][0] == "killed"
    assert picked[4].id not in verdicts and picked[5].id not in verdicts
    # Those left to run, with the builds whose programs they change: none for the host's plan.
    assert set(changed) == {picked[4].id, picked[5].id} and changed[picked[4].id] == []
    assert changed[picked[5].id] and all(build in triage.program_builds("decode.py") for build in changed[picked[5].id])
    # The unmutated files built every program: an error in all of them would read as equivalent.
    stored = json.loads(cache.read_text())
    originals = {}
    for file in ("backward.py", "backward_dq.py", "gradient_parts.py", "decode.py"):
        context = hashlib.sha256(f"{file} {triage.program_builds(file)!r}".encode()).hexdigest()
        original = stored[triage.short_digest(f"{context}\n{(mutants.PACKAGE / file).read_text()}")]
        assert original and not [digest for digest in original if digest.startswith("error")], file
        originals[file] = original
    # The gradient kernels built on the parts imported afresh are the package's.
    assert originals["gradient_parts.py"] == originals["backward.py"]


def test_the_committed_triage_cache_is_keyed_by_the_codegen_rules_of_this_tree():
    # Its generated-code entries are keyed by codegen_rules.py's digest: after an edit of the rules
    # every campaign, and the prebuild test below, would lower their builds again (minutes).
    import json

    stored = json.loads((mutants.ROOT / "tools" / "records" / "triage.json").read_text())
    generated = [key for key in stored if key.startswith("generated ")]
    assert generated and all(key.startswith(triage.GENERATED) for key in generated), (
        "tools/records/triage.json is stale: python -m tools.mutants --generated --only "
        "kernel-release_unread_tiles-guard_always-1 --triage-only --triage-cache <a copy>, then copy it back"
    )


@pytest.mark.compile
def test_prebuild_compiles_each_mutants_changed_builds_for_a_gpu_host(tmp_path):
    # A check mutant of the release of unread tiles changes two sweep builds: both compiled for
    # sm_90a into the cache folder, where a GPU host's TileLang finds them by their keys.
    import shutil
    import subprocess

    mutant = "kernel-release_unread_tiles-guard_always-1"
    command = [
        sys.executable,
        "-m",
        "tools.mutants",
        "--generated",
        "--only",
        mutant,
        "--prebuild",
        str(tmp_path / "cache"),
        "--jobs",
        "2",  # the two builds at once
        "--triage-cache",
        str(
            shutil.copy(mutants.ROOT / "tools" / "records" / "triage.json", tmp_path)
        ),  # a copy: tests write no tracked file
    ]
    result = subprocess.run(command, cwd=mutants.ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{mutant}" in result.stdout and "2 sweep builds of 1 mutants, own tests' of 0" in result.stdout
    assert len(list((tmp_path / "cache").rglob("kernel.cubin"))) == 2


def test_cpu_only_calls_a_mutant_that_passes_the_cpu_tier_not_judged():
    # Its GPU tiers come after: passing the first of its tiers is no survival.
    assert records.cpu_tier_passed("SURVIVED", "every test of the cpu tier passed", 3.0)[0] == "NOT RUN"
    assert records.cpu_tier_passed("killed", "cpu: tests/test_api.py::test_x", 3.0)[0] == "killed"


def test_a_failing_tier_is_a_kill_however_pytest_stops_and_never_for_want_of_memory():
    failed = ["tests/test_kernel.py::test_x"]
    assert runner.failure_not_a_kill(1, "FAILED tests/test_kernel.py::test_x", failed) == ""
    # -x under pytest-xdist: the session stops at the first failure and exits 2.
    stopped = "FAILED tests/test_kernel.py::test_x\n!!! xdist.dsession.Interrupted: stopping after 1 failures !!!"
    assert runner.failure_not_a_kill(2, stopped, failed) == ""
    assert runner.failure_not_a_kill(2, "ERROR collecting tests/test_kernel.py", []).startswith("pytest exited 2")
    out_of_memory = "FAILED tests/test_kernel.py::test_x - torch.OutOfMemoryError: CUDA out of memory."
    assert runner.failure_not_a_kill(1, out_of_memory, failed) == "a test ran out of GPU memory"


def test_pruning_the_triage_cache_keeps_what_the_sources_use_and_drops_the_rest(tmp_path):
    # An entry of the unmutated kernel.py at the triage builds is live; one of a source that no
    # longer exists (an edit since) goes.
    import hashlib
    import json

    context = hashlib.sha256(repr(triage.triage_builds(132)).encode()).hexdigest()
    live = triage.short_digest(f"{context}\n{(mutants.PACKAGE / 'kernel.py').read_text()}")
    cache = tmp_path / "triage.json"
    cache.write_text(json.dumps({live: ["a"], triage.GENERATED + live: {"0": "b"}, "0123456789abcdef": ["c"]}))
    ragged = triage.ragged_key((mutants.PACKAGE / "kernel.py").read_text())
    cache.write_text(json.dumps({**json.loads(cache.read_text()), ragged: ["d"]}))
    assert triage.prune_cache(cache, 132) == (3, 1)
    assert set(json.loads(cache.read_text())) == {live, triage.GENERATED + live, ragged}


def test_an_equivalent_verdict_holds_only_where_the_ragged_builds_keep_their_programs_too():
    # The forward's triage builds are batched; a mutant of code only a ragged batch runs (varlen
    # -> False: every ragged launch broken) left them all as they were and read as equivalent.
    # From a cache alone: the same ragged programs keep the verdict, other ones send the mutant
    # to its tests (no sweep build changed), one that raises is a kill.
    from types import SimpleNamespace

    stored = {triage.ragged_key(name): digests for name, digests in (
        ("unmutated", ["a", "b"]), ("same", ["a", "b"]), ("other", ["a", "c"]), ("raises", ["a", "error: KeyError: x"])
    )}  # fmt: skip
    cases = ["same", "other", "raises", "not cached"]
    mutants_ = [SimpleNamespace(id=name) for name in cases]
    result = triage.Triage({name: ("equivalent", "identical PrimFunc") for name in cases}, {})
    triage._ragged_check(result, mutants_, cases, "unmutated", stored, 1, None, compute=False)
    assert result.verdicts["same"][0] == "equivalent" and result.verdicts["not cached"][0] == "equivalent"
    assert "other" not in result.verdicts and result.changed_builds == {"other": []}
    assert result.verdicts["raises"] == ("killed", "triage: building a ragged kernel raises (KeyError: x)")


def _digest_unless_three(item: int, suffix: str) -> list[str]:
    if item == 3:  # as a mutant that crashes TileLang's lowering takes its process down
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
    return [f"{item}{suffix}"]


def test_a_build_that_kills_its_process_is_an_error_digest_and_the_others_still_come():
    results = list(triage.crash_safe_map(_digest_unless_three, list(range(6)), 2, "x"))
    assert [item for item, _ in results] == list(range(6))
    assert [digests for item, digests in results if item != 3] == [[f"{i}x"] for i in (0, 1, 2, 4, 5)]
    assert results[3][1][0].startswith("error: ")
