"""A property's examples split into one test per group of head dims (a shard), so that
pytest-xdist spreads them over its workers: one test of 300 GPU examples was a run's tail. Each
shard runs its share of the hypothesis profile's examples."""

from __future__ import annotations

import pytest
from hypothesis import settings

Shards = dict[str, list[tuple[int, ...]]]  # target ("emulator", "kernel"): its groups of head dims


def shard_params(shards: Shards) -> list:
    """pytest params (target, head_dims), one per shard, the kernel's marked gpu."""
    return [
        pytest.param(target, head_dims, id=f"{target}-d{'-'.join(map(str, head_dims))}", marks=marks)
        for target, marks in (("emulator", ()), ("kernel", pytest.mark.gpu))
        for head_dims in shards[target]
    ]


def shard_examples(shards: Shards, target: str) -> int:
    """Each of the target's shards' share of the profile's examples."""
    return max(1, settings.default.max_examples // len(shards[target]))
