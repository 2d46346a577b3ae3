"""Alternative builds of the FlashAttention-2 forward kernel, for measurement on the H200.

Every builder here returns a TileLang PrimFunc with exactly the launch signature and the
semantics of the shipped `fa_kernel.kernel.forward_program`:

    kernel(Q [B, Sq, H, D], K [B, Sk, Hkv, D], V [B, Sk, Hkv, D],
           Output [B, Sq, H, D], LSE [B, H, Sq] fp32, scale_log2)

batch, both sequence lengths and both head counts symbolic (`T.dynamic`), GQA by head
groups, bottom-right causal alignment (query i sees key j iff j <= i + Sk - Sq), output 0
and LSE -inf for a row that sees no key, at least one K/V tile processed per block.

Variants (see VARIANTS at the bottom; `build(name, ...)` dispatches):

  shipped              the kernel as shipped (imported, not copied): FA3's schedule with a
                       hand-written producer warpgroup (TMA + mbarriers), P.V of tile j-1
                       overlapping the softmax of tile j, consumer warpgroups taking turns
                       (ping-pong / ring), masks only where needed, causal heaviest-first.

Patched builds of the shipped kernel (kernel.py with fragments replaced, found by their AST,
loaded as a module of its own; a patch that no longer applies raises). Levers, correct:

  fma_exp2_1of8        exp2 of 1 column group in 8 on the FMA pipe (a polynomial, as
                       FlashAttention-4 does), the rest on MUFU: d64 +3% with free-running
                       warpgroups, -4% with the ring; d128 -2..-4%.
  fma_exp2_1of4        1 column group in 4: no gain at d64 (3 in 8 measured -5%).
  mask_first           the mask written before the turn-taking wait, not after it: -3% d128.
  (row_limit_mask, the mask from one bound per row, measured within noise and -4% d64 causal
  free: perf/variants.py before the patches were anchored on the AST has it.)
  (two_blocks_per_sm, measured at a1545a2, is now a config: TileConfig.blocks_per_sm, "/2persm"
  in sweep configs, shipped for causal at seqlen_k <= 2048.)

  turns_from_8 / 16   take turns only in blocks with more than 8 / 16 K/V tiles: d64 causal
                       370 / 374 against the ring's 357-361 and free 380-388.
(The ring of three consumer warpgroups was a patch here (measured at a1545a2), `round_robin`,
before it became kernel.py's `config.take_turns`; `inter_tile_overlap` (measured at b162cfc), the
next work tile's S_0 issued before the current tile's epilogue, became kernel.py's
`config.overlap_epilogue`. Since fb2a424 the softmax of every tile after the first keeps the
max from before the tile unless its sum says otherwise (kernel.STALE_SUM_LIMIT), so the patches
on the row max and the rescale it made obsolete left with it: pinned, skip_rescale,
lazy_rescale, wait_both, pairwise_max and the no_max diagnostic; perf/variants.py at c0e6052
has them, docs/perf-log.md their numbers.)

`file:PATH` names another copy of kernel.py (an earlier commit's): the sweep then measures a
change against its parent in one process.

Leave-one-out diagnostics, timing only (wrong results by design, in KNOWN_INCORRECT): what
the kernel would gain if a piece of the softmax cost nothing.

  gemm_only            no softmax in the loop's tiles: loads, both GEMMs, down-cast, syncs.
  no_exp               the exp2 of every score left out (the MUFU work).

The hand-written warp-specialised variants measured before the shipped kernel took their
schedule (ws_explicit, overlap, overlap_masked_tail, overlap_pingpong) are in git history
(perf/variants.py before the commit that moved overlap_pingpong into kernel.py), and so is
the FA2 family written with TileLang's own warp specialisation (fa2_auto_ws, masked_tail,
sw_pipeline: perf/variants.py at 36e0a04; its one winning case, d64 non-causal, the ring now
matches); docs/perf-log.md has their numbers. `config.threads` counts consumer threads for every variant (TileLang or
the shipped kernel adds the 128-thread producer warpgroup), so a TileConfig means the same
launch everywhere.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import tilelang
from tools.ast_mutants import apply_patch

from fa_kernel import kernel as shipped_kernel
from fa_kernel.configs import TileConfig
from fa_kernel.kernel import PASS_CONFIGS, forward_program

# --------------------------------------------------------------------------------------
# Patched builds of the shipped kernel
# --------------------------------------------------------------------------------------

# Each patch is (old, new): `old` a fragment of kernel.py (an expression, or statements in a
# row) found once by its AST (tools/ast_mutants.apply_patch), so a reformat of the kernel keeps
# the variants building; tests/test_perf_tools.py fails when one no longer applies.

# The steady-state loop's softmax against the stale max: the statements gemm_only replaces.
_STALE_SOFTMAX = """exponentials(acc_s, rows.row_max_scaled, rows.tile_sum, scale_log2)
row_over = 0
for i in T.Parallel(block_m):
    if rows.tile_sum[i] > STALE_SUM_LIMIT:
        row_over = 1"""
_EXP = "acc_s[i, j] = T.exp2(acc_s[i, j] * scale_log2 - row_max_scaled[i])"

# exp2 on the FMA pipe for some columns (FlashAttention-4's trick, there on Blackwell): at
# d64 the MUFU work per tile equals the tensor-core work, so moving part of it to the
# otherwise idle FP32 pipe can shorten the loop. 2^x = 2^round(x) * 2^f, f in [-0.5, 0.5]:
# round() by the 1.5*2^23 addition (fp32 keeps no fraction bits there), 2^f by a degree-4
# polynomial through 1 (relative error 2.9e-6 = 2^-18.4, under fp16's 2^-11 rounding of P),
# 2^round(x) by adding round(x) to the exponent field. x is clamped at -127 so that a masked
# score (-inf) gives exactly +0: 1.0's exponent field 127 minus 127.
_EXP2_ON_FMA = """_ROUNDING_SHIFTER = 12582912.0
_EXP2_COEFFS = (0.6931242346763611, 0.24024099111557007, 0.05590630695223808, 0.00958279613405466)


