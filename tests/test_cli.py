"""The CLI where there is no GPU: it says so plainly and exits with a code that tells why."""

from __future__ import annotations

import io

import pytest
import torch

from fa_kernel.configs import grid_bands, select_config
from fa_kernel.workbench.cli import main
from fa_kernel.workbench.console import EXIT_COMPILED_ONLY, EXIT_FAILED, EXIT_NO_GPU

# Every (band, key range) of each case at head_dim 64, 128 and 256, as `fa-kernel info` lists them.
TABLE_ROWS = sum(
    len(ranges) for d in (64, 128, 256) for causal in (False, True) for _, ranges in grid_bands("sm_90", d, causal)
)
# The distinct configs of each case: the kernels verify compiles (each in both dtypes).
TABLE_CONFIGS = sum(
    len({config for _, ranges in grid_bands("sm_90", d, causal) for _, _, config in ranges})
    for d in (64, 128, 256)
    for causal in (False, True)
)
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")


def test_info_lists_a_config_for_every_case(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    # six (head_dim, causal) cases, each band of grids and its short-sequence entries
    assert "tilelang 0.1.15" in out and out.count("thr") == TABLE_ROWS
    assert "tuned (grid)" in out and "<= 3.88" in out and "3.88-15.52" in out
    # and where decode steps go, read off split_kv_serves (for an H200's 132 SMs without a GPU)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    text = " ".join(out.split())
    assert "number at most 64;" in text and f"batch x heads at one query, is at most {sms // 2} on {sms} SMs" in text
    assert (
        "(waves of its tiles x seqlen_k) reach 4096;" in text
        and "at most 8 queries, or with GQA from 3072 keys" in text
    )
    # and the gradient kernels' tiles, from their tables
    assert "(fa_kernel.backward; tiles by head_dim: d64 128 rows x 128 keys, 2 stage(s), d128 64 rows" in text
    assert "(one consumer warpgroup per 64 rows: d64 128 rows x 128 keys, 2 stage(s), d128 128 rows" in text
    assert "runs it without dQ (d64 64 rows x 128 keys, 2 stage(s), d128 64 rows" in text  # DK_DV_TILES
    assert "regions: d128 to 512 keys; d128 to 1024 keys, right edge; d128 to 2048 keys, groups of 5+" in text


@no_gpu
@pytest.mark.parametrize("command", ["bench", "tune"])
def test_gpu_only_commands_say_they_need_a_gpu(command, capsys):
    assert main([command]) == EXIT_NO_GPU
    assert "needs a CUDA GPU" in capsys.readouterr().out


@no_gpu
@pytest.mark.compile
def test_verify_without_gpu_compiles_and_says_nothing_ran(capsys):
    assert main(["verify"]) == EXIT_COMPILED_ONLY
    out = capsys.readouterr().out
    # every (head_dim, causal) case's config, and the short-sequence configs beside them
    assert "Nothing was run on a GPU" in out and out.count("compiled bfloat16") == TABLE_CONFIGS


@pytest.mark.parametrize(
    ("command", "argument"), [("tune", "--rounds"), ("tune", "--keys"), ("tune", "--jobs"), ("bench", "--repeats")]
)
def test_counts_that_are_not_positive_are_refused_by_name(command, argument, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, argument, "0"])
    assert exit_info.value.code == 2
    assert f"argument {argument}" in (err := capsys.readouterr().err) and "expected a positive integer, got '0'" in err


