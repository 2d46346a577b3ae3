"""The equivalent mutants' list (tools/equivalent_mutants.py) names only mutants the engine
generates, and each reason's check holds (CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from suite.boundaries import boundary_offsets, shipped_entries, sweep_limit, sweep_seqlens_q  # noqa: E402
from suite.strategies import HARD_SCORES, Case  # noqa: E402
from tools.ast_mutants import apply_patch, generate  # noqa: E402
from tools.equivalent_mutants import EMULATOR_ROUNDING_CHECK, EQUIVALENT  # noqa: E402
from tools.mutants import PACKAGE, records, triage  # noqa: E402

from fa_kernel.emulator import attention_tiled  # noqa: E402
from fa_kernel.reference import random_qkv, rounding_apart  # noqa: E402


def test_every_recorded_equivalent_is_a_generated_mutant():
    generated = {mutant.key for mutant in [*generate(), *generate(files=("emulator.py",))]}
    assert not set(EQUIVALENT) - generated, "stale entries: the kernel changed under them"


def emulator_masking_every_tile(folder: Path):
    """attention_tiled with every K/V tile given the mask, whether it needs one or not."""
    source = apply_patch(
        (PACKAGE / "emulator.py").read_text(), "needs_mask = kv_start + block_n > seqlen_k", "needs_mask = True"
    )
    path = folder / "emulator_masking_every_tile.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("emulator_masking_every_tile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attention_tiled


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_masking_tiles_that_need_no_mask_changes_nothing(causal, tmp_path):
    # Bitwise: the mask of a tile with every key visible is all zeros, the GEMM's starting value.
    masking_every_tile = emulator_masking_every_tile(tmp_path)
    configs = {entry.config for entry in shipped_entries() if entry.causal == causal}
    for config in configs:
        seqlen_q = sweep_seqlens_q(config)[-1]
        for offset in boundary_offsets(config, sweep_limit(config), side=1)[::7]:
            if seqlen_q + offset < 1:
                continue
            q, k, v = random_qkv(1, seqlen_q, seqlen_q + offset, 1, 1, 64, torch.float16, device="cpu")
            expected = attention_tiled(q, k, v, causal=causal, config=config)
            actual = masking_every_tile(q, k, v, causal=causal, config=config)
            for got, want in zip(actual, expected, strict=True):
                assert torch.equal(got, want), f"{config}, offset {offset}"


def load_emulator(source: str, folder: Path, name: str):
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attention_tiled


def test_recorded_emulator_mutants_are_bitwise_the_same(tmp_path):
    # Each recorded emulator mutant against the emulator, bitwise, at the causal and non-causal
    # boundary offsets of every shipped config.
    recorded = [m for m in generate(files=("emulator.py",)) if m.key in EQUIVALENT]
    recorded = [m for m in recorded if EQUIVALENT[m.key].check != EMULATOR_ROUNDING_CHECK]
    assert recorded
    # The unmutated emulator's results, once for all mutants.
    cases = []
    for entry in shipped_entries():
        seqlen_q = sweep_seqlens_q(entry.config)[-1]
        for offset in boundary_offsets(entry.config, sweep_limit(entry.config), side=1)[::11]:
            if seqlen_q + offset >= 1:
                qkv = random_qkv(1, seqlen_q, seqlen_q + offset, 1, 1, 64, torch.float16, device="cpu")
                cases.append((entry, offset, qkv, attention_tiled(*qkv, causal=entry.causal, config=entry.config)))
    for index, mutant in enumerate(recorded):
        mutated = load_emulator(mutant.mutated_source(), tmp_path, f"emulator_mutant_{index}")
        for entry, offset, qkv, expected in cases:
            actual = mutated(*qkv, causal=entry.causal, config=entry.config)
            for got, want in zip(actual, expected, strict=True):
                assert torch.equal(got, want), f"{mutant.id}: {entry.config}, causal={entry.causal}, offset {offset}"


def stale_sum_limits() -> list[float]:
    """STALE_SUM_LIMIT as each generated mutant of numerics.py sets it."""
    limits = []
    for mutant in generate(files=("numerics.py",)):
        if "STALE_SUM_LIMIT" in mutant.key:
            namespace: dict = {}
            exec(mutant.mutated_source(), namespace)  # the module's constants, nothing else
            limits.append(namespace["STALE_SUM_LIMIT"])
    return limits


HARD_CASES = [
    Case(1, 600, 600, 2, 1, 64, "float16", causal, HARD_SCORES[distribution], distribution, 7)
    for distribution in HARD_SCORES
    for causal in (False, True)
]


def test_the_stale_sum_limit_only_chooses_the_reference_max(monkeypatch):
    # The emulator with STALE_SUM_LIMIT as each numerics.py mutant sets it (halved, doubled, one
    # either side), on scores that keep and that leave their max: the same attention as the
    # shipped limit's, within rounding (reference.rounding_apart). A limit past fp16's range
    # keeps maxes whose P~ overflow, and the check sees it.
    import fa_kernel.emulator as emulator
    from fa_kernel.numerics import STALE_SUM_LIMIT

    limits = stale_sum_limits()
    assert len(limits) == 4
    for case in HARD_CASES:
        q, k, v = case.inputs()
        monkeypatch.setattr(emulator, "STALE_SUM_LIMIT", STALE_SUM_LIMIT)
        shipped = attention_tiled(q, k, v, softmax_scale=case.scale, causal=case.causal)
        for limit in [*limits, 2.0**40]:
            monkeypatch.setattr(emulator, "STALE_SUM_LIMIT", limit)
            out, lse = attention_tiled(q, k, v, softmax_scale=case.scale, causal=case.causal)
            apart = rounding_apart(q, k, v, out, lse, *shipped, case.causal, case.scale)
            if limit == 2.0**40:
                assert apart is not None or case.distribution != "jumping_scores", f"{case}: the check cannot fail"
            else:
                assert apart is None, f"STALE_SUM_LIMIT {limit}, {case}: {apart}"


def test_recorded_emulator_mutants_round_alike(tmp_path):
    # Each emulator mutant recorded as the same attention in exact arithmetic, against the
    # emulator on scores that keep and that leave their max, and on normal ones: within rounding
    # (reference.rounding_apart, which test_the_stale_sum_limit_only_chooses_the_reference_max
    # sees fail on maxes whose P~ overflow).
    recorded = [
        m
        for m in generate(files=("emulator.py",))
        if m.key in EQUIVALENT and EQUIVALENT[m.key].check == EMULATOR_ROUNDING_CHECK
    ]
    assert recorded
    normal = [Case(1, 600, 600, 2, 1, 64, "float16", causal, None, "normal", 7) for causal in (False, True)]
    # The unmutated emulator's results, once for all mutants.
    cases = [(case, case.inputs()) for case in HARD_CASES + normal]
    expected_by_case = [attention_tiled(*qkv, softmax_scale=case.scale, causal=case.causal) for case, qkv in cases]
    for index, mutant in enumerate(recorded):
        mutated = load_emulator(mutant.mutated_source(), tmp_path, f"emulator_rounding_mutant_{index}")
        for (case, (q, k, v)), expected in zip(cases, expected_by_case, strict=True):
            out, lse = mutated(q, k, v, softmax_scale=case.scale, causal=case.causal)
            apart = rounding_apart(q, k, v, out, lse, *expected, case.causal, case.scale)
            assert apart is None, f"{mutant.id}, {case}: {apart}"


def test_contiguous_is_the_tensor_itself_where_it_already_is():
    # interface._forward copies `t if t.is_contiguous() else t.contiguous()`: the test made never
    # true copies nothing more, as Tensor.contiguous() returns a contiguous tensor itself.
    qkv = torch.randn(2, 33, 3, 4, 64, dtype=torch.float16)
    for tensor in (qkv[:, :, 0].contiguous(), torch.randn(2, 33, 4, 64)):
        assert tensor.is_contiguous() and tensor.contiguous() is tensor
    assert not qkv[:, :, 0].is_contiguous() and qkv[:, :, 0].contiguous() is not qkv[:, :, 0]


@pytest.mark.gpu
def test_the_rounding_check_sees_a_mutant_that_computes_other_attention(tmp_path, monkeypatch):
    # tools/bitwise_sweep.py's `close`, the check of the ROUNDING equivalents, against a real bug:
    # alpha = 1 where the row max rose by exactly one, on the integer maxima that show it. The
    # bug is softmax.py's: the kernel is loaded beside the package with that module mutated.
    import sys

    from suite.boundaries import sweep_builds
    from tools import bitwise_sweep

    key = "softmax.py:fold_tile:off_by_one:row_max[i] == row_max_prev[i]->row_max[i] == row_max_prev[i] + 1"
    (mutant,) = [m for m in generate() if m.key == key]
    softmax_path = tmp_path / "softmax_alpha_off_by_one.py"
    softmax_path.write_text(mutant.mutated_source())
    monkeypatch.setitem(
        sys.modules,
        "softmax_alpha_off_by_one",
        bitwise_sweep.load_kernel_module(softmax_path, "softmax_alpha_off_by_one"),
    )
    kernel_source = (PACKAGE / "kernel.py").read_text()
    path = tmp_path / "kernel.py"
    path.write_text(kernel_source.replace("from fa_kernel.softmax import", "from softmax_alpha_off_by_one import", 1))
    mutated = bitwise_sweep.load_kernel_module(path, "kernel_alpha_off_by_one")
    build = sweep_builds()[0]
    assert bitwise_sweep.not_close(build, mutated, shapes="unit_steps")


def test_no_recorded_equivalent_has_been_killed():
    # A reason is wrong where the record holds a kill of the same mutant (tools/records: every
    # GPU verdict so far): the two lists must agree.
    from tools import mutants

    record = mutants.ROOT / "tools" / "records" / "generated_smoke.jsonl"
    recorded = [m for m in generate() if m.key in EQUIVALENT]
    assert not records.recorded_kills(record, recorded)


def test_no_mutant_triage_finds_equivalent_has_been_killed():
    # Identical PrimFuncs, or identical generated code, mean the unmutated kernel: a recorded
    # kill of such a mutant would make triage unsound (or a test flaky). From the committed
    # triage cache alone (a kernel.py edit since leaves its mutants to a triage run).
    from tools import mutants

    cache = mutants.ROOT / "tools" / "records" / "triage.json"
    kernel_mutants = [m for m in generate() if m.file == "kernel.py"]
    found = triage.triage(kernel_mutants, jobs=1, sm_count=132, cache=cache, compute=False)
    equivalent = [m for m in kernel_mutants if found.verdicts.get(m.id, ("",))[0] == "equivalent"]
    assert equivalent, "the committed triage cache settles no mutant: is it for this kernel.py?"
    record = mutants.ROOT / "tools" / "records" / "generated_smoke.jsonl"
    assert not records.recorded_kills(record, equivalent)
