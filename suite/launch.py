"""A tile config's kernel called directly, bypassing flash_attn_func's choice of config: how the
tests reach configs the dispatcher would not pick at these lengths (the long-sequence entries
at few keys, the fallback) and persistent grids smaller than the GPU's."""

from __future__ import annotations

import math

import torch

from fa_kernel.configs import TileConfig
from fa_kernel.interface import compile_arch, kernel_build
from fa_kernel.kernel import compiled_forward
from fa_kernel.variants import PLAIN, Variants, exponent_scale, launch_arguments


def device_sm_count() -> int | None:
    """The SM count of the CUDA device (the persistent grid's size), None without one."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).multi_processor_count


def device_arch() -> str:
    """The architecture flash_attn_func compiles for ('sm_90a' on Hopper): direct builds name it
    too, so that they and the dispatcher's share one compile (and tools/precompile.py's)."""
    return compile_arch(torch.device("cuda"))


def kernel_for(
    q: torch.Tensor, causal: bool, config: TileConfig, sm_count: int | None = None, variants: Variants = PLAIN
):
    """The compiled kernel of `config` for q's dtype and head_dim; `sm_count` None: the device's."""
    build = kernel_build(q.device, q.shape[-1], causal, q.dtype, config=config, sm_count=sm_count)
    return compiled_forward(**build, variants=variants)


def run_config(q, k, v, softmax_scale, causal, config, sm_count=None, kernel=None, *, variants=PLAIN, **variant_values):
    """(out, lse) of `config`'s kernel, built with `variants` compiled in and launched with
    `variant_values` (window_size, softcap, sinks, as flash_attn_func takes them). The outputs
    start as NaN, so an element no thread block writes fails any comparison whatever memory held."""
    kernel = kernel or kernel_for(q, causal, config, sm_count, variants)
    window_size, softcap = variant_values.get("window_size", (-1, -1)), variant_values.get("softcap", 0.0)
    extra = launch_arguments(variants, window_size, softcap, softmax_scale, variant_values.get("sinks"))
    out = torch.full_like(q, math.nan)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), math.nan, device=q.device, dtype=torch.float32)
    kernel(q, k, v, out, lse, exponent_scale(softmax_scale, softcap), *extra)
    return out, lse