def test_tune_times_every_candidate_over_the_ladder_and_prints_the_tables(monkeypatch, capsys, tmp_path):
    # The search and the printout, with the GPU parts stubbed: a made-up speed per config and
    # length, under which a persistent 128x128 grid wins up to 2048 keys and 128x176 beyond.
    import fa_kernel.workbench.tune as tune
    from fa_kernel.configs import TileConfig
    from fa_kernel.workbench.bench import Shape

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    device = type("Properties", (), {"multi_processor_count": 132})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *args: device)
    # inputs as small as can be that still say their length (dim 1, as in BSHD)
    monkeypatch.setattr(Shape, "inputs", lambda self, seed=0: (torch.empty(1, self.seqlen_q, 1, 1),) * 3)
    short, long = TileConfig(128, 128, 2, 256, persistent=True), TileConfig(128, 176, 2, 256)
    compiled = []

    from fa_kernel.workbench import tune_command

    monkeypatch.setattr(tune, "device_target", lambda: (132, "sm_90a"))
    monkeypatch.setattr(tune_command, "device_target", lambda: (132, "sm_90a"))

    def does_not_launch(*args):
        raise RuntimeError("Failed to set the dynamic shared memory size")

    def compile_stub(*, head_dim, causal, dtype, config, sm_count, arch):
        if config.block_m == 192 and head_dim == 128:
            raise RuntimeError("too many registers")
        assert arch == "sm_90a" and sm_count == 132  # as flash_attn_func builds them: one disk-cache key
        compiled.append(dict(head_dim=head_dim, causal=causal, dtype=dtype, config=config, sm_count=sm_count))
        if config.block_n == 64 and config.num_stages == 1:  # builds, but asks more shared memory than there is
            return does_not_launch
        return lambda q, k, v, out, lse, scale_log2: (config, q.shape[1])

    def median_ms_stub(call, warmup, repeats):
        config, keys = call()
        speed = {short: 1.2 if keys <= 2048 else 0.9, long: 1.0}.get(config, 0.5)
        return 1.0 / speed

    def build_all_inline(builds, jobs):  # the compile pool, run in this process
        errors = []
        for build in builds:
            try:
                compile_stub(**build)
                errors.append(None)
            except RuntimeError as error:
                errors.append(error)
        return errors

    monkeypatch.setattr(tune, "compiled_forward", compile_stub)
    monkeypatch.setattr(tune, "cuda_median_ms", median_ms_stub)
    monkeypatch.setattr(tune, "build_all", build_all_inline)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Test GPU")
    record = tmp_path / "tune.json"
    ladder = ["--keys", "4096", "1024", "2048"]
    options = ["--heads", "32", "--rounds", "2", "--jobs", "2", "--json", str(record)]
    assert main(["tune", "--head-dim", "128", *ladder, *options]) == 0
    out = capsys.readouterr().out
    # every candidate of each case is compiled, causal ones with two thread blocks per SM too,
    # by the pool first and then by the timing loop with the same arguments (the disk cache's key)
    pool_builds, loop_builds = compiled[: len(compiled) // 2], compiled[len(compiled) // 2 :]
    assert pool_builds == loop_builds
    for causal in (False, True):
        expected = [c for c in tune.candidate_configs(causal) if c.block_m != 192]
        assert [build["config"] for build in loop_builds if build["causal"] == causal] == expected
    assert "192x128/2st/384thr: does not compile (RuntimeError)" in out
    # built by the pool, the ones that do not fit are not built again; one that does not launch is not timed
    assert "64x64/1st/128thr: does not launch (RuntimeError: Failed to set the dynamic shared memory size)" in out
    assert "timing every candidate at [1024, 2048, 4096] keys" in out
    assert "  shapes: 32x32x1024x128 float16 causal, 16x32x2048x128" in out  # 32k tokens, the heads asked for
    text = out[out.index("# Paste into TUNED in") :]
    namespace = {"TileConfig": TileConfig}
    long_part, short_part = text.split("# Paste into TUNED_SHORT")
    tuned = eval("{" + long_part.split("\n", 1)[1] + "}", namespace)  # noqa: S307 - our own printout
    tuned_short = eval("{" + short_part.split("\n", 1)[1] + "}", namespace)  # noqa: S307
    assert tuned == {("sm_90", 128, False): long, ("sm_90", 128, True): long}
    assert tuned_short == {("sm_90", 128, False): ((2048, short),), ("sm_90", 128, True): ((2048, short),)}
    import json

    cases = json.loads(record.read_text())["cases"]
    assert [case["entries"] for case in cases] == [[[2048, str(short)], [None, str(long)]]] * 2
    assert cases[1]["causal"] and cases[1]["alternated"]["1024"][str(short)] > cases[1]["alternated"]["1024"][str(long)]
    launched = [c for c in expected if not (c.block_n == 64 and c.num_stages == 1)]
    assert len(cases[1]["sweep"]["1024"]) == len(launched) > len(cases[1]["alternated"]["1024"]) == 2
    # the configs the table runs now are alternated too, for the comparison the tuner prints
    shipped = select_config("sm_90", 128, False, 4096, tune.sweep_tiles(32) / 132)  # d128, 4096 keys, 32 heads
    assert set(cases[0]["alternated"]["4096"]) == {str(short), str(long), str(shipped)}
    at_4096 = cases[0]["alternated"]["4096"]
    assert at_4096[str(shipped)] == pytest.approx(0.5 * at_4096[str(long)])  # its made-up speed
    assert "configs.py now" in out


def test_tune_on_several_grids_derives_a_band_where_a_small_grid_runs_another_config(monkeypatch, capsys, tmp_path):
    # --heads 2 32: made-up speeds under which two blocks an SM win on the small grid only;
    # --configs: only those candidates and the configs the tables run now are built and timed.
    import json

    import fa_kernel.workbench.tune as tune
    from fa_kernel.configs import TileConfig
    from fa_kernel.workbench import tune_command
    from fa_kernel.workbench.bench import Shape

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Test GPU")
    monkeypatch.setattr(Shape, "inputs", lambda self, seed=0: (torch.empty(1, self.seqlen_q, self.nheads, 1),) * 3)
    for module in (tune, tune_command):
        monkeypatch.setattr(module, "device_target", lambda: (132, "sm_90a"))
    two, long = TileConfig(64, 128, 2, 128, blocks_per_sm=2), TileConfig(128, 176, 2, 256)
    built = []

    def compile_stub(*, head_dim, causal, dtype, config, sm_count, arch):
        built.append(config)
        return lambda q, k, v, out, lse, scale_log2: (config, q.shape[2])

    def median_ms_stub(call, warmup, repeats):
        config, heads = call()
        return 1.0 / {two: 1.2 if heads == 2 else 0.8, long: 1.0}.get(config, 0.5)

    monkeypatch.setattr(tune, "compiled_forward", compile_stub)
    monkeypatch.setattr(tune, "cuda_median_ms", median_ms_stub)
    monkeypatch.setattr(tune, "build_all", lambda builds, jobs: [compile_stub(**build) and None for build in builds])
    record = tmp_path / "tune.json"
    arguments = ["tune", "--head-dim", "128", "--keys", "1024", "4096", "--heads", "32", "2", "--rounds", "2"]
    assert main([*arguments, "--configs", str(two), str(long), "--jobs", "2", "--json", str(record)]) == 0
    out = capsys.readouterr().out
    shipped = {c for causal in (False, True) for _, r in grid_bands("sm_90", 128, causal) for _, _, c in r}
    assert set(built) == {two, long, *shipped}
    assert "d128, 2 heads (3.88 work tiles an SM)" in out and "d128, 32 heads (62.06 work tiles an SM)" in out
    grids_part = out[out.index("# Paste into TUNED_GRIDS") :].split("\n", 1)[1]
    tuned_grids = eval("{" + grids_part + "}", {"TileConfig": TileConfig})  # noqa: S307 - our own printout
    band = ((3.88, ((None, two),)),)
    assert tuned_grids == {("sm_90", 128, False): band, ("sm_90", 128, True): band}
    bands = json.loads(record.read_text())["bands"]
    assert bands[0]["bands"] == [[3.88, [[None, str(two)]]], [None, [[None, str(long)]]]]
    with pytest.raises(SystemExit):
        main(["tune", "--configs", "128x128"])
    assert "expected BMxBN/Sst/Tthr" in capsys.readouterr().err


def timings(**medians_and_rounds) -> dict:
    """{implementation: bench.Timing} from {name: rounds} (the names' spaces as underscores)."""
    from fa_kernel.workbench.bench import Timing

    def name_of(key: str) -> str:
        return key.replace("_", " ") if key.startswith("cudnn") else key.replace("fa_kernel_", "fa_kernel ")

    return {name_of(key): Timing(tuple(rounds)) for key, rounds in medians_and_rounds.items()}


def test_tune_compile_only_builds_every_candidate_for_the_named_gpu_without_one(monkeypatch, capsys):
    from fa_kernel.workbench import tune

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pools = []
    monkeypatch.setattr(tune, "build_all", lambda builds, jobs: pools.append((builds, jobs)) or [None] * len(builds))
    assert main(["tune", "--head-dim", "256", "--compile-only", "sm_90a", "132", "--jobs", "2"]) == 0
    ((builds, jobs),) = pools
    expected = [(causal, config) for causal in (False, True) for config in tune.candidate_configs(causal)]
    assert [(build["causal"], build["config"]) for build in builds] == expected and jobs == 2
    assert {(build["head_dim"], build["arch"], build["sm_count"], build["dtype"]) for build in builds} == {
        (256, "sm_90a", 132, "float16")
    }
    every = len(expected)
    assert f"{every} of {every} candidate kernels compiled for sm_90a with 132 SMs" in capsys.readouterr().out
    assert main(["tune", "--compile-only", "90a", "lots"]) == 1
    assert "expected an nvcc arch and an SM count, like sm_90a 132, got 90a lots" in capsys.readouterr().out


def stub_builds(monkeypatch):
    """kernel_build and compile_arch without a GPU, wherever the CLI reaches them: itself, and
    through interface.serving_build (whose choice between the forward and the split-KV kernels
    stays the real one)."""
    import fa_kernel.interface as interface
    from fa_kernel.workbench import bench_command, verify_command

    for module in (bench_command, interface):
        monkeypatch.setattr(
            module, "kernel_build", lambda device, head_dim, causal, dtype, keys, launch: (head_dim, causal, keys)
        )
    for module in (bench_command, verify_command, interface):
        monkeypatch.setattr(module, "compile_arch", lambda device: "sm_90a")
    monkeypatch.setattr(interface, "device_target", lambda device: (132, "sm_90a"))


def test_bench_compares_against_the_faster_cudnn_layout_round_by_round(monkeypatch, capsys, tmp_path):
    import json

    from fa_kernel.workbench import bench_command as command

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Test GPU")
    # The BSHD view is cuDNN's faster layout here; the ratio is taken round by round against it.
    measured = timings(fa_kernel=[110, 120, 100], cudnn_BHSD=[90, 90, 90], cudnn_BSHD_view=[100, 100, 100], flash=[50])
    monkeypatch.setattr(command, "measure", lambda shape, rounds, repeats, backward: measured)
    # The kernels are built before anything is timed: one build per shape asked (no GPU here to build for).
    built = []
    stub_builds(monkeypatch)
    monkeypatch.setattr(
        command, "build_with_progress", lambda console, builds, jobs, *args, **kwargs: built.append(builds) or True
    )
    from fa_kernel.workbench.bench import Shape

    point = (Shape(1, 16, 512, 64, False), timings(fa_kernel=[90.0], cudnn_BHSD=[100.0]))
    monkeypatch.setattr(command, "plot_seqlen_sweep", lambda path, dtype, repeats, progress, rounds, backward: [point])
    plot = str(tmp_path / "plot.png")
    assert main(["bench", "--markdown", "--plot", plot]) == 0
    out = capsys.readouterr().out
    assert f"the points of {plot}" in out and "| 1x16x512x64 float16 | 90 | 100 | - | - | 0.90x | 0.90-0.90 |" in out
    assert "| 8x32x4096x128 float16 | 110 | 90 | 100 | 50 | 1.10x | 1.00-1.20 |" in out
    assert (128, True, 4096) in built[0] and (128, False, 8192) in built[0]  # the prefill's keys pick its config
    assert (64, True, 512) in built[0]  # and the plot's shapes, asked for with --plot
    assert main(["bench", "--json", "--plot", plot]) == 0
    record = json.loads(capsys.readouterr().out)
    first = record["results"][0]
    assert first["cudnn_best"] == "cudnn BSHD view" and first["ratio_to_cudnn_best"] == pytest.approx(1.1)
    assert first["rounds"]["fa_kernel"] == [110, 120, 100] and first["tflops"]["cudnn BHSD"] == 90
    assert record["plot"][0]["shape"] == "1x16x512x64 float16"
    assert record["plot"][0]["ratio_to_cudnn_best"] == pytest.approx(0.9)
    # Every shape of the grid is d128 or d64 here, each at 1.10x: the summary says so per head_dim.
    summary = {row["head_dim"]: row["median"] for row in record["summary"]}
    assert summary == {64: pytest.approx(1.1), 128: pytest.approx(1.1)}
    # --head-dim runs a grid in parts: only its shapes are built and timed.
    assert main(["bench", "--json", "--head-dim", "64"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {row["head_dim"] for row in record["summary"]} == {64} and all(build[0] == 64 for build in built[-1])
    # --seqlen-q too: the model grid's 512-token row at head_dim 64 alone, six layers causal and not.
    assert main(["bench", "--json", "--grid", "models", "--head-dim", "64", "--seqlen-q", "512"]) == 0
    shapes = [result["shape"] for result in json.loads(capsys.readouterr().out)["results"]]
    assert len(shapes) == 12 and all("x512x64 float16" in shape for shape in shapes), shapes


def test_bench_backward_builds_the_gradient_kernels_and_times_the_backward(monkeypatch, capsys):
    import json

    from fa_kernel.backward import compiled_gradient_kernels
    from fa_kernel.workbench import bench_command as command
    from fa_kernel.workbench.bench import plot_shapes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Test GPU")
    timed = []
    measured = timings(fa_kernel=[100.0], fa_kernel_deterministic=[70.0], cudnn_BHSD=[80.0], cudnn_BSHD_view=[90.0])
    monkeypatch.setattr(command, "measure", lambda shape, rounds, repeats, backward: timed.append(backward) or measured)
    stub_builds(monkeypatch)
    built = []
    monkeypatch.setattr(
        command, "build_with_progress", lambda *args, builder=None, **kw: built.append((args[1], builder)) or True
    )
    assert main(["bench", "--backward", "--json", "--dtype", "bf16"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["pass"] == "backward" and timed == [True] * len(command.BENCH_SHAPES)
    # One pool: the forward kernels (the graph the backward runs through), then the gradients'.
    ((builds, builders),) = built
    gradients = [build for build, builder in zip(builds, builders, strict=True) if builder is compiled_gradient_kernels]
    # Each shape's gradient kernels twice: dQ by atomic adds, and the deterministic gradient's.
    assert builders[0] is None and len(gradients) == 2 * len(command.BENCH_SHAPES)
    assert dict(head_dim=64, causal=True, dtype="bfloat16", arch="sm_90a") in gradients
    assert dict(head_dim=64, causal=True, dtype="bfloat16", arch="sm_90a", deterministic=True) in gradients
    # Each shape's row is printed as soon as it is timed (a run cut short keeps the rows it made):
    # what the second shape's timing finds printed already holds the first's row.
    printed = []
    monkeypatch.setattr(command, "measure", lambda *args, **kwargs: printed.append(capsys.readouterr().out) or measured)
    assert main(["bench", "--backward", "--markdown", "--dtype", "bf16"]) == 0
    table = "".join(printed) + capsys.readouterr().out
    assert "| fa_kernel | deterministic | cuDNN BHSD |" in table and "| 100 | 70 | 80 | 90 | - | 1.11x |" in table
    assert "| 8x32x4096x128 bfloat16 | 100 | 70 |" in printed[1]
    # The plot, of the backward too: its shapes' gradient kernels built with the rest.
    plotted = []
    monkeypatch.setattr(command, "plot_seqlen_sweep", lambda *args: plotted.append(args[-1]) or [])
    assert main(["bench", "--backward", "--json", "--plot", "plot.png"]) == 0
    with_plot = built[-1][1].count(compiled_gradient_kernels)
    assert plotted == [True] and with_plot == len(gradients) + 2 * len(plot_shapes(torch.float16))


def test_bench_decode_grid_times_each_path_and_gives_gb_per_s(monkeypatch, capsys):
    from fa_kernel.decode import compiled_decode_kernels
    from fa_kernel.workbench import bench_command as command

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Test GPU")
    # 64x32/8 heads, 1 query against 8192 keys at d128: 250 GB/s of K/V per TFLOP/s.
    measured = timings(fa_kernel=[16.0], forward=[4.0], split=[16.0], cudnn_BHSD=[20.0], cudnn_BSHD_view=[10.0])
    measured["fa_kernel forward kernel"] = measured.pop("forward")
    measured["fa_kernel split-KV"] = measured.pop("split")
    monkeypatch.setattr(command, "measure", lambda shape, rounds, repeats, backward: measured)
    stub_builds(monkeypatch)
    built = []
    monkeypatch.setattr(
        command, "build_with_progress", lambda *args, builder=None, **kw: built.append((args[1], builder)) or True
    )
    assert main(["bench", "--grid", "decode", "--dtype", "bf16", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| fa_kernel | forward kernel | split-KV | cuDNN BHSD |" in out
    assert "| 64x32/8x1x8192x128 bfloat16 | 4000 | 1000 | 4000 | 5000 | 2500 | - | 0.80x (0.80-0.80) | 83% |" in out
    ((builds, builders),) = built  # one pool: what flash_attn_func runs, and each path apart
    split_kv = [build for build, builder in zip(builds, builders, strict=True) if builder is compiled_decode_kernels]
    # The first shape is a decode step flash_attn_func gives the split-KV kernels (without the
    # mask); the causal append step of 16 queries it gives the forward kernel, and the grid
    # times its split-KV kernels apart, with the mask.
    assert builders[0] is compiled_decode_kernels and builds[0] == split_kv[0]
    assert dict(head_dim=128, causal=False, dtype="bfloat16", arch="sm_90a") in split_kv
    assert dict(head_dim=128, causal=True, dtype="bfloat16", arch="sm_90a") in split_kv
    assert (128, True, 8192) in builds  # the forward kernel's, stubbed: (head_dim, causal, keys)


def test_bench_variants_grid_builds_each_variant_and_times_it_against_its_anchor(monkeypatch, capsys):
    import json

    from fa_kernel.backward import compiled_gradient_kernels
    from fa_kernel.variants import PLAIN, Variants, keys_a_row_sees
    from fa_kernel.workbench import bench_command as command
    from fa_kernel.workbench.bench import VARIANTS

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Test GPU")
    timed = []

    def measured(shape, variant, rounds, repeats, backward):
        timed.append((shape.label(), variant, backward))
        anchor = "fa_kernel plain" if variant.get("sinks") else "flex"
        return {"fa_kernel": command.Timing((130.0, 150.0, 140.0)), anchor: command.Timing((100.0, 100.0, 100.0))}

    monkeypatch.setattr(command, "measure_variant", measured)
    stub_builds(monkeypatch)

    # The forward build as the window picks its config: (head_dim, keys a row sees) in a dict, so
    # that the variants can join it.
    def kernel_build(device, d, causal, dtype, keys, launch, window_size):
        return dict(head_dim=d, keys=keys_a_row_sees(keys, causal, window_size))

    monkeypatch.setattr(command, "kernel_build", kernel_build)
    built = []
    monkeypatch.setattr(
        command, "build_with_progress", lambda *args, builder=None, **kw: built.append((args[1], builder)) or True
    )
    assert main(["bench", "--grid", "variants", "--dtype", "bf16", "--head-dim", "128", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| 4x16x8192x128 bfloat16 causal | window 1k | 140 | flex | 100 | 1.40x | 1.30-1.50 |" in out
    assert "| 16x16x2048x128 bfloat16 causal | sinks | 140 | fa_kernel plain | 100 | 1.40x | 1.30-1.50 |" in out
    assert len(timed) == 2 * len(VARIANTS) and {label for label, _, _ in timed} == {
        "16x16x2048x128 bfloat16 causal",
        "4x16x8192x128 bfloat16 causal",
    }
    ((builds, builders),) = built
    # Each variant's own build (a left edge, the cap, sinks), the window's config by its span, and
    # the plain one for sinks' anchor only; forward only.
    assert [(build["variants"], build["keys"]) for build in builds[:4]] == [
        (Variants(window_left=True), 1025),
        (Variants(softcap=True), 2048),
        (Variants(sinks=True), 2048),
        (PLAIN, 2048),
    ]
    assert len(builds) == 8 and compiled_gradient_kernels not in builders
    assert main(["bench", "--grid", "variants", "--backward", "--json", "--seqlen-q", "8192"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["pass"] == "backward" and all(backward for _, _, backward in timed[-2 * len(VARIANTS) :])
    assert {row["variant"] for row in record["variants"]} == set(VARIANTS)
    assert all(row["ratio_to_anchor"] == pytest.approx(1.4) for row in record["variants"])
    builds, builders = built[-1]
    gradients = [build for build, builder in zip(builds, builders, strict=True) if builder is compiled_gradient_kernels]
    assert {build["variants"] for build in gradients} == {
        Variants(window_left=True),
        Variants(softcap=True),
        Variants(sinks=True),
        PLAIN,
    }


def test_a_shape_cudnn_does_not_take_has_no_ratio():
    from fa_kernel.workbench.bench import cudnn_best, ratio_to_cudnn_best

    alone = timings(fa_kernel=[100.0], flash=[50.0])
    assert cudnn_best(alone) is None and ratio_to_cudnn_best(alone) is None


def test_alternated_rounds_call_every_timer_once_a_round_in_turn():
    from fa_kernel.workbench.bench import alternated

    calls = []
    samples = alternated({name: (lambda name=name: calls.append(name) or len(calls)) for name in "ab"}, rounds=3)
    assert calls == ["a", "b"] * 3 and samples == {"a": [1, 3, 5], "b": [2, 4, 6]}


def test_the_plot_draws_every_panel_and_returns_its_points(monkeypatch, tmp_path):
    import fa_kernel.workbench.bench as bench

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Test GPU")
    passes = []

    def measured(shape, rounds, repeats, backward):
        passes.append(backward)
        return timings(fa_kernel=[shape.seqlen_q / 10], cudnn_BHSD=[100.0])

    monkeypatch.setattr(bench, "measure", measured)
    path = tmp_path / "plot.png"
    points = bench.plot_seqlen_sweep(str(path), torch.float16, repeats=1)
    assert path.stat().st_size > 0
    assert len(points) == 4 * len(bench.PLOT_SEQLENS)  # (64, 128) x (full, causal) panels
    shape, first = points[0]
    assert shape.label() == "64x16x512x64 float16" and first["fa_kernel"].median == 51.2
    assert first["cudnn BHSD"].median == 100
    assert not any(passes)
    bench.plot_seqlen_sweep(str(path), torch.float16, repeats=1, backward=True)  # the backward's, each point
    assert passes[len(points) :] == [True] * len(points)


def test_the_model_grid_spans_the_heads_lengths_and_prefills_asked_for():
    from fa_kernel.workbench.bench import MODEL_HEADS, MODEL_PREFILLS, MODEL_SEQLENS, model_grid

    grid = model_grid()
    heads = {shape.nheads for shape in grid}
    assert {8, 12, 16, 20, 24, 28, 32, 40, 48, 52, 56, 64, 96, 128} <= heads
    assert {shape.nheads // shape.heads_kv for shape in grid} >= {1, 2, 4, 8}
    assert {shape.head_dim for shape in grid} == {64, 128, 256}
    assert len(grid) == len(MODEL_HEADS) * (2 * len(MODEL_SEQLENS) + len(MODEL_PREFILLS))
    assert all(shape.nheads % shape.heads_kv == 0 for shape in grid)
    tokens = {shape.batch * shape.seqlen_q for shape in grid if shape.keys == shape.seqlen_q}
    assert min(tokens) >= 4096 and max(tokens) <= 65536
    assert all(shape.causal for shape in grid if shape.keys != shape.seqlen_q)  # prefill: bottom-right


def test_the_summary_gives_each_head_dims_median_and_worst_shape():
    from fa_kernel.workbench.bench import Shape, summarise

    results = [
        (Shape(1, 8, 512, 64, False), timings(fa_kernel=[90.0], cudnn_BHSD=[100.0])),
        (Shape(1, 8, 512, 64, True), timings(fa_kernel=[120.0], cudnn_BHSD=[100.0], cudnn_BSHD_view=[110.0])),
        (Shape(1, 8, 1024, 64, False), timings(fa_kernel=[100.0], cudnn_BSHD_view=[100.0])),
        (Shape(1, 8, 512, 128, True, seqlen_k=2048), timings(fa_kernel=[300.0])),  # no cuDNN: left out
    ]
    (d64,) = summarise(results)
    assert (d64.head_dim, d64.shapes, d64.worst, d64.worst_shape) == (64, 3, 0.9, "1x8x512x64 float16")
    assert d64.median == pytest.approx(1.0)


def test_builds_that_all_built_once_skip_the_pool_after(monkeypatch, tmp_path):
    # A warm run's pool of processes only loads what is cached, and its imports are most of the
    # run: the stamp skips it. A failed build leaves no stamp.
    from rich.console import Console
    from tilelang import env

    from fa_kernel.workbench import builds as builds_module
    from fa_kernel.workbench import console as console_module
    from fa_kernel.workbench.builds import shipped_builds

    monkeypatch.setattr(env, "TILELANG_CACHE_DIR", str(tmp_path))
    pools = []

    def fake_build_all(builds, jobs, on_done, verbose, builder, fail=False):
        pools.append(len(builds))
        errors = [RuntimeError("nvcc") if fail else None for _ in builds]
        for build, error in zip(builds, errors, strict=True):
            on_done(build, None if error else 1.0, error)
        return errors

    builds = shipped_builds("sm_90", (64,))
    console = Console(file=io.StringIO())
    monkeypatch.setattr(builds_module, "build_all", lambda *args: fake_build_all(*args, fail=True))
    assert not console_module.build_with_progress(console, builds, 2, False)
    monkeypatch.setattr(builds_module, "build_all", fake_build_all)
    assert console_module.build_with_progress(console, builds, 2, False) and console_module.build_with_progress(
        console, builds, 2, False
    )
    assert pools == [len(builds), len(builds)]
    # A console that is no terminal (a CI log) gets a line per kernel built, as no bar shows there.
    assert f"built {len(builds)}/{len(builds)}: " in console.file.getvalue()
    assert (
        console_module.build_with_progress(console, builds[:1], 2, False) and pools[-1] == 1
    )  # other builds, another stamp


def test_verify_checks_the_forward_and_the_gradients_of_each_case(monkeypatch, capsys):
    # The GPU path with the kernels stood in for by the fp32 reference on the CPU (rounded to the
    # input dtype): every case passes, and a backward that is wrong in dV alone fails its row.
    import functools

    from fa_kernel.backward import compiled_gradient_kernels
    from fa_kernel.reference import attention_ref, random_qkv
    from fa_kernel.workbench import verify_command as command

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Test GPU")
    stub_builds(monkeypatch)
    built = []
    monkeypatch.setattr(command, "build_with_progress", lambda *args: built.append(args[-1]) or True)
    import fa_kernel.workbench.bench as bench

    monkeypatch.setattr(bench, "random_qkv", functools.partial(random_qkv, device="cpu"))
    # A ragged GQA case and a d256 one, each with its gradients.
    monkeypatch.setattr(command, "VERIFY_SHAPES", [(2, 8, 2, 113, 203, 64), (1, 2, 2, 65, 65, 256)])
    # One case with every variant: a window, a softcap and sinks (their gradient too).
    monkeypatch.setattr(command, "VARIANT_CASES", [((1, 4, 2, 70, 90, 64), True, (20, -1), 30.0, True)])
    dv_slip = []

    def attend(q, k, v, causal, return_lse=False, **variants):
        out, lse = attention_ref(q, k, v, causal, **variants)
        # Adds nothing to the output; adds 5% of the upstream gradient's sum to every element of dV.
        out = (out + 0.05 * sum(dv_slip) * (v.sum() - v.sum().detach())).to(q.dtype)
        return (out, lse) if return_lse else out

    monkeypatch.setattr(command, "flash_attn_func", attend)
    assert main(["verify", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "the forward" in out and "the gradients of a random loss" in out and "17/17 cases pass" in out
    assert "windows, softcap and sinks" in out and "| (20, -1), 30, sinks |" in out
    assert out.count("| 2x8/2x113x203x64 |") == 8 and out.count("| 1x2x65x256 |") == 8
    (builders,) = built
    assert builders.count(compiled_gradient_kernels) == 8 and builders.count(None) == 8
    dv_slip.append(1.0)
    assert main(["verify", "--markdown"]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "8/17 cases pass, 9 FAIL" in out and out.count("| FAIL |") == 9
