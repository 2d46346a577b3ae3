"""tests/sanitize_cases.py (`nox -s sanitize`): its shards split the cases without loss or
overlap, and every kernel family is among them (no GPU needed)."""

from __future__ import annotations

import pytest

from tests import sanitize_cases


def test_the_shards_hold_every_case_once():
    every = sanitize_cases.cases()
    for count in (1, 3, 5, len(every) + 2):
        shards = [sanitize_cases.shard(every, f"{index}/{count}") for index in range(count)]
        assert sorted(map(str, sum(shards, []))) == sorted(map(str, every))


def test_each_kernel_family_is_sanitized():
    kinds = {case.kernel for case in sanitize_cases.cases()}
    assert kinds == {
        *("forward", "long entry", "gradients", "gradients deterministic", "split-KV"),
        *("varlen", "varlen gradients", "varlen gradients deterministic", "paged"),
    }


@pytest.mark.parametrize("text", ["3/3", "-1/2", "1/0"])
def test_a_shard_out_of_range_is_refused(text):
    with pytest.raises(ValueError, match="--shard"):
        sanitize_cases.shard(sanitize_cases.cases(), text)