def exp2_on_fma(x):
    x = T.max(x, -127.0)
    shifted = x + _ROUNDING_SHIFTER
    # __fadd_rn: TVM's simplifier would fold (x + c) - c to x, and nvcc may not either.
    frac = x - T.call_pure_extern("float32", "__fadd_rn", shifted, -_ROUNDING_SHIFTER)
    c1, c2, c3, c4 = _EXP2_COEFFS
    poly = 1.0 + frac * (c1 + frac * (c2 + frac * (c3 + frac * c4)))
    bits = T.reinterpret(poly, "int32") + T.shift_left(T.reinterpret(shifted, "int32"), 23)
    return T.reinterpret(bits, "float32")
"""
# The module-level statement the helper is inserted after.
_EXP2_ANCHOR = "H100_SM_COUNT = 132"


def _exp2_on_fma_patch(every: int, of: int):
    """Columns whose group of 8 (lane-uniform: the register index, not the lane) is among the
    first `every` of each `of` groups get exp2_on_fma; the rest keep MUFU.EX2."""
    x = "acc_s[i, j] * scale_log2 - row_max_scaled[i]"
    return (
        (_EXP2_ANCHOR, _EXP2_ANCHOR + "\n" + _EXP2_ON_FMA),
        (_EXP, f"acc_s[i, j] = T.if_then_else((j // 8) % {of} < {every}, exp2_on_fma({x}), T.exp2({x}))"),
    )


# The mask written before the ping-pong / ring wait instead of after it: the wait orders the
# warpgroups' GEMM issues, and the mask fill (block_m x block_n selects) between the wait and
# the GEMM delays every warpgroup behind this one.
_WAIT_TURN_THEN_SCORES = """T.mbarrier_wait_parity(pipe.k_full[stage], phase)
if take_turns:
    wait_turn(thread)
