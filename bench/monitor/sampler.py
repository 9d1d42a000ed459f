"""Hardware-load sampling: one reading at a time, on a background thread.

`GpuProbe` reads NVML for one GPU (utilization, memory, power, energy, clocks,
temperature, clock-event reasons and, on Hopper or newer, GPM metrics); `read_host`
reads psutil; `LoadMonitor` calls both every `period` seconds on a thread that only
sleeps in `Event.wait` and never calls into the training loop. Each sample also
carries the epoch the trainer last reported. What cannot be read is None, with the
reason kept in `unavailable`: nothing is ever written as a zero it did not measure.

NVML has no sampler of its own that covers these fields, and psutil has none at all,
hence the thread here.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import torch

# Clock-event bits that mean the clocks were held down by power or heat (not idle).
THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
GPM_METRICS = {  # NVML_GPM_METRIC_* ids
    "sm_activity": 2,
    "sm_occupancy": 3,
    "tensor_activity": 5,
    "dram_bw_util": 10,
}
MAX_SAMPLES = 200_000  # a 400-epoch reference-loop run at 100 ms is about 10k


@dataclass(frozen=True)
class GpuInfo:
    """Facts about the GPU that do not change during a run."""

    index: int
    name: str
    uuid: str
    memory_total_mib: float
    power_limit_w: float | None
    driver: str
    gpm: bool


class GpuProbe:
    """NVML readings for the GPU behind a torch CUDA device."""

    def __init__(self, handle: Any, info: GpuInfo) -> None:
        self.handle = handle
        self.info = info
        self._gpm_last: Any = None

    @classmethod
    def open(cls, device: torch.device) -> GpuProbe | str:
        """A probe, or the reason there is none."""
        if device.type != "cuda":
            return f"device is {device.type}"
        try:
            import pynvml
        except ImportError:
            return "nvidia-ml-py (pynvml) is not installed"
        try:
            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            # NVML ignores CUDA_VISIBLE_DEVICES: find the GPU by UUID.
            uuid = "GPU-" + str(torch.cuda.get_device_properties(index).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
            info = GpuInfo(
                index=index,
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                uuid=uuid,
                memory_total_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20,
                power_limit_w=_try(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000),
                driver=_text(pynvml.nvmlSystemGetDriverVersion()),
                gpm=bool(_try(lambda: pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)),
            )
        except Exception as exc:  # NVML raises its own NVMLError family
            return f"NVML unavailable: {exc}"
        return cls(handle, info)

    def energy_mj(self) -> float | None:
        import pynvml

        return _try(lambda: float(pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)))

    def read(self) -> dict[str, float | None]:
        import pynvml

        h = self.handle
        util = _try(lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
        memory = _try(lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
        reasons = _try(lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))
        power = _try(lambda: pynvml.nvmlDeviceGetPowerUsage(h))
        sample = {
            "gpu_util": None if util is None else float(util.gpu),
            "gpu_mem_util": None if util is None else float(util.memory),
            "vram_used_mib": None if memory is None else memory.used / 2**20,
            "power_w": None if power is None else power / 1000,
            "energy_mj": self.energy_mj(),
            "sm_clock_mhz": _try(lambda: float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))),
            "temperature_c": _try(lambda: float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))),
            "throttle_reasons": None if reasons is None else float(reasons),
        }
        sample.update(self._gpm())
        return sample

    def _gpm(self) -> dict[str, float | None]:
        """GPM metrics over the interval since the previous call (None on the first)."""
        empty: dict[str, float | None] = {name: None for name in GPM_METRICS}
        if not self.info.gpm:
            return empty
        import pynvml

        try:
            current = pynvml.nvmlGpmSampleGet(self.handle, pynvml.nvmlGpmSampleAlloc())
        except Exception:
            return empty
        previous, self._gpm_last = self._gpm_last, current
        if previous is None:
            return empty
        try:
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = previous, current
            for slot, metric in enumerate(GPM_METRICS.values()):
                request.metrics[slot].metricId = metric
            pynvml.nvmlGpmMetricsGet(request)
            return {
                name: (float(request.metrics[slot].value) if request.metrics[slot].nvmlReturn == 0 else None)
                for slot, name in enumerate(GPM_METRICS)
            }
        except Exception:
            return empty
        finally:
            _try(lambda: pynvml.nvmlGpmSampleFree(previous))

    def close(self) -> None:
        if self._gpm_last is not None:
            import pynvml

            _try(lambda: pynvml.nvmlGpmSampleFree(self._gpm_last))
            self._gpm_last = None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def read_host(process: ProcessTree, cores: int) -> dict[str, float]:
    """Process CPU% over the last interval divided by usable cores (0-100), system CPU%, RSS, RAM%."""
    cpu, rss = process.read()
    return {
        "cpu_process": cpu / cores,
        "cpu_system": psutil.cpu_percent(None),
        "rss_mib": rss / 2**20,
        "ram_system": psutil.virtual_memory().percent,
    }


class ProcessTree:
    """A process, and with `children` every process it started, read as one: CPU% and
    RSS summed (shared pages count once per process). Children matter where the work
    runs in them, as in torchrun's ranks. psutil's cpu_percent needs a first call per
    process, so each process counts from the sample after the one that found it."""

    def __init__(self, root: psutil.Process, children: bool = False) -> None:
        self.root = root
        self.children = children
        self.known: dict[int, psutil.Process] = {}

    def read(self) -> tuple[float, float]:
        cpu = rss = 0.0
        try:
            members = [self.root, *(self.root.children(recursive=True) if self.children else [])]
        except psutil.Error:
            members = [self.root]
        alive = {}
        for member in members:
            process = self.known.get(member.pid, member)
            try:
                share = process.cpu_percent(None)
                rss += process.memory_info().rss
            except psutil.Error:  # ended between the listing and the read
                continue
            cpu += share if member.pid in self.known else 0.0
            alive[member.pid] = process
        self.known = alive
        return cpu, rss


def read_allocator(device: torch.device) -> dict[str, float | None]:
    if device.type != "cuda":
        return {"torch_allocated_mib": None, "torch_reserved_mib": None}
    return {
        "torch_allocated_mib": torch.cuda.memory_allocated(device) / 2**20,
        "torch_reserved_mib": torch.cuda.memory_reserved(device) / 2**20,
    }


class LoadMonitor:
    """Samples GPU, allocator and host load every `period` seconds between start() and stop()."""

    def __init__(
        self, device: torch.device, period: float = 0.1, probe: GpuProbe | str | None = None, children: bool = False
    ) -> None:
        """`children`: the process figures (cpu_process, rss) include every process this
        one starts; off by default, since listing them costs the sampler a scan of /proc."""
        self.device = device
        self.period = period
        self.probe = GpuProbe.open(device) if probe is None else probe
        self.unavailable: dict[str, str] = {}
        if isinstance(self.probe, str):
            self.unavailable["gpu"] = self.probe
        self.process = ProcessTree(psutil.Process(), children)
        self.cores = usable_cores()
        self.samples: deque[dict[str, float | None]] = deque(maxlen=MAX_SAMPLES)
        self.epoch = -1  # set by the trainer's callback; read, never waited on
        self.busy_seconds = 0.0  # thread CPU time spent taking samples
        self.energy_start_mj: float | None = None
        self.energy_stop_mj: float | None = None
        self.energy_mark_mj: float | None = None  # the counter when the warm-up epoch ended (`mark_warm`)
        self.started = self.stopped = 0.0
        self.paused_seconds = 0.0  # time `paused` held the sampler off
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sampling = threading.Lock()  # held by a reading, or by `paused`

    @property
    def gpu(self) -> GpuProbe | None:
        return self.probe if isinstance(self.probe, GpuProbe) else None

    def sample(self) -> dict[str, float | None]:
        """Take one reading now."""
        reading: dict[str, float | None] = {"t": time.perf_counter() - self.started, "epoch": float(self.epoch)}
        if self.gpu is not None:
            reading.update(self.gpu.read())
        reading.update(read_allocator(self.device))
        reading.update(read_host(self.process, self.cores))
        return reading

    def start(self) -> None:
        self._stop.clear()
        self.samples.clear()
        self.busy_seconds = 0.0
        self.energy_mark_mj = None
        self.process.read()  # the first read primes the CPU counters and counts 0%
        psutil.cpu_percent(None)
        if self.gpu is not None:
            self.gpu.read()  # primes the GPM sample
            self.energy_start_mj = self.gpu.energy_mj()
        ready = threading.Event()
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="loadbench-monitor", daemon=True)
        self._thread.start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        ready.set()
        while not self._stop.wait(self.period):
            with self._sampling:
                begin = time.thread_time()
                self.samples.append(self.sample())
                self.busy_seconds += time.thread_time() - begin
        self.samples.append(self.sample())  # the tail after the last tick

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No reading inside (one under way finishes first): for timing that the
        sampler's own Python work would disturb (batch-1 latency, where a reading's
        NVML and psutil calls hold the GIL across several calls being timed). The load
        series has a gap there; `paused_seconds` adds it up."""
        with self._sampling:
            start = time.perf_counter()
            try:
                yield
            finally:
                self.paused_seconds += time.perf_counter() - start

    def stop(self) -> None:
        """End the window; a second call (the context's exit after an early stop) keeps the first's."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.stopped = time.perf_counter()
        if self.gpu is not None:
            self.energy_stop_mj = self.gpu.energy_mj()

    @property
    def elapsed(self) -> float:
        return self.stopped - self.started

    def mark_warm(self) -> None:
        """The warm-up epoch is over: `steady_energy_j` counts from here. The first epoch
        compiles and tunes for as long as the kernel caches make it, on an idling card."""
        if self.gpu is not None and self._thread is not None:
            self.energy_mark_mj = self.gpu.energy_mj()

    @property
    def energy_j(self) -> float | None:
        if self.energy_start_mj is None or self.energy_stop_mj is None:
            return None
        return (self.energy_stop_mj - self.energy_start_mj) / 1000

    @property
    def steady_energy_j(self) -> float | None:
        """Energy from `mark_warm` to the stop; None without a mark or a counter."""
        if self.energy_mark_mj is None or self.energy_stop_mj is None:
            return None
        return (self.energy_stop_mj - self.energy_mark_mj) / 1000

    def __enter__(self) -> LoadMonitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _try(read: Any) -> Any:
    """One NVML read; None where the GPU or driver does not support it."""
    try:
        return read()
    except Exception:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
