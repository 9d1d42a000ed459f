"""The case record, declared once: its fields, their meaning, and the run file's format.

A run file is pytest-benchmark JSON; what mlp-loadbench adds lives in
``machine_info["loadbench"]`` (the run) and in each benchmark's ``extra_info`` (the
case record). The fixture (training cases) and the serving test write the fields
declared here, the way pytest-benchmark's ``Stats.fields`` declares its statistics;
tests/test_record.py holds the writers to this list.

``RECORD_FORMAT`` counts changes of meaning a reader must know about. The plugin writes
it as ``machine_info["loadbench"]["format"]``; a run without it is format 1, and
`bench.gate.runs.read_run` refuses a run of a format newer than this code reads.
"""

from __future__ import annotations

from dataclasses import dataclass

RECORD_KEY = "loadbench"  # machine_info key and extra_info marker of our runs
FORMAT_KEY = "format"  # machine_info[RECORD_KEY][FORMAT_KEY]: the run's RECORD_FORMAT
# 2: the format is written; extra_info may hold "verdict" and "time_gate".
# 3: machine_info[RECORD_KEY][RUN_KEY] says whether the run finished; a verdict may be
#    "not compared"; the kernel cells, batch-1 forward and monitor overhead hold verdicts.
RECORD_FORMAT = 3
UNVERSIONED_FORMAT = 1  # what a run without FORMAT_KEY is
INFERENCE_KIND = "inference"  # extra_info["kind"] of a serving record
RUN_KEY = "run"  # machine_info[RECORD_KEY][RUN_KEY]: how the run ended (bench.gate.runs.RunState)
# The extra_info keys the rows and reference tools read by name.
CASE = "case"
EXPERIMENT = "experiment"
KIND = "kind"
KERNEL_CACHES = "kernel_caches"


@dataclass(frozen=True)
class Field:
    """One key of a case record and what it holds; `optional`: not in every record."""

    name: str
    doc: str
    optional: bool = False


# machine_info[RECORD_KEY] of a run (bench/plugin/session.py), in the order it is written.
RUN_FIELDS: tuple[Field, ...] = (
    Field(FORMAT_KEY, "the run's record format (RECORD_FORMAT when written)"),
    Field("gpu", "the GPU's name, driver, memory and clocks as NVML reads them; None without a GPU"),
    Field("cuda", "torch's CUDA version, or None"),
    Field("torch", "torch's version"),
    Field("triton", "triton's version, or None"),
    Field("nvidia_ml_py", "nvidia-ml-py's version, or None"),
    Field("mlp_loadbench", "this package's version"),
    Field("settings", "the options the run was made with (SETTINGS_FIELDS)"),
    Field(RUN_KEY, "how the run ended: state, collected, stored, cut_short (bench.gate.runs.RunState)",
          optional=True),
)

# machine_info[RECORD_KEY]["settings"]: what a baseline must share to gate (bench.gate.runs.HISTORY_SETTINGS).
SETTINGS_FIELDS: tuple[Field, ...] = (
    Field("profile", "the profile's name (--profile)"),
    Field("epochs", "the epochs asked for (--epochs), or None: the profile's"),
    Field("dataset", "'synthetic' or the CSV trained on (--dataset)"),
    Field("device", "the torch device (--device)"),
    Field("loop", "the training loop asked for (--loop)"),
    Field("impl", "the layer implementation (--impl)"),
    Field("optimizer_impl", "the optimizer implementation (--optimizer-impl)"),
    Field("precision", "the precision (--precision)"),
    Field("strict_fp32_kernel", "how our kernels keep fp32 exact (LOADBENCH_STRICT_FP32)"),
    Field("monitor_period_s", "the load monitor's sampling period, seconds"),
    Field("shard", "'i/n' of a sharded run, or None"),
    Field("shard_durations", "the durations file the shards were cut by, or None"),
    Field("plant", "the --plant-slowdown of a self-test run, or None"),
    Field("plant_note", "what the planted slowdown does, in words", optional=True),
    Field("latency_pin", "whether the thread timing batch-1 serving latency was held on one CPU (--latency-pin)"),
    Field("tier", "the tier run (--tier)"),
    Field("time_gated", "whether the time gate judged the run (--time-gate)"),
    Field(KERNEL_CACHES, "Triton's and Inductor's caches at start: 'warm', 'empty' or "
                         "'cold (emptied for this session)'"),
    Field("compiled_ahead", "what --compile-workers did before the first case (workers, cases, built, seconds, "
                            "failed), or None"),
)

