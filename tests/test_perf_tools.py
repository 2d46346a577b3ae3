"""perf/'s A/B tools still apply to the kernels and parse their command lines (no GPU needed).

perf/backward_ab.py's variants are build options of the backward kernel and perf/decode_ab.py's
edits of the split-KV tile table: an edit of the kernels that drops one must fail here, not on
the GPU machine in the middle of a measurement.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def assert_runs_from_the_root(code: str) -> None:
    """`code` runs in a Python of its own from the repository root: perf/ is a folder of
    scripts beside the package, imported from there."""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.compile
def test_every_backward_variant_is_a_build_option_of_its_kernel():
    assert_runs_from_the_root(
        "from perf import backward_ab\n"
        "from fa_kernel import backward, backward_dq\n"
        "for arguments in backward_ab.VARIANTS.values():\n"
        "    block_m, block_n, stages = backward.BACKWARD_TILES[64]\n"
        "    tile = dict(block_m=block_m, block_n=block_n, num_stages=stages)\n"
        "    backward.backward_program(head_dim=64, causal=True, dtype='float16', **(tile | arguments))\n"
        "for arguments in backward_ab.DQ_VARIANTS.values():\n"
        "    block_m, block_n, stages = backward_dq.DQ_TILES[64]\n"
        "    tile = dict(block_m=block_m, block_n=block_n, num_stages=stages)\n"
        "    backward_dq.dq_program(head_dim=64, causal=True, dtype='float16', **(tile | arguments))\n"
    )


@pytest.mark.compile
def test_every_split_kv_variant_builds_from_its_copy_of_decode_py():
    assert_runs_from_the_root(
        "from perf import decode_ab\n"
        "for name in decode_ab.VARIANTS:\n"
        "    kernels = decode_ab.module(name)\n"
        "    for (head_dim, _), tile in kernels.SPLIT_TILES.items():\n"
        "        kernels.split_program(head_dim=head_dim, causal=True, dtype='bfloat16', config=tile)\n"
    )


def test_the_ab_tables_drop_failing_variants_and_take_ratios_round_by_round():
    assert_runs_from_the_root(
        "import contextlib, io, itertools\n"
        "from perf import ab\n"
        "fails = lambda name: ['off by 5%'] if name == 'b' else []\n"
        "assert ab.within_the_bound(['shipped', 'a', 'b'], fails) == ['shipped', 'a']\n"
        "assert ab.within_the_bound(['shipped', 'a'], lambda name: ['wrong'] if name == 'shipped' else []) is None\n"
        "rounds = itertools.count()\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    ab.print_row('s', {'shipped': lambda: 100.0, 'a': lambda: 110.0 + next(rounds)}, 3)\n"
        "assert out.getvalue() == '| s | 100 | 111 | 1.110x (1.100-1.120) |\\n', out.getvalue()\n"
    )


def test_decode_ab_names_a_shape_index_outside_the_grid_before_anything_runs():
    result = subprocess.run(
        [sys.executable, "-m", "perf.decode_ab", "--graphs", "--cudnn", "--shapes", "0", "99"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "--shapes: expected indices 0-" in result.stdout, result.stderr[-2000:]
    assert "got [99]" in result.stdout


def test_host_overhead_parses_its_command_line_without_a_gpu():
    # Its layers need a GPU; what it imports and how it is called are checked here.
    result = subprocess.run(
        [sys.executable, "-m", "perf.host_overhead", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0 and "--profile" in result.stdout, result.stderr[-2000:]


def test_host_stubbed_times_every_layer_on_the_cpu():
    # Its stub rewrites interface.py's text: a line it no longer finds must fail here.
    result = subprocess.run(
        [sys.executable, "-m", "perf.host_stubbed", "--calls", "20"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for layer in ("no grad forward", "forward, grad", "training call", "backward_into", "SDPA training"):
        assert f"| {layer} | " in result.stdout, result.stdout


def test_variant_cases_count_the_pairs_their_mask_leaves_visible():
    # perf/variants.py's TFLOP/s are counted on visible pairs: the count must be the rule's.
    from perf.variants import Case

    from fa_kernel.reference import visible_keys

    for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (True, (50, -1)), (False, (7, 20)), (False, (-1, 5))):
        case = Case(1, 300, 64, causal, window)
        pairs = case.flops(backward=False) / (4 * case.batch * case.nheads * case.head_dim)
        assert pairs == int(visible_keys(300, 300, causal, window_size=window).sum()), case.name()


def test_packed_documents_span_512_to_8192_tokens_and_fill_the_batch():
    # perf/varlen.py's batch: issue 55's mix of documents, drawn once.
    from perf.varlen import document_lengths

    lengths = document_lengths(32768)
    assert all(512 <= n < 8192 for n in lengths) and sum(lengths) >= 32768 > sum(lengths[:-1])
    assert document_lengths(32768) == lengths  # the same batch every run
    assert len(set(lengths)) > len(lengths) // 2  # ragged, not one length


def test_the_paged_timing_cache_holds_each_request_s_keys_in_its_shuffled_pages():
    # perf/paged.py times the cache it builds here: its pages must be the contiguous keys.
    import torch
    from perf.paged import paged_cache, ragged_lengths

    lengths = ragged_lengths(16)
    assert all(1024 <= n < 32768 for n in lengths) and len(set(lengths)) > 8
    k, v = torch.randn(2, 2, 100, 2, 4).unbind(0)
    k_cache, v_cache, table, seqlens = paged_cache(k, v, [100, 37], page_size=16)
    assert seqlens.tolist() == [100, 37] and table.dtype == torch.int32
    assert table.flatten().tolist() != sorted(table.flatten().tolist())  # not in order
    for source, cache in ((k, k_cache), (v, v_cache)):
        for b, length in enumerate((100, 37)):
            rows = cache[table[b].long()].flatten(0, 1)[:length]
            assert torch.equal(rows, source[b, :length])


def test_the_gradient_splits_script_reads_its_shapes_as_the_bench_labels_them():
    # perf/gradient_splits.py's shapes: each default reads back to the label its table prints.
    import argparse

    from perf.gradient_splits import SHAPES, parse_shape

    shape = parse_shape("8x71/1x2048x64c")
    assert (shape.batch, shape.nheads, shape.heads_kv, shape.seqlen_q, shape.head_dim) == (8, 71, 1, 2048, 64)
    assert shape.causal and shape.label() == "8x71/1x2048x64 bfloat16 causal"
    assert not parse_shape("1x8/1x4096x128").causal
    chunk = parse_shape("1x16/2x2048x32768x128c")
    assert (chunk.seqlen_q, chunk.keys, chunk.head_dim) == (2048, 32768, 128)
    assert chunk.label() == "1x16/2x2048x32768x128 bfloat16 causal"
    assert len({parse_shape(text).label() for text in SHAPES}) == len(SHAPES)
    with pytest.raises(argparse.ArgumentTypeError, match="expected BxH/HKVxSxD"):
        parse_shape("8x71x2048x64")


def test_the_gradient_splits_table_sets_each_path_against_the_default_gradient():
    # perf/gradient_splits.table_rows: each path's best over its own figure at the model's pick,
    # and over the atomic path's there (what the default gradient runs); "-" without it.
    from perf.gradient_splits import table_rows

    medians = {("atomic", 1): 300.0, ("atomic", 3): 330.0, ("fixed_order", 1): 370.0, ("fixed_order", 3): 320.0}
    atomic, fixed = table_rows("s", 3, medians)
    assert atomic == "| s | atomic | 1: 300, 3*: 330 | 3 | 3 | 1.000x | 1.000x |"
    assert fixed == "| s | fixed_order | 1: 370, 3*: 320 | 3 | 1 | 1.156x | 1.121x |"
    (alone,) = table_rows("s", 1, {("fixed_order", 1): 370.0})
    assert alone.endswith("| 1.000x | - |")


def test_the_pending_gpu_calls_name_only_variants_and_tables_their_tools_have():
    # A misspelt variant or table in docs/pending/gpu-calls costs a device call (the tool stops at
    # its arguments on the GPU host): each perf.backward_ab --variants and perf.variants --tables
    # there is checked against the tool's own lists here.
    import re
    import shlex

    calls = sorted((ROOT / "docs" / "pending" / "gpu-calls").glob("*.sh"))
    assert calls
    named = []
    for script in calls:
        text = script.read_text().replace("\\\n", " ")
        for module, rest in re.findall(r"python3? -u -m (perf\.\w+)([^\n>]*)", text):
            words = [word for word in shlex.split(rest) if not word.startswith("$")]
            flag = {"perf.backward_ab": "--variants", "perf.variants": "--tables"}.get(module)
            if flag in words:
                after = words[words.index(flag) + 1 :]
                given = list(itertools.takewhile(lambda word: not word.startswith("--"), after))
                named.append((script.name, module, "--dq" in words, given))
        # A loop's names that a later perf.backward_ab call takes as "$variant".
        for names in re.findall(r"for variant in ([^;\n]+);", text):
            named.append((script.name, "perf.backward_ab", False, names.split()))
    assert any(module == "perf.backward_ab" for _, module, _, _ in named)
    lists = (
        "from perf import backward_ab, variants\n"
        "import json, sys\n"
        "print(json.dumps([sorted(backward_ab.VARIANTS), sorted(backward_ab.DQ_VARIANTS), sorted(variants.TABLES)]))\n"
    )
    result = subprocess.run([sys.executable, "-c", lists], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    backward, dq, tables = (set(names) for names in json.loads(result.stdout.splitlines()[-1]))
    for script, module, with_dq, given in named:
        known = tables if module == "perf.variants" else dq if with_dq else backward
        assert set(given) <= known, f"{script}: {module} {sorted(set(given) - known)} unknown"
