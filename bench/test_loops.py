"""The headline: the optimal configuration through each training loop, side by side.

Each loop's record gets its speedup over the study's reference loop measured in the
same session, its achieved TFLOP/s and its fraction of the roofline (the cost
model's FLOPs at the card's measured matmul ceiling).
"""

import pytest

from kernels.ground.cases import Case
from kernels.ground.cases import case_ids
from kernels.ground.cases import loop_cases


# Triton's CPU interpreter runs a 512-wide step in about 20 s, and Inductor compiles
# for a minute on two cores: on a CPU those cases check the code path on a narrow model
# for two epochs, one of them timed, on a fifth of the profile's frames (the interpreter's
# time grows with the frames, not the batch); their records' config and dataset say so.
INTERPRETER_OVERRIDES = {"width": 32, "epochs": 2}  # the first epoch is the warm-up: one timed
INTERPRETER_DATA_FRACTION = 0.2


@pytest.mark.parametrize("case", case_ids(loop_cases()))
def test_training_loop(loadbench, case: str) -> None:
    loop = Case.parse(case)
    cpu = loadbench.session.options.device.type == "cpu"
    slow_on_cpu = {"triton", "compile"} & {loop.changes.get("impl"), loop.changes.get("optimizer_impl")}
    narrow = bool(cpu and slow_on_cpu)
    overrides = INTERPRETER_OVERRIDES if narrow else {}
    try:
        loadbench.run(loop, data_fraction=INTERPRETER_DATA_FRACTION if narrow else 1.0, **overrides)
    finally:
        record = loadbench.benchmark.extra_info
        if "median_epoch_s" in record:
            tflops = loadbench.session.ceilings(record["config"]["precision"]).matmul_tflops
            roofline = record["cost"]["train_flops_per_epoch"] / (tflops * 1e12)
            record["matmul_ceiling_tflops"] = tflops
            record["roofline_epoch_s"] = roofline
            record["roofline_fraction"] = roofline / record["median_epoch_s"]
            reference = loadbench.session.record_of("loop-reference")
            if reference is not None:
                record["speedup_vs_reference"] = reference["median_epoch_s"] / record["median_epoch_s"]
