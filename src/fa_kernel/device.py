"""What the kernels are built for on a CUDA device: its compute capability, SM count and nvcc
architecture, read once per device."""

from __future__ import annotations

import functools

import torch

# The dtypes the kernels are built for, by TileLang's names.
DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def device_target(device=None) -> tuple[int, str]:
    """(SMs, nvcc arch) of a CUDA device (default: the current one): what its kernels are built
    for, the persistent grid's size and the architecture ("sm_90a": the 'a' variant unlocks
    wgmma and setmaxnreg)."""
    capability, sm_count = device_facts(device)
    return sm_count, f"sm_{capability[0]}{capability[1]}a"


def device_facts(device=None) -> tuple[tuple[int, int], int]:
    """(compute capability, SM count) of a CUDA device (default: the current one). Fixed for the
    process, so read once per device: every flash_attn_func call needs them, and torch's queries
    cost the host microseconds each."""
    device = torch.device("cuda") if device is None else torch.device(device)
    return _device_facts(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _device_facts(index: int) -> tuple[tuple[int, int], int]:
    properties = torch.cuda.get_device_properties(index)
    return (properties.major, properties.minor), properties.multi_processor_count