# A training case's extra_info (bench/plugin/fixture.py), in the order it is written.
CASE_FIELDS: tuple[Field, ...] = (
    Field("case", "the case id, e.g. 'units-128'"),
    Field("experiment", "the experiment the case varies, e.g. 'units'"),
    Field("config", "the TrainConfig trained, as a dict"),
    Field("profile", "the profile's name"),
    Field("dataset", "the data trained on, described"),
    Field("loop_ran", "the training loop that ran"),
    Field("optimizer_impl", "the optimizer implementation that ran"),
    Field("step_route", "how a step ran: 'fused-step' (one launch) or 'layers (why not fused)'", optional=True),
    Field("notes", "what the trainer changed or fell back to, in words"),
    Field("epoch_seconds_by_round", "per training, the seconds of each epoch (the first is the warm-up)"),
    Field("first_epoch_s", "the warm-up epoch's seconds, compilation and capture included"),
    Field("kernel_caches", "the caches the first epoch found: the session's state at start, or 'warm (compiled "
                           "ahead ...)' after --compile-workers"),
    Field("median_epoch_s", "the median steady epoch, seconds"),
    Field("train_seconds", "the whole training's seconds"),
    Field("samples_per_s", "training samples per second at the median epoch"),
    Field("tflops", "model TFLOP/s at the median epoch"),
    Field("cost", "the model's FLOPs and bytes per epoch, as a dict"),
    Field("accuracy", "test accuracy"),
    Field("macro_f1", "test macro F1"),
    Field("weighted_f1", "test weighted F1"),
    Field("final_loss", "the last epoch's training loss"),
    Field("confusion", "the test confusion matrix"),
    Field("vram_peak_mib", "the case's own allocator peak, MiB (None without a GPU)"),
    Field("vram_reserved_peak_mib", "the allocator's reserved peak, MiB (None without a GPU)"),
    Field("rss_peak_mib", "the process's resident set peak, MiB"),
    Field("energy_j", "energy over the timed window, joules (None without a counter)"),
    Field("energy_per_epoch_j", "energy per epoch, joules (None without a counter)"),
    Field("energy_epochs", "the epochs energy_per_epoch_j counts: 'after the first' (the warm-up left out) "
                           "or 'all'", optional=True),
    Field("throttled", "whether clocks were held down during the window"),
    Field("load", "the load monitor's summary"),
    Field("series_path", "the sample series CSV (None: the run is not stored)"),
    Field("planted_slowdown", "the --plant-slowdown that ran, or None"),
    Field("triton_builds", "the Triton kernels this process compiled ('compiled') and loaded from Triton's "
                           "cache ('cache_hits') while it built and trained the case; None where Triton has "
                           "no compilation listener"),
    Field("kernel_trace", "the kernel table of a few steady epochs (--kernel-trace)", optional=True),
    Field("bound", "per step: kernels, kernel time, wall time and the compute, memory and launch floors "
                 "(model.bound.Bound.as_dict), with the device and the measured ceilings; None if not profiled"),
    Field("bound_unavailable", "why the step could not be profiled (no CUPTI)", optional=True),
    Field("time_gate", "how the time rule judged the case: limit, spread, runs, source", optional=True),
    Field("verdict", "the gate's decision (bench.gate.verdict.Verdict.as_dict)"),
    # a training loop's case (bench/test_loops.py)
    Field("matmul_ceiling_tflops", "the card's measured matmul ceiling at the case's precision", optional=True),
    Field("roofline_epoch_s", "the cost model's FLOPs an epoch at that ceiling, seconds", optional=True),
    Field("roofline_fraction", "roofline_epoch_s over the median epoch", optional=True),
    Field("speedup_vs_reference", "the reference loop's median epoch over this loop's, same session",
          optional=True),
)

