"""Property suite: the same properties, checked on the tile emulator (CPU, every push) and
on the TileLang kernel (GPU runner). HYPOTHESIS_PROFILE sets how many examples run."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from suite.launch import device_sm_count, run_config
from suite.strategies import HARD_SCORES, REACHES, Case, cases

from fa_kernel import flash_attn_func
from fa_kernel.emulator import attention_tiled
from tests.properties import PROPERTIES
from tests.shards import shard_examples, shard_params


def emulator(q, k, v, softmax_scale, causal, config=None):
    return attention_tiled(q, k, v, softmax_scale=softmax_scale, causal=causal, config=config)


def kernel(q, k, v, softmax_scale, causal, config=None):
    """flash_attn_func, or the case's own config called directly."""
    if config is None:
        return flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, return_lse=True)
    return run_config(q, k, v, softmax_scale, causal, config)


# (attend, device, strategy for these head dims): the emulator runs smaller problems, since it
# is plain torch on a CPU. The kernel's lengths reach twice the furthest short entry's reach, so
# that cases draw both of their tile configs (the short-sequence one up to its reach, the long
# one past it).
LONGEST = 2 * max(REACHES)
TARGETS = {
    "emulator": (
        emulator,
        "cpu",
        lambda head_dims: cases(head_dims=head_dims, max_len=600, max_score_elements=400_000),
    ),
    "kernel": (
        kernel,
        "cuda",
        lambda head_dims: cases(
            head_dims=head_dims, max_len=LONGEST, max_score_elements=40_000_000, sm_count=device_sm_count()
        ),
    ),
}
# The kernel's property runs are one per head dim, each with that share of the profile's
# examples: the same cases in all, in tests that pytest-xdist spreads over its workers (a whole
# property on one worker was the GPU suite's longest test).
SHARDS = {"emulator": [(64, 128)], "kernel": [(64,), (128,), (256,)]}


TARGET_PARAMS = [pytest.param("emulator"), pytest.param("kernel", marks=pytest.mark.gpu)]
# Drawn by the strategy too, but rarely in a short run: the two paths of a tile's softmax (the
# max from before the tile kept, or replaced), on both tile heights (128 and 176 keys); and never
# drawn, integer maxima exactly one apart that each replace the max (strategies.HARD_SCORES).
NAMED_CASES = [
    Case(2, 600, 600, 4, 2, head_dim, "float16", causal, HARD_SCORES[distribution], distribution, seed=7)
    for distribution in ("jumping_scores", "unit_steps")
    for head_dim in (64, 128)
    for causal in (False, True)
]


@pytest.mark.parametrize("target", TARGET_PARAMS)
@pytest.mark.parametrize("check", PROPERTIES, ids=lambda check: check.__name__.removeprefix("check_"))
@pytest.mark.parametrize(
    "case", NAMED_CASES, ids=lambda case: f"{case.distribution}-d{case.head_dim}-{'causal' if case.causal else 'full'}"
)
def test_named_case(target, check, case):
    attend, device, _ = TARGETS[target]
    with torch.no_grad():
        check(functools.partial(attend, config=case.config), case, device)


@pytest.mark.examples
@pytest.mark.parametrize(("target", "head_dims"), shard_params(SHARDS))
@pytest.mark.parametrize("check", PROPERTIES, ids=lambda check: check.__name__.removeprefix("check_"))
def test_property(target, head_dims, check):
    attend, device, strategy = TARGETS[target]

    @settings(max_examples=shard_examples(SHARDS, target))
    @given(case=strategy(head_dims))
    def holds(case):
        with torch.no_grad():
            check(functools.partial(attend, config=case.config), case, device)

    holds()