issue_scores(pipe.Q, ring_stage(pipe.K, stage), acc_s, kv_start, q_start, diagonal_offset, seqlen_k)"""
_MASK_FIRST = (
    (
        _WAIT_TURN_THEN_SCORES,
        "if needs_mask(kv_start, q_start, diagonal_offset, seqlen_k):\n"
        "    write_mask(acc_s, kv_start, q_start, diagonal_offset, seqlen_k)\n"
        + _WAIT_TURN_THEN_SCORES.replace("seqlen_k)", "seqlen_k, mask_written=True)"),
    ),
)


# Take turns only in thread blocks with more than `min_tiles` K/V tiles (a runtime test,
# uniform over the block): is the ring's loss at d64 causal in the short blocks?
def _turns_from_patch(min_tiles: int):
    return (
        (
            "thread >= consumers - 128 and num_kv_blocks > 1",
            f"thread >= consumers - 128 and num_kv_blocks > {max(1, min_tiles)}",
        ),
        (  # in the loop
            "if take_turns:\n    wait_turn(thread)",
            f"if take_turns and num_kv_blocks > {min_tiles}:\n    wait_turn(thread)",
        ),
        (
            "thread < consumers - 128 or kv_block < num_kv_blocks - 1",
            f"num_kv_blocks > {min_tiles} and (thread < consumers - 128 or kv_block < num_kv_blocks - 1)",
        ),
        (  # the turns of the tiles a warpgroup releases unread (kernel.warpgroup_kv_blocks)
            "if take_turns:\n    wait_turn(thread)\n    pass_turn(thread, kv_block, num_kv_blocks)",
            f"if take_turns and num_kv_blocks > {min_tiles}:\n"
            "    wait_turn(thread)\n    pass_turn(thread, kv_block, num_kv_blocks)",
        ),
    )


PATCHES: dict[str, tuple[tuple[str, str], ...]] = {
    # (the vote stays: row_over 0, every tile keeps its max)
    "gemm_only": ((_STALE_SOFTMAX, "row_over = 0"),),
    "no_exp": ((_EXP, "acc_s[i, j] = acc_s[i, j] * scale_log2 - row_max_scaled[i]"),),
}
PATCHES["fma_exp2_1of8"] = _exp2_on_fma_patch(1, 8)
PATCHES["fma_exp2_1of4"] = _exp2_on_fma_patch(1, 4)
PATCHES["mask_first"] = _MASK_FIRST
PATCHES["turns_from_8"] = _turns_from_patch(8)
PATCHES["turns_from_16"] = _turns_from_patch(16)


def _patched_kernel_module(name: str):
    """kernel.py with PATCHES[name] applied, imported from a file (TileLang reads the source)."""
    return patched_module(shipped_kernel, name, tuple(PATCHES[name]))


@functools.cache
def patched_module(module, name: str, patches: tuple[tuple[str, str], ...]):
    """`module` (one of fa_kernel's) with `patches` ((old, new) fragments, found by their AST)
    applied, imported from a file of its own: TileLang reads a kernel's source from there."""
    stem = Path(module.__file__).stem
    source = Path(module.__file__).read_text()
    for old, new in patches:
        try:
            source = apply_patch(source, old, new)
        except ValueError as error:
            raise ValueError(f"variant {name}: {error} in {stem}.py") from error
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    slug = re.sub(r"\W", "_", name)  # a variant's name may hold spaces and dashes; a module's may not
    path = Path(tempfile.gettempdir()) / "fa_kernel_variants" / f"{stem}_{slug}_{digest}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: two sweeps (one per GPU) may build the same variant at once,
    # and TileLang re-reads the file; a half-written one failed with "could not get source code".
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(source)
    os.replace(partial, path)
    return _import_file(path, f"fa_kernel_{stem}_variant_{slug}")


def _import_file(path: Path, module_name: str):
    """A copy of one of fa_kernel's modules as a module of its own (TileLang reads the kernel's
    source from it)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _patched_program(name: str, **kwargs):
    return _patched_kernel_module(name).forward_program(**kwargs)


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------

Builder = Callable[..., object]

VARIANTS: dict[str, Builder] = {
    "shipped": forward_program,
    **{name: functools.partial(_patched_program, name) for name in PATCHES},
}


# The leave-one-out diagnostics are wrong by design; the sweep leaves them out unless named.
KNOWN_INCORRECT = frozenset({"gemm_only", "no_exp"})


# "file:PATH" names another copy of kernel.py (an earlier commit's, `git show REV:src/fa_kernel/kernel.py`),
# so a change is measured against its parent in one process.
FILE_PREFIX = "file:"


def is_variant(name: str) -> bool:
    return name in VARIANTS or (name.startswith(FILE_PREFIX) and Path(name[len(FILE_PREFIX) :]).is_file())


@functools.cache
def _kernel_module_from_file(path: str):
    return _import_file(Path(path), f"fa_kernel_file_{hashlib.sha1(path.encode()).hexdigest()[:12]}")


def build(name: str, head_dim: int, causal: bool, dtype: str, config: TileConfig):
    """The PrimFunc of variant `name` (dtype "float16" or "bfloat16")."""
    if name.startswith(FILE_PREFIX):
        module = _kernel_module_from_file(str(Path(name[len(FILE_PREFIX) :]).resolve()))
        return module.forward_program(head_dim=head_dim, causal=causal, dtype=dtype, config=config)
    return VARIANTS[name](head_dim=head_dim, causal=causal, dtype=dtype, config=config)


def compile_variant(name: str, head_dim: int, causal: bool, dtype: str, config: TileConfig, arch: str | None = None):
    """tilelang.compile of a variant with the shipped pass configs (a `file:` copy of kernel.py
    with its own); arch None = this GPU."""
    target = "auto" if arch is None else {"kind": "cuda", "arch": arch}
    pass_configs = PASS_CONFIGS
    if name.startswith(FILE_PREFIX):
        module = _kernel_module_from_file(str(Path(name[len(FILE_PREFIX) :]).resolve()))
        pass_configs = getattr(module, "PASS_CONFIGS", PASS_CONFIGS)
    return tilelang.compile(build(name, head_dim, causal, dtype, config), target=target, pass_configs=pass_configs)
