"""Windows, softcap and sinks on the GPU: fa_kernel against FlexAttention (compiled, the same
block mask and score_mod) and against its own plain kernel, alternated in one process.

From the repository root on the GPU machine:

    python -m perf.variants [--tables window flex cost] [--rounds 5] [--repeats 30] [--backward]

Each row is judged first (`reference.judge`, and `judge_backward` with --backward) and then
timed: TFLOP/s counted on the (query, key) pairs the row's mask leaves visible (4·D flops a
pair forward, BACKWARD_FLOPS times that backward), medians of `rounds` alternated rounds of
`repeats` event-timed calls each, and each ratio taken round by round. The tables are issue 54's
Done-when lines:

- window: 32k tokens with a 4k window, causal, d128 bf16, against plain causal at 4k tokens;
- flex: windows of 128, 1k and 4k (causal) and softcaps 30 and 50 (causal), d64 and d128,
  lengths 2k to 32k (32k tokens a row), against FlexAttention;
- cost: softcap 30 and sinks against the same call without them (the plain kernel);
- decode: a decode step with a left edge (64x32/8 heads, d128 bf16, 8k and 32k keys, windows of
  1k and 4k) in GB/s of the window's K/V, against a plain step over as many keys;
- configs (not run by default): windows of 128, 1k and 4k keys at 8k tokens under each forward
  config the tables ship, beside the one flash_attn_func picks (variants.keys_a_row_sees):
  the measurement a window's config entry would come from;
- paths (not run by default; with --backward): windows of 128, 512 and 1k keys, causal, d64 and
  d128, 4x16x8192, the gradient by the default path and by the fixed-order one
  (deterministic=True), against FlexAttention: whether a window's short walks, like short
  sequences', belong on the fixed-order path (configs.gradient_plan routes by seqlen_k);
- tanh (not run by default): softcap 30 with the shipped tanh (ex2 and a division) and with the
  A/B build option tanh.approx (kernel.forward_program's tanh_approx, judged by its own bound,
  numerics.TANH_APPROX_ERROR), each against the plain kernel.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from fa_kernel import flash_attn_func
from fa_kernel.configs import TileConfig
from fa_kernel.reference import judge, random_qkv, visible_pairs
from fa_kernel.reference_backward import judge_backward
from fa_kernel.workbench.bench import BACKWARD_FLOPS, cuda_median_ms, flex_attention_call, gradient_of
from perf import ab


@dataclass(frozen=True)
class Case:
    batch: int
    seqlen: int
    head_dim: int
    causal: bool = True
    window_size: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    sinks: bool = False
    deterministic: bool = False  # the gradient's fixed-order path
    nheads: int = 16
    dtype: torch.dtype = torch.bfloat16
    label: str = field(default="", compare=False)

    def variants(self, sinks: torch.Tensor | None) -> dict:
        return dict(window_size=self.window_size, softcap=self.softcap, sinks=sinks)

    def flops(self, backward: bool) -> float:
        pairs = visible_pairs(self.seqlen, self.seqlen, self.causal, self.window_size)
        forward = 4.0 * self.batch * self.nheads * pairs * self.head_dim
        return forward * BACKWARD_FLOPS if backward else forward

    def name(self) -> str:
        parts = [f"{self.batch}x{self.nheads}x{self.seqlen}x{self.head_dim}", "causal" if self.causal else "full"]
        if self.window_size != (-1, -1):
            parts.append(f"window {self.window_size}")
        if self.softcap:
            parts.append(f"softcap {self.softcap:g}")
        if self.sinks:
            parts.append("sinks")
        return " ".join(parts)


def flex_call(case: Case, q, k, v, backward: bool) -> Callable[[], object]:
    """FlexAttention, compiled (bench.flex_attention_call): the case's mask and softcap."""
    forward, inputs = flex_attention_call(q, k, v, case.causal, case.window_size, case.softcap, backward)
    return gradient_of(forward, inputs) if backward else forward


