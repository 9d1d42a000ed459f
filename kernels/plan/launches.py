"""Where the fused op's launch configurations come from, per process.

`plan_for` (the op's hot path, one dict lookup after a shape's first call),
`launch_config` and `launch_report` resolve a configuration once per (kernel, shape,
dtype, device, precision, activation class), from, in order: 'table'
(kernels/launch_table.json, committed), 'cache' (the per-user cache,
kernels/plan/tuning_cache.py), 'tuned' (first-use tuning: candidates compiled ahead,
timed from CUDA graphs, the fastest stored in the cache) or 'heuristic' (nothing can be
measured: CPU, the interpreter, tuning off, or a first call during capture or tracing).
LOADBENCH_TUNE picks the policy. A kernel whose tuning picked the cuBLAS route keeps
its fastest fused finalist for calls no CUDA graph captures ('eager'). Timing and
compiling ahead (kernels/plan/trials.py) run the op's own launch code, so this
module does not import the op.
Design notes and measurements: docs/kernels.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton

from kernels.ground import env
from kernels.plan import tuning_cache
from kernels.plan.trials import FORCED
from kernels.plan.trials import FULL_TIMING
from kernels.plan.trials import QUICK_TIMING
from kernels.plan.trials import precompile
from kernels.plan.trials import time_launch
from kernels.plan.launch_plan import CUBLAS
from kernels.plan.launch_plan import GEMV
from kernels.plan.launch_plan import PRESPLIT
from kernels.plan.launch_plan import KEY_FORMAT
from kernels.plan.launch_plan import TIMED_ACTIVATION
from kernels.plan.launch_plan import TRITON
from kernels.plan.launch_plan import LaunchConfig
from kernels.plan.launch_plan import make_plan
from kernels.plan.launch_plan import layer_mnk
from kernels.plan.launch_plan import Plan
from kernels.plan.launch_plan import precision_for
from kernels.plan.launch_plan import activation_class
from kernels.plan.launch_plan import check_route
from kernels.plan.launch_plan import heuristic_config
from kernels.plan.launch_plan import shape_key
from kernels.plan.launch_plan import tuning_candidates
from kernels.plan.tuning_cache import TuningCache
from kernels.runtime.torch_internals import is_fake

# kernels/launch_table.json, written by `python -m bench.tools.tune` on each GPU model:
# per GPU name, "key_format" (KEY_FORMAT) and "configs" keyed by `shape_key`, each a
# LaunchConfig (split_k and backend included: the routes are table entries too).
TABLE_PATH = Path(__file__).resolve().parents[1] / "launch_table.json"  # the package data lives at kernels/

# The hot path: (kernel, rows, cols, reduction, dtype, device, precision, activation
# class) -> plan. Only final answers go in (table, cache, tuned, or the heuristic
# where nothing can be tuned).
_PLANS: dict[tuple, Plan] = {}

# (kernel, M, N, K, dtype, config, device, *, activation, quick) -> ms per call
Measure = Callable[..., float]
# (kernel, M, N, K, dtype, configs, device, *, activation) -> kernels compiled
Prepare = Callable[..., int]

# Successive halving: every candidate is first timed briefly (QUICK_TIMING: calls per
# graph, replays), only the FINALISTS fastest (and the heuristic's tile, the baseline
# the report compares with) again with FULL_TIMING, and the choice rests on the full
# timing alone. A quick timing is about a tenth of a full one in kernel executions; its
# ranking need only put the true winner among the first four.
FINALISTS = 4
# silu's tiles are chosen among the pointwise class's finalists at the same shape
# (where that class was tuned first, as the experiments order it): the same GEMM with
# a heavier epilogue and prologue reorders close tiles, not distant ones, and silu's
# own compilations (its ACTIVATION is a constexpr) would otherwise add about a third
# to first-use tuning. The heuristic's tile and the cuBLAS route are always timed too.
SEED_CLASSES = {"silu": "pointwise"}


def _stream_capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _why_not_now(like: torch.Tensor) -> str | None:
    """Why no timing may run in this call, if none may: a graph being captured would
    record the tuner's launches, and a traced (fake) tensor has no data to time."""
    if torch.compiler.is_compiling() or is_fake(like):
        return "torch.compile tracing"
    if _stream_capturing(like.device):
        return "CUDA-graph capture"
    return None


