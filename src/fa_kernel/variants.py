"""Attention's variants as the kernels take them: a sliding window's edges, a logit softcap and
attention sinks (flash-attn's `window_size` and `softcap`; FA3's and FlexAttention's sinks).

A build compiles a variant in or leaves it out (`Variants`, part of its cache key); its values
are launch arguments, so one build serves every window, cap and sink. A build without a variant
has no parameter for it and generates the very program it did before the variants existed.

- window: query row i sees key j iff d(i) - left <= j <= d(i) + right, d(i) = i + Sk - Sq, each
  side only where set (mask.Visibility; causal is right = 0).
- softcap c > 0: a score s (after the softmax scale) becomes c·tanh(s / c). The kernels keep
  t = tanh(x·scale / c) of the raw score x as the score and fold c into the exponent's scale
  (c·log2e where the plain kernel has scale·log2e): one multiply fewer a score.
- sinks [nheads] fp32: each row's softmax denominator gains exp(sinks[h]); no value is added
  for it, and the LSE includes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fa_kernel.numerics import LOG2E

NAMES = ("window_left", "window_right", "softcap", "sinks")


@dataclass(frozen=True)
class Variants:
    """Which variants a build compiles in."""

    window_left: bool = False  # a left edge (a sliding window's start)
    window_right: bool = False  # a right edge other than causal's (causal is its own flag)
    softcap: bool = False
    sinks: bool = False

    @classmethod
    def of(cls, causal: bool, window_size: tuple[int, int], softcap: float, sinks: torch.Tensor | None) -> Variants:
        """The build a call needs (its arguments already checked)."""
        left, right = window_size
        return cls(left >= 0, right >= 0 and not causal, softcap > 0, sinks is not None)

    def __str__(self) -> str:
        """The build's variants in one word, e.g. window_left+sinks, or plain; `parse` reads it back."""
        return "+".join(name for name in NAMES if getattr(self, name)) or "plain"

    @classmethod
    def parse(cls, text: str) -> Variants:
        names = set() if text == "plain" else set(text.split("+"))
        if unknown := sorted(names - set(NAMES)):
            raise ValueError(f"variants: expected 'plain' or {NAMES} joined by '+', got {unknown} in {text!r}")
        return cls(**{name: True for name in names})


PLAIN = Variants()  # full or causal attention: the kernels as they were before the variants


def kernel_parameter(value, compiled: bool):
    """A kernel's annotation for a variant's parameter: `value` (a T.dynamic variable or a
    T.Tensor) where the build compiles the variant in, else None, which TileLang gives no
    parameter at all."""
    return value if compiled else None


def window_first_tile(seqlen_q: int, seqlen_k: int, left: int, block_n: int) -> int:
    """The first K/V tile of `block_n` keys any query sees (a split-KV launch's splits start
    there): with a left edge (left >= 0), the one holding the first query's first key (the later
    queries' windows start later still), never past the last tile; else 0."""
    if left < 0:
        return 0
    return min(max(0, seqlen_k - seqlen_q - left) // block_n, max(0, -(-seqlen_k // block_n) - 1))


def keys_a_row_sees(seqlen_k: int, causal: bool, window_size: tuple[int, int]) -> int:
    """The most keys one query row sees: with a left edge and a right one (causal's included),
    the window's span left + 1 + right, else seqlen_k. The forward's config is chosen by it: a
    window's row block visits a few tiles however long the sequence, the case the tables' short
    entries are tuned for."""
    left, right = window_size
    right = 0 if causal else right
    if left < 0 or right < 0:
        return seqlen_k
    return max(1, min(seqlen_k, left + 1 + right))


# A window edge past every key of any sequence the kernels take (lengths below 2^30).
NO_LIMIT = 2**30


def exponent_scale(softmax_scale: float, softcap: float) -> float:
    """The scale_log2 a kernel takes: the softmax scale times log2e, or with a softcap c, c·log2e
    (the scores are then tanh(x·scale / c))."""
    return (softcap if softcap > 0 else softmax_scale) * LOG2E


def launch_arguments(
    variants: Variants,
    window_size: tuple[int, int],
    softcap: float,
    softmax_scale: float,
    sinks: torch.Tensor | None,
) -> list:
    """The kernel's arguments after scale_log2, in its parameters' order: the window's left and
    right edges, the softcap's 2·log2e·scale / c (the kernels' tanh is 1 − 2 / (2^(x·that) + 1),
    numerics.TANH_ERROR) and the sinks, each only where `variants` compiles it in. An edge
    compiled in but -1 at this launch (a build that serves many windows), or wider than any
    sequence, goes as NO_LIMIT: the kernels' int32 edge arithmetic stays in range."""
    left, right = (NO_LIMIT if edge < 0 else min(edge, NO_LIMIT) for edge in window_size)
    values = [
        (variants.window_left, left),
        (variants.window_right, right),
        (variants.softcap, 2 * LOG2E * softmax_scale / softcap if softcap > 0 else 0.0),
        (variants.sinks, sinks),
    ]
    return [value for compiled, value in values if compiled]