def fa_call(case: Case, q, k, v, sinks, backward: bool) -> Callable[[], object]:
    def forward():
        return flash_attn_func(q, k, v, causal=case.causal, deterministic=case.deterministic, **case.variants(sinks))

    return gradient_of(forward, (q, k, v)) if backward else forward


def judged(case: Case, q, k, v, sinks, backward: bool) -> None:
    """Raise unless fa_kernel's result for the case is within the bound (forward, or gradients)."""
    variants = case.variants(sinks)
    if backward:
        dout = torch.randn_like(q)
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        out = flash_attn_func(q_, k_, v_, causal=case.causal, deterministic=case.deterministic, **variants)
        out.backward(dout)
        verdict = judge_backward(q, k, v, dout, (q_.grad, k_.grad, v_.grad), case.causal, **variants)
    else:
        out, lse = flash_attn_func(q, k, v, causal=case.causal, return_lse=True, **variants)
        verdict = judge(q, k, v, out, lse, case.causal, **variants)
    if not verdict.passed:
        raise AssertionError(f"{case.name()}: {verdict}")


def rate(call, work: float, args, per_ms: float = 1e9):
    """A timer of `call`: `work` over its median milliseconds, per `per_ms` (TFLOP/s of FLOPs with
    1e9, GB/s of bytes with 1e6)."""
    return lambda: work / cuda_median_ms(call, repeats=args.repeats) / per_ms


def row(cases: dict[str, Case], anchor: str, args, with_flex: bool) -> None:
    """Time the named cases (and FlexAttention on the first: "flex") alternated, each judged first
    where its reference fits; print TFLOP/s and each one's ratio to `anchor` (ab.print_row)."""
    first = next(iter(cases.values()))
    timers = {}
    for name, case in cases.items():
        q, k, v = (t.requires_grad_(args.backward) for t in random_qkv(
            case.batch, case.seqlen, case.seqlen, case.nheads, case.nheads, case.head_dim, case.dtype, seed=1
        ))  # fmt: skip
        sinks = torch.randn(case.nheads, device=q.device) if case.sinks else None
        # Judged where the fp32 reference's scores fit beside the timing (the backward's
        # reference keeps several [batch, heads, seqlen, seqlen] tensors at once).
        if case.seqlen * case.seqlen * case.batch * case.nheads <= (2**29 if args.backward else 2**31):
            judged(case, q, k, v, sinks, args.backward)
        flops = case.flops(args.backward)
        timers[name] = rate(fa_call(case, q, k, v, sinks, args.backward), flops, args)
        if with_flex and case is first:
            timers["flex"] = rate(flex_call(case, q, k, v, args.backward), flops, args)
    ab.print_row(first.name(), {anchor: timers.pop(anchor), **timers}, args.rounds)


UNIT = "TFLOP/s on the visible pairs"


def window_table(args) -> None:
    print("\n## window: 32k tokens, 4k window, causal, against plain causal at 4k tokens")
    ab.print_header(UNIT, ["causal 4k", "window"])
    for head_dim in (128,):
        cases = {"window": Case(1, 32768, head_dim, window_size=(4096, 0)), "causal 4k": Case(8, 4096, head_dim)}
        row(cases, "causal 4k", args, with_flex=False)


