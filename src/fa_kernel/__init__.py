"""fa_kernel: a FlashAttention-2 forward kernel in TileLang, with its reference and tools."""

__version__ = "0.1.0"
__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "__version__"]


def __getattr__(name: str):
    # The API (and with it TileLang) loads on first use, so that the reference and the emulator
    # import on machines without TileLang's toolchain.
    if name == "flash_attn_func":
        from fa_kernel.interface import flash_attn_func

        return flash_attn_func
    if name == "flash_attn_varlen_func":
        from fa_kernel.varlen import flash_attn_varlen_func

        return flash_attn_varlen_func
    if name == "flash_attn_with_kvcache":
        from fa_kernel.paged import flash_attn_with_kvcache

        return flash_attn_with_kvcache
    raise AttributeError(f"module 'fa_kernel' has no attribute {name!r}")