def route_of(plan: Plan) -> str:
    """The report's name for what a plan launches: the fused kernels ('triton', with its
    split-K slices in use) or the route's own description."""
    if plan.cfg.backend != TRITON:
        return plan.cfg.describe()
    return f"triton split-K {plan.splits}" if plan.splits > 1 else "triton"


def fused_second(finalists: list[LaunchConfig], ms: list[float]) -> tuple[LaunchConfig, float] | None:
    """Where the fastest finalist is the cuBLAS route: the fastest finalist of our own
    kernels (fused or presplit) and the ms per call it is slower by; None otherwise."""
    if not finalists or len(ms) != len(finalists) or finalists[0].backend != CUBLAS:
        return None
    for cfg, t in zip(finalists, ms):
        if cfg.backend in (TRITON, PRESPLIT):
            return cfg, t - ms[0]
    return None


class Launches:
    """Where this process's launch configurations come from: the mode, the committed
    table and the per-user cache (each read once), the tuner, and the report."""

    def __init__(
        self,
        mode: str | None = None,
        cache_dir: str | Path | None = None,
        tables: dict[str, dict[str, Any]] | None = None,
        measure: Measure | None = None,
        sm_count: int | None = None,
        prepare: Prepare | None = None,
        host_call_ms: float | None = None,
    ) -> None:
        self.mode = env.read("LOADBENCH_TUNE") if mode is None else tuning_cache.tune_mode_from_env(mode)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else tuning_cache.cache_dir()
        self._table_file = tables  # None: TABLE_PATH, read on first need
        self._tables: dict[str, dict[str, LaunchConfig]] = {}
        self._caches: dict[str, TuningCache] = {}
        self._models: dict[torch.device, str] = {}
        self._measure = measure  # None: CUDA-graph timing on a GPU, nothing to measure elsewhere
        self._prepare = prepare  # None: parallel compilation where _measure is None too
        self._sm_count = sm_count
        self._tuned: dict[tuple[str, str], LaunchConfig] = {}  # (gpu, key): tuned in this process
        self._finalists: dict[tuple[str, str], list[LaunchConfig]] = {}  # (gpu, key): fastest first
        # (gpu, key) of a cuBLAS-route winner: its fastest fused finalist and the ms it gives up
        self._fused_second: dict[tuple[str, str], tuple[LaunchConfig, float]] = {}
        self._host_call_ms = host_call_ms  # None: measured per device on first need
        self._host_calls: dict[torch.device, float] = {}
        self.report: dict[tuple, dict[str, Any]] = {}
        self.tuning_seconds = 0.0
        self.tuning_counts = {"shapes": 0, "candidates": 0, "quick": 0, "full": 0, "compiled": 0}
        self._warned: set[str] = set()

    def _warn_once(self, what: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(what, stacklevel=4)

    # --------------------------------------------------------------- sources

    def model(self, device: torch.device) -> str:
        """The GPU model's name (what the table and the cache are keyed by), or 'cpu'."""
        if device not in self._models:
            self._models[device] = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        return self._models[device]

    def table(self, gpu: str) -> dict[str, LaunchConfig]:
        if gpu not in self._tables:
            if self._table_file is None:
                try:
                    self._table_file = json.loads(TABLE_PATH.read_text())
                except (OSError, ValueError) as exc:
                    self._warn_once(f"{TABLE_PATH}: unreadable ({exc}); launching without the committed table")
                    self._table_file = {}
            group = self._table_file.get(gpu, {})
            raw = group.get("configs", {}) if isinstance(group, dict) else {}
            if raw and group.get("key_format") != KEY_FORMAT:
                self._warn_once(
                    f"{TABLE_PATH}: {gpu}: tuned before its keys named the precision and activation class "
                    f"(key format {group.get('key_format', 1)}, not {KEY_FORMAT}); not used. "
                    "Re-tune it: python -m bench.tools.tune"
                )
                raw = {}
            parsed = {}
            for key, cfg in raw.items():
                try:
                    parsed[key] = check_route(key, cfg if isinstance(cfg, LaunchConfig)
                                              else LaunchConfig.from_dict(cfg))
                except (ValueError, TypeError) as exc:
                    self._warn_once(f"{TABLE_PATH}: {gpu}: {key}: {exc}; using the heuristic for it")
            self._tables[gpu] = parsed
        return self._tables[gpu]

    def cache(self, gpu: str) -> TuningCache:
        if gpu not in self._caches:
            key = tuning_cache.cache_key(gpu, triton.__version__, torch.__version__)
            self._caches[gpu] = TuningCache(self.cache_dir, key)
        return self._caches[gpu]

    def cached(self, gpu: str, key: str) -> LaunchConfig | None:
        entry = self.cache(gpu).get(key)
        if entry is None:
            return None
        try:
            return check_route(key, LaunchConfig.from_dict(entry["config"]))
        except (ValueError, TypeError, KeyError) as exc:
            self._warn_once(f"{self.cache(gpu).path}: {key}: {exc}; re-tuning it")
            return None

    def measure(self, device: torch.device) -> Measure | None:
        if self._measure is not None:
            return self._measure
        return time_launch if device.type == "cuda" else None

    def prepare(self, device: torch.device) -> Prepare | None:
        if self._prepare is not None or self._measure is not None:
            return self._prepare
        return precompile if device.type == "cuda" else None

    def sm_count(self, device: torch.device) -> int | None:
        if self._sm_count is None and device.type == "cuda":
            self._sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        return self._sm_count

    # ------------------------------------------------------------- resolution

    def resolve(
        self, kernel: str, rows: int, cols: int, red: int, dtype: torch.dtype, device: torch.device,
        busy: str | None, precision: str, act_class: str,
    ) -> tuple[LaunchConfig, str, str | None, bool]:
        """(config, source, note, final). Not final: the heuristic stood in for a
        tuning that could not run now (`busy` says why); the next call asks again."""
        gpu = self.model(device)
        key = shape_key(kernel, rows, cols, red, dtype, precision, act_class)
        if self.mode != "always":
            cfg = self.table(gpu).get(key)
            if cfg is not None:
                return cfg, "table", None, True
        if (gpu, key) in self._tuned:  # another shape of the same class, tuned in this process
            return self._tuned[gpu, key], "tuned", None, True
        if self.mode == "cache":
            cfg = self.cached(gpu, key)
            if cfg is not None:
                return cfg, "cache", None, True
        heuristic = heuristic_config(rows, cols, red, dtype)
        measure = self.measure(device)
        if self.mode == "off" or measure is None:
            return heuristic, "heuristic", None, True
        if busy is not None:
            return (heuristic, "heuristic",
                    f"first call during {busy}: heuristic for it, tuned on the next eager call", False)
        cfg, note = self.tune(kernel, rows, cols, red, dtype, device, measure, precision, act_class)
        return (cfg, "tuned", None, True) if cfg is not None else (heuristic, "heuristic", note, True)

    def tune(
        self, kernel: str, rows: int, cols: int, red: int, dtype: torch.dtype, device: torch.device,
        measure: Measure, precision: str, act_class: str,
    ) -> tuple[LaunchConfig | None, str | None]:
        """Compile every candidate at once, time each briefly, time the finalists
        properly, keep the fastest in the cache; one progress line."""
        gpu, key = self.model(device), shape_key(kernel, rows, cols, red, dtype, precision, act_class)
        m, n, k = layer_mnk(kernel, rows, cols, red)
        activation = TIMED_ACTIVATION[act_class]
        cands = tuning_candidates(kernel, rows, cols, red, dtype, self.sm_count(device), precision=precision)
        seeds = self.seeds(gpu, kernel, rows, cols, red, dtype, precision, act_class)
        if seeds is not None:
            gemv = [c for c in cands if c.backend == GEMV]  # the table's finalists predate the route
            cands = list(dict.fromkeys([cands[0], *seeds, *gemv, cands[-1]]))  # heuristic, seeds, gemv, cuBLAS
        label = f"loadbench: tuning {key} (M={m} N={n} K={k}) on {gpu}, {len(cands)} candidates"
        tty = sys.stderr.isatty()
        print(label, end="" if tty else " ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        prepare = self.prepare(device)
        compiled = 0
        if prepare is not None:
            try:
                compiled = int(prepare(kernel, m, n, k, dtype, cands, device, activation=activation))
            except Exception:  # compiling ahead is an optimisation: the timing compiles what is left
                compiled = 0

        def timed(i: int, quick: bool) -> float | None:
            try:
                ms = float(measure(kernel, m, n, k, dtype, cands[i], device, activation=activation, quick=quick))
            except Exception:  # a tile too large for this GPU's shared memory, or a route that cannot run
                return None
            return ms if math.isfinite(ms) else None

        quick: dict[int, float | None] = {}
        if len(cands) > FINALISTS + 1:
            for i in range(len(cands)):
                quick[i] = timed(i, True)
                if tty:
                    print(f"\r{label}: {i + 1}/{len(cands)}", end="", file=sys.stderr, flush=True)
            ranked = sorted((ms, i) for i, ms in quick.items() if ms is not None)  # ties: first listed
            finalists = sorted({i for _, i in ranked[:FINALISTS]} | ({0} if quick[0] is not None else set()))
        else:
            finalists = list(range(len(cands)))
        full = {i: timed(i, False) for i in finalists}
        seconds = time.perf_counter() - start
        self.tuning_seconds += seconds
        counts = self.tuning_counts
        counts["shapes"] += 1
        counts["candidates"] += len(cands)
        counts["quick"] += len(quick)
        counts["full"] += len(finalists)
        counts["compiled"] += compiled
        ranked_full = sorted((ms, i) for i, ms in full.items() if ms is not None)
        if not ranked_full:
            print(f" -> no candidate ran; heuristic ({seconds:.1f} s)", file=sys.stderr, flush=True)
            return None, "no tuning candidate ran"
        best_ms, best = ranked_full[0][0], cands[ranked_full[0][1]]
        self._finalists[gpu, key] = [cands[i] for _, i in ranked_full]
        second = fused_second(self._finalists[gpu, key], [ms for ms, _ in ranked_full])
        if second is not None:
            self._fused_second[gpu, key] = second
        heuristic_ms = full.get(0)  # candidate 0 is the heuristic's tile
        versus = (f"heuristic {heuristic_ms * 1000:.1f} us" if heuristic_ms is not None
                  else "heuristic not a finalist or failed")
        print(f" -> {best.describe()}: {best_ms * 1000:.1f} us ({versus}) in {seconds:.1f} s",
              file=sys.stderr, flush=True)
        entry = {
            "config": dataclasses.asdict(best),
            "ms": best_ms,
            "heuristic_ms": heuristic_ms,
            "shape": [m, n, k],
            "precision": precision,
            "activation": act_class,
            "timed_with": activation,
            "candidates": len(cands),
            "seeded_from": SEED_CLASSES.get(act_class) if seeds is not None else None,
            "finalists": [dataclasses.asdict(cands[i]) for _, i in ranked_full],  # fastest first
            "finalists_ms": [ms for ms, _ in ranked_full],
            "failed": sum(t is None for t in (quick or full).values()),
            "compiled_ahead": compiled,
            "seconds": round(seconds, 3),
            "timing": f"CUDA-graph replay, median ms per call (trials.replay_ms): every candidate "
            f"{QUICK_TIMING[0]} calls x {QUICK_TIMING[1]} replays, the {FINALISTS} fastest and the heuristic "
            f"{FULL_TIMING[0]} x {FULL_TIMING[1]}",
            "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self._tuned[gpu, key] = best
        try:
            self.cache(gpu).put(key, entry)
        except OSError as exc:  # a read-only home must not stop a run: keep the tile for this process
            self._warn_once(f"{self.cache(gpu).path}: cannot store tuned tiles ({exc}); they last this process only")
        return best, None

    def seeds(
        self, gpu: str, kernel: str, rows: int, cols: int, red: int, dtype: torch.dtype, precision: str, act_class: str
    ) -> list[LaunchConfig] | None:
        """For a class SEED_CLASSES seeds: the finalists of the same shape in the seeding
        class, fastest first, from this process or the cache; None if it has none."""
        source = SEED_CLASSES.get(act_class)
        if source is None:
            return None
        key = shape_key(kernel, rows, cols, red, dtype, precision, source)
        if (gpu, key) in self._finalists:
            return self._finalists[gpu, key]
        entry = self.cache(gpu).get(key) if self.mode != "off" else None
        if not entry:
            return None
        try:
            return [LaunchConfig.from_dict(c) for c in entry["finalists"]] or None
        except (ValueError, TypeError, KeyError):  # an older entry: no finalists kept
            return None

    # ------------------------------------------------------------------- plans

    def plan(self, kernel: str, rows: int, cols: int, red: int, like: torch.Tensor, precision: str,
             act_class: str) -> Plan:
        dtype, device = like.dtype, like.device
        busy = _why_not_now(like)
        cfg, source, note, final = self.resolve(kernel, rows, cols, red, dtype, device, busy, precision, act_class)
        plan = make_plan(kernel, rows, cols, red, cfg)
        if cfg.backend == CUBLAS and busy is None:
            second = self.fused_second(device, shape_key(kernel, rows, cols, red, dtype, precision, act_class), source)
            if second is not None and second[1] < self.host_call_ms(device):
                plan = dataclasses.replace(plan, eager=make_plan(kernel, rows, cols, red, second[0]))
        self.record(kernel, rows, cols, red, dtype, device, plan, source, note, final, precision, act_class)
        if final:
            _PLANS[(kernel, rows, cols, red, dtype, device, precision, act_class)] = plan
        return plan

    def fused_second(self, device: torch.device, key: str, source: str) -> tuple[LaunchConfig, float] | None:
        """A cuBLAS-route winner's fastest fused finalist and the ms it gives up: from
        this process's tuning, the cache entry it came from, or the table's evidence
        (bench.tools.tune keeps it there as 'eager')."""
        gpu = self.model(device)
        if (gpu, key) in self._fused_second or source not in ("cache", "table"):
            return self._fused_second.get((gpu, key))
        try:
            if source == "table":
                kept = (self._table_file or {})[gpu]["evidence"][key]["eager"]
                found = LaunchConfig.from_dict(kept["config"]), float(kept["gives_up_ms"])
            else:
                entry = self.cache(gpu).get(key) or {}
                found = fused_second([LaunchConfig.from_dict(c) for c in entry["finalists"]], entry["finalists_ms"])
        except (ValueError, TypeError, KeyError):  # an older entry: no finalists' times kept
            found = None
        if found is not None:
            self._fused_second[gpu, key] = found
        return found

    def host_call_ms(self, device: torch.device) -> float:
        """What one small torch call from Python costs this host (a 16 x 16 torch.mm:
        median of five rounds of 50), measured once per device; 0 where nothing runs
        on a GPU (the cuBLAS route never runs there by tuning)."""
        if self._host_call_ms is not None:
            return self._host_call_ms
        if device.type != "cuda":
            return 0.0
        if device not in self._host_calls:
            a = torch.zeros(16, 16, device=device)
            rounds = []
            for _ in range(6):  # the first warms up
                torch.cuda.synchronize(device)
                start = time.perf_counter()
                for _ in range(50):
                    torch.mm(a, a)
                torch.cuda.synchronize(device)
                rounds.append((time.perf_counter() - start) * 1000 / 50)
            self._host_calls[device] = sorted(rounds[1:])[2]
        return self._host_calls[device]

    def record(self, kernel, rows, cols, red, dtype, device, plan, source, note, final, precision, act_class) -> None:  # type: ignore[no-untyped-def]
        cfg = plan.cfg
        entry: dict[str, Any] = {
            "kernel": kernel,
            "dtype": str(dtype).removeprefix("torch."),
            "precision": precision,
            "activation": act_class,
            "shape": list(layer_mnk(kernel, rows, cols, red)),  # M, N, K of the layer
            "device": self.model(device),
            "key": shape_key(kernel, rows, cols, red, dtype, precision, act_class),
            "source": source,
            "route": route_of(plan),
            "config": dataclasses.asdict(cfg),
        }
        if note:
            entry["note"] = note
        if plan.eager is not None:  # the fused finalist uncaptured calls run, and the two times compared
            gives_up_ms = self._fused_second[self.model(device), entry["key"]][1]
            entry["eager"] = {
                "route": route_of(plan.eager),
                "config": dataclasses.asdict(plan.eager.cfg),
                "gives_up_us": round(gives_up_ms * 1000, 2),
                "host_call_us": round(self.host_call_ms(device) * 1000, 2),
            }
        slot = (kernel, rows, cols, red, dtype, str(device), precision, act_class)
        earlier = self.report.get(slot)
        if earlier is not None and earlier.get("deferred"):
            # A graph captured (or a trace made) before this call keeps the heuristic's tile.
            entry["fallback"] = {k: earlier[k] for k in ("config", "source", "note") if k in earlier}
        if not final:
            entry["deferred"] = True
        self.report[slot] = entry


_STATE: Launches | None = None


def _state() -> Launches:
    global _STATE
    if _STATE is None:
        _STATE = Launches()
    return _STATE


def plan_for(
    kernel: str, rows: int, cols: int, reduction: int, like: torch.Tensor, precision: str, act_class: str
) -> Plan:
    """The launch plan for a call: a dict lookup after the first call of a shape."""
    if FORCED:
        cfg = FORCED.get(kernel)
        if cfg is not None:
            return make_plan(kernel, rows, cols, reduction, cfg)
    try:
        return _PLANS[(kernel, rows, cols, reduction, like.dtype, like.device, precision, act_class)]
    except KeyError:
        return _state().plan(kernel, rows, cols, reduction, like, precision, act_class)
    except TypeError:  # symbolic sizes (torch.compile, dynamic shapes) do not hash: plan per trace
        return make_plan(kernel, rows, cols, reduction, heuristic_config(rows, cols, reduction, like.dtype))


def launch_config(
    kernel: str, rows: int, cols: int, reduction: int, dtype: torch.dtype, device: torch.device | str | None = None,
    activation: int | str = "leaky_relu",
) -> LaunchConfig:
    """The tile `kernel` uses for a `rows` x `cols` output reducing over `reduction`
    (at the current float32 matmul precision): what this process already uses for the
    shape, else table, cache or heuristic. It never tunes (only a call of the op does)."""
    if kernel in FORCED:
        return FORCED[kernel]
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    precision, act_class = precision_for(dtype), activation_class(activation)
    plan = _PLANS.get((kernel, rows, cols, reduction, dtype, device, precision, act_class))
    if plan is not None:
        return plan.cfg
    return _state().resolve(kernel, rows, cols, reduction, dtype, device, "a lookup", precision, act_class)[0]


def launch_report() -> list[dict[str, Any]]:
    """Per kernel and shape this process launched: the config, its source ('table',
    'cache', 'tuned', 'heuristic'), the route ('triton', 'triton split-K S',
    'cublas+epilogue'), the precision and activation class it was keyed by and, where
    the first call could not tune, a note (and, once tuned, a 'fallback' naming the
    tile that call used)."""
    entries = _state().report.values() if _STATE is not None else []
    order = lambda e: (e["dtype"], e["precision"], e["activation"], e["kernel"], e["shape"])  # noqa: E731
    return [json.loads(json.dumps(e)) for e in sorted(entries, key=order)]


def tuning_seconds() -> float:
    """Seconds this process spent tuning (compiling ahead and timing candidates)."""
    return _STATE.tuning_seconds if _STATE is not None else 0.0


def tuning_counts() -> dict[str, int]:
    """What this process's first-use tuning did: shapes tuned, candidates, quick and
    full timings, kernels compiled ahead."""
    return dict(_STATE.tuning_counts) if _STATE is not None else {}


def reset_launch_state(**overrides: Any) -> None:
    """Forget every plan and re-read LOADBENCH_TUNE, the table and the cache on next
    use. Tests and tools pass `Launches` arguments (mode, cache_dir, tables,
    measure, sm_count, prepare) to replace what the environment would give."""
    global _STATE
    _PLANS.clear()
    _STATE = Launches(**overrides) if overrides else None
