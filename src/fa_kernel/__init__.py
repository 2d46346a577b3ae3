"""fa_kernel: a FlashAttention-2 forward kernel in TileLang, with its reference and tools."""

from fa_kernel.interface import flash_attn_func

__version__ = "0.1.0"
__all__ = ["flash_attn_func", "__version__"]