def flex_table(args) -> None:
    print("\n## against FlexAttention")
    ab.print_header(UNIT, ["flex", "fa_kernel"])
    for head_dim in (64, 128):
        for seqlen in (2048, 8192, 32768):
            batch = max(1, 32768 // seqlen)
            for window in ((128, 0), (1024, 0), (4096, 0)):
                if window[0] < seqlen:
                    row({"fa_kernel": Case(batch, seqlen, head_dim, window_size=window)}, "flex", args, True)
            for softcap in (30.0, 50.0):
                row({"fa_kernel": Case(batch, seqlen, head_dim, softcap=softcap)}, "flex", args, True)


def paths_table(args) -> None:
    print(
        "\n## the gradient's two paths under a window: dQ by atomic adds (the default here) and the"
        " fixed-order path (deterministic=True), against FlexAttention"
    )
    ab.print_header(UNIT, ["flex", "fa_kernel", "fixed order"])
    for head_dim in (64, 128):
        for window in ((128, 0), (512, 0), (1024, 0)):
            case = Case(4, 8192, head_dim, window_size=window)
            cases = {"fa_kernel": case, "fixed order": replace(case, deterministic=True)}
            row(cases, "flex", args, with_flex=True)


def cost_table(args) -> None:
    print("\n## cost of softcap and sinks (each against the plain kernel on the same shape)")
    ab.print_header(UNIT, ["plain", "softcap 30", "sinks"])
    for head_dim in (64, 128):
        for seqlen in (2048, 8192):
            batch = 32768 // seqlen
            for causal in (False, True):
                cases = {
                    "plain": Case(batch, seqlen, head_dim, causal),
                    "softcap 30": Case(batch, seqlen, head_dim, causal, softcap=30.0),
                    "sinks": Case(batch, seqlen, head_dim, causal, sinks=True),
                }
                row(cases, "plain", args, with_flex=False)


def window_configs(head_dim: int) -> list:
    """Every forward config the tables ship for causal `head_dim` on sm_90 (long, short and grid
    entries), each once, and the unshipped WINDOW_CANDIDATES: the candidates for a window's entry."""
    from fa_kernel.workbench.builds import shipped_builds

    builds = shipped_builds("sm_90", head_dims=(head_dim,))
    shipped = [build["config"] for build in builds if build["causal"]]
    return list(dict.fromkeys(shipped + WINDOW_CANDIDATES[head_dim]))


# Configs no table ships, for short windows: 64-key tiles waste half as many masked keys at a
# window's two edges as 128-key ones (a 128-key window spans 2-3 tiles of 128 per query block).
WINDOW_CANDIDATES = {
    64: [TileConfig(128, 64, 2, 256, persistent=True), TileConfig(192, 64, 3, 384, persistent=True)],
    128: [TileConfig(128, 64, 2, 256, persistent=True)],
}


def configs_table(args) -> None:
    print("\n## window configs: each shipped config (causal, left edge) against the one flash_attn_func picks")
    for head_dim in (64, 128):
        ab.print_header(UNIT, ["picked", *(str(config) for config in window_configs(head_dim))])
        for window in (128, 1024, 4096):
            config_row(Case(4, 8192, head_dim, window_size=(window, 0)), args)


def config_row(case: Case, args) -> None:
    """TFLOP/s of the case under flash_attn_func's pick and under each shipped config, each judged
    first, alternated."""
    from suite.launch import kernel_for, run_config

    from fa_kernel.variants import Variants

    q, k, v = random_qkv(case.batch, case.seqlen, case.seqlen, case.nheads, case.nheads, case.head_dim, case.dtype, 1)
    scale, flops, variants = case.head_dim**-0.5, case.flops(backward=False), Variants(window_left=True)
    timers = {"picked": rate(lambda: flash_attn_func(q, k, v, causal=True, window_size=case.window_size), flops, args)}
    for config in window_configs(case.head_dim):
        kernel = kernel_for(q, True, config, variants=variants)

        def call(kernel=kernel, config=config):
            return run_config(
                q, k, v, scale, True, config, kernel=kernel, variants=variants, window_size=case.window_size
            )

        out, lse = call()
        verdict = judge(q, k, v, out, lse, True, window_size=case.window_size)
        if not verdict.passed:
            raise AssertionError(f"{case.name()} {config}: {verdict}")
        timers[str(config)] = rate(call, flops, args)
    ab.print_row(case.name(), timers, args.rounds)


def tanh_table(args) -> None:
    print("\n## softcap's tanh: the shipped ex2 and division against tanh.approx (an A/B build option)")
    ab.print_header(UNIT, ["plain", "softcap 30", "softcap 30, tanh.approx"])
    for head_dim in (64, 128):
        for seqlen in (2048, 8192):
            for causal in (False, True):
                tanh_row(Case(32768 // seqlen, seqlen, head_dim, causal, softcap=30.0), args)


def tanh_row(case: Case, args) -> None:
    """The plain call, the softcap call, and the softcap under flash_attn_func's config built with
    tanh.approx, each judged first, alternated."""
    from suite.launch import run_config

    from fa_kernel.interface import kernel_build
    from fa_kernel.kernel import compiled_forward
    from fa_kernel.numerics import TANH_APPROX_ERROR
    from fa_kernel.variants import Variants

    q, k, v = random_qkv(case.batch, case.seqlen, case.seqlen, case.nheads, case.nheads, case.head_dim, case.dtype, 1)
    plain = Case(case.batch, case.seqlen, case.head_dim, case.causal)
    for judged_case in (plain, case):
        judged(judged_case, q, k, v, None, backward=False)
    launch = (case.batch, case.nheads, case.seqlen)
    build = kernel_build(q.device, case.head_dim, case.causal, q.dtype, case.seqlen, launch=launch)
    variants = Variants(softcap=True)
    kernel = compiled_forward(**build, variants=variants, tanh_approx=True)

    def approx():
        return run_config(
            q, k, v, case.head_dim**-0.5, case.causal, build["config"], kernel=kernel, variants=variants,
            softcap=case.softcap,
        )  # fmt: skip

    out, lse = approx()
    verdict = judge(q, k, v, out, lse, case.causal, softcap=case.softcap, tanh_error=TANH_APPROX_ERROR)
    if not verdict.passed:
        raise AssertionError(f"{case.name()} tanh.approx: {verdict}")
    flops = case.flops(backward=False)
    timers = {
        "plain": rate(fa_call(plain, q, k, v, None, False), flops, args),
        "softcap 30": rate(fa_call(case, q, k, v, None, False), flops, args),
        "softcap 30, tanh.approx": rate(approx, flops, args),
    }
    ab.print_row(case.name(), timers, args.rounds)


def decode_table(args) -> None:
    print(
        "\n## decode: a step with a left edge reads only the window's K/V (HBM: H100 SXM 3.35 TB/s,"
        " H200 4.8 TB/s), against a plain step over as many keys"
    )
    ab.print_header("GB/s of the K/V a step must read", ["plain, as many keys", "window"])
    for seqlen_k in (8192, 32768):
        for window in (1024, 4096):
            decode_row(seqlen_k, window, args)


def decode_row(seqlen_k: int, window: int, args) -> None:
    """64 sequences of one query, 32 query heads on 8 K/V heads, d128 bf16: the step over the
    window's window + 1 keys of `seqlen_k`, and a plain step over window + 1 keys (the same bytes)."""
    batch, heads, heads_kv, head_dim, dtype = 64, 32, 8, 128, torch.bfloat16
    q, k, v = random_qkv(batch, 1, seqlen_k, heads, heads_kv, head_dim, dtype, seed=1)
    keys = window + 1
    k_short, v_short = k[:, -keys:].contiguous(), v[:, -keys:].contiguous()
    out, lse = flash_attn_func(q, k, v, window_size=(window, -1), return_lse=True)
    verdict = judge(q, k, v, out, lse, False, window_size=(window, -1))
    if not verdict.passed:
        raise AssertionError(f"decode {seqlen_k} keys, window {window}: {verdict}")
    read = 2 * batch * keys * heads_kv * head_dim * dtype.itemsize  # K and V, once each
    timers = {
        "plain": rate(lambda: flash_attn_func(q, k_short, v_short), read, args, per_ms=1e6),
        "window": rate(lambda: flash_attn_func(q, k, v, window_size=(window, -1)), read, args, per_ms=1e6),
    }
    ab.print_row(f"{batch}x{heads}/{heads_kv}x1x{seqlen_k}x{head_dim} window {window}", timers, args.rounds)


TABLES = {
    "window": window_table,
    "flex": flex_table,
    "cost": cost_table,
    "configs": configs_table,
    "decode": decode_table,
    "tanh": tanh_table,
    "paths": paths_table,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", choices=sorted(TABLES), default=["window", "flex", "cost", "decode"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--backward", action="store_true", help="time the gradients instead of the forward")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "backward" if args.backward else "forward")
    for name in args.tables:
        TABLES[name](args)


if __name__ == "__main__":
    main()