# A timed call's extra_info (bench/test_kernels.py, bench/test_monitor.py): its calls gated
# on time like a training case's epochs (bench.plugin.verdicts.judge_calls).
CALL_FIELDS: tuple[Field, ...] = (
    Field("call_seconds", "seconds of each timed call (pytest-benchmark's rounds, or the watched epochs)"),
    Field("median_call_s", "the median of call_seconds"),
    Field("timed_call", "the experiment and case id whose budget judges the calls", optional=True),
    Field("time_gate", "how the time rule judged the calls: limit, spread, runs, source", optional=True),
    Field("verdict", "the gate's decision (bench.gate.verdict.Verdict.as_dict)", optional=True),
    Field("notes", "what a reader should know of how it was measured", optional=True),
    # a kernel cell: one forward + backward step (bench.tools.bench_cells.CellResult.record)
    Field("batch", "a kernel cell's rows", optional=True),
    Field("width", "a kernel cell's hidden width", optional=True),
    Field("activation", "a kernel cell's activation", optional=True),
    Field("precision", "fp32, tf32 or bf16", optional=True),
    Field("times_ms", "milliseconds a step per route: eager and graph torch, compile, ours", optional=True),
    Field("tflops", "TFLOP/s per route", optional=True),
    Field("speedup_graph_vs_torch", "torch's graph time over ours", optional=True),
    Field("speedup_graph_vs_compile", "torch.compile's graph time over ours", optional=True),
    Field("speedup_eager_vs_torch", "eager torch over our eager calls", optional=True),
    Field("best_baseline", "the fastest of torch's routes", optional=True),
    Field("speedup_vs_best", "the best baseline's time over ours", optional=True),
    Field("losing", "whether ours is slower than the best baseline by more than the tolerance", optional=True),
    Field("tile_sources", "where each layer's tile came from (table, tuning, rule) and how many", optional=True),
    Field("tile_routes", "the layers that took another route than our kernel, counted", optional=True),
    Field("tiles", "each layer's launch: shape, tile, route", optional=True),
    Field("tuning_s", "seconds first-use tuning took in the cell", optional=True),
    Field("errors", "the routes that failed, with their error", optional=True),
    # a batch-1 forward (one launch for the whole model)
    Field("shape", "the served model's depth x width", optional=True),
    Field("widths", "the layer widths", optional=True),
    Field("launch", "the launch the forward took", optional=True),
    Field("gpu_us_per_forward", "GPU microseconds a forward per route (None on a CPU)", optional=True),
    Field("host_us_per_forward", "host microseconds a forward per route (a CPU's figure)", optional=True),
    Field("one_launch_speedup", "each other route's time over the one launch", optional=True),
    # the monitor's overhead
    Field("median_epoch_s_off", "median epoch with no monitor", optional=True),
    Field("median_epoch_s_on", "median epoch watched by the monitor", optional=True),
    Field("overhead", "watched over unwatched, minus one", optional=True),
    Field("period_s", "the monitor's sampling period", optional=True),
    Field("epochs_each", "epochs timed each way", optional=True),
    Field("rounds", "trainings each way, alternated", optional=True),
    Field("loop", "the training loop timed", optional=True),
    # the nightly tier's GEMM (bench/test_kernels.py::test_gemm)
    Field("triton_ms", "our kernel's milliseconds", optional=True),
    Field("cublas_ms", "cuBLAS's milliseconds", optional=True),
    Field("triton_tflops", "our kernel's TFLOP/s", optional=True),
    Field("cublas_tflops", "cuBLAS's TFLOP/s", optional=True),
    Field("fraction_of_cublas", "cuBLAS's time over ours", optional=True),
    Field("strict_fp32_kernel", "how strict fp32 ran (LOADBENCH_STRICT_FP32)", optional=True),
)

# A serving case's extra_info (bench/test_inference.py).
SERVING_FIELDS: tuple[Field, ...] = (
    Field("kind", f"always {INFERENCE_KIND!r}"),
    Field("case", "the case id of the trained configuration"),
    Field("experiment", "its experiment"),
    Field("variant", "the compression variant served"),
    Field("impl", "the serving implementation"),
    Field("config", "the TrainConfig trained, as a dict"),
    Field("profile", "the profile's name"),
    Field("dataset", "the data, described"),
    Field("latency_graph_s", "batch-1 latency statistics with graph replay, or None"),
    Field("latency_eager_s", "batch-1 latency statistics of the eager loop"),
    Field("latency_p99_s", "the judged batch-1 p99, seconds"),
    Field("latency_mode", "which latency was judged: graph replay or eager"),
    Field("latency_p99_by_round_s", "the batch-1 p99 of each round of calls, seconds"),
    Field("latency_calls", "calls timed for the latency"),
    Field("latency_pinned_cpu", "the CPU the timing thread was held on, or None"),
    Field("throughput", "samples per second by batch size"),
    Field("energy_j_per_1k", "joules per 1,000 inferences, or None"),
    Field("accuracy", "test accuracy of the served model"),
    Field("macro_f1", "test macro F1 of the served model"),
    Field("accuracy_drop", "the fp32 model's accuracy minus this variant's"),
    Field("macro_f1_drop", "the fp32 model's macro F1 minus this variant's"),
    Field("speedup", "latency speed-up over the fp32 model"),
    Field("speedup_batch", "the batch size of that speed-up"),
    Field("reference", "the fp32 model's figures"),
    Field("compression", "the compression applied, as a dict"),
    Field("routes", "which kernel route each layer took"),
    Field("notes", "what was done to which layer, in words"),
    Field("unavailable", "figures not measured, with why"),
    Field("load", "the load monitor's summary"),
    Field("throttled", "whether clocks were held down"),
    Field("verdict", "the gate's decision (bench.gate.verdict.Verdict.as_dict)"),
)


def names(fields: tuple[Field, ...]) -> tuple[str, ...]:
    """The keys of a declared record, in order."""
    return tuple(f.name for f in fields)


def required(fields: tuple[Field, ...]) -> frozenset[str]:
    """The keys every record of that kind holds."""
    return frozenset(f.name for f in fields if not f.optional)
