"""Run files: read one, find them in a storage, and pick the runs that measured alike.

A run file is pytest-benchmark JSON made by mlp-loadbench (bench/gate/record.py says
what it holds). `read_run` reads one for the gate and raises BaselineError naming the
file; `load_runs` reads many for the report and skips, with a warning that names it,
a missing, corrupt or foreign file; the caller decides what an empty result means.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernels.ground.cases import study_order
from bench.gate.record import INFERENCE_KIND
from bench.gate.record import FORMAT_KEY
from bench.gate.record import RECORD_FORMAT
from bench.gate.record import RECORD_KEY
from bench.gate.record import RUN_KEY
from bench.gate.record import UNVERSIONED_FORMAT

# What must match for a stored run to count in a case's noise history.
HISTORY_SETTINGS = ("profile", "epochs", "dataset", "loop", "impl", "optimizer_impl", "precision", "plant",
                    "latency_pin")
# What a run made before a setting existed measured: its value then.
SETTING_DEFAULTS: dict[str, Any] = {"latency_pin": False}
MAX_HISTORY = 10  # newest stored runs used for the noise estimate


class BaselineError(ValueError):
    """A baseline run that cannot be read or was not made by mlp-loadbench."""


def gpu_name(machine_info: dict[str, Any]) -> str:
    gpu = machine_info.get(RECORD_KEY, {}).get("gpu") or {}
    return str(gpu.get("name") or "no GPU")


def read_run(path: Path) -> dict[str, Any]:
    """A saved pytest-benchmark run made by mlp-loadbench; BaselineError otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BaselineError(f"baseline {path}: cannot be read: {exc.strerror or exc}") from None
    try:
        run = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"baseline {path}: corrupt JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(run, dict) or not isinstance(run.get("benchmarks"), list) or "machine_info" not in run:
        raise BaselineError(f"baseline {path}: not a pytest-benchmark run file (no 'benchmarks' or 'machine_info')")
    if RECORD_KEY not in run["machine_info"]:
        raise BaselineError(
            f"baseline {path}: a pytest-benchmark run, but not made by mlp-loadbench "
            f"(machine_info has no {RECORD_KEY!r}); compare against a run of this suite"
        )
    made = run["machine_info"][RECORD_KEY]
    found = made.get(FORMAT_KEY, UNVERSIONED_FORMAT) if isinstance(made, dict) else None
    if not isinstance(found, int) or isinstance(found, bool) or found < UNVERSIONED_FORMAT:
        raise BaselineError(f"baseline {path}: machine_info.{RECORD_KEY}.{FORMAT_KEY} = {found!r} "
                            "is not a record format")
    if found > RECORD_FORMAT:
        raise BaselineError(
            f"baseline {path}: record format {found} is newer than this code reads (up to {RECORD_FORMAT}); "
            "read it with the mlp-loadbench that wrote it, or a newer one"
        )
    return run


COMPLETE = "complete"  # every collected test ran to its end, whatever it decided
FAILED = "failed"  # the same, and pytest's status said a test failed or errored
INTERRUPTED = "interrupted"  # Ctrl-C or pytest.exit: the tests after it never ran
PARTIAL = "partial"  # the file written while the session ran; what is left of a killed run
PARTIAL_SUFFIX = ".partial.json"  # run.json's file while the session runs: run.partial.json
RUN_STATES = (COMPLETE, FAILED, INTERRUPTED, PARTIAL)


def partial_path(json_path: Path) -> Path:
    """run.json -> run.partial.json: the file the plugin rewrites after every case."""
    return json_path.with_name(json_path.stem + PARTIAL_SUFFIX)


@dataclass(frozen=True)
class RunState:
    """How a stored run ended, from machine_info[RECORD_KEY][RUN_KEY] (runs made before it
    was recorded read as complete)."""

    state: str
    collected: int | None = None  # tests the session meant to run
    stored: int | None = None  # benchmarks the file holds
    cut_short: tuple[str, ...] = ()  # tests stopped before their record was whole: never stored

    @property
    def whole(self) -> bool:
        """Every collected test ran: a run that was not interrupted or killed."""
        return self.state in (COMPLETE, FAILED)

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "collected": self.collected, "stored": self.stored,
                "cut_short": list(self.cut_short)}

    def line(self) -> str:
        """What a reader is told of a run that did not finish; "" for a whole run."""
        if self.whole:
            return ""
        held = f"{self.stored} finished case(s)" if self.stored is not None else "the finished cases"
        of = f" of {self.collected} collected" if self.collected is not None else ""
        cut = f"; cut short: {', '.join(self.cut_short)}" if self.cut_short else ""
        how = "was interrupted" if self.state == INTERRUPTED else "was cut short (written while it ran)"
        return f"the run {how}: it holds {held}{of}{cut}"


def run_state(run: dict[str, Any]) -> RunState:
    """How a run `read_run` accepted ended."""
    found = run["machine_info"][RECORD_KEY].get(RUN_KEY)
    if not isinstance(found, dict) or found.get("state") not in RUN_STATES:
        return RunState(COMPLETE)
    return RunState(found["state"], found.get("collected"), found.get("stored"), tuple(found.get("cut_short") or ()))


def finished(benchmark: dict[str, Any]) -> bool:
    """Whether a stored benchmark is a whole record: a training case trained to its end
    and was evaluated (runs made before cut-short cases were left out can hold one
    without accuracy)."""
    info = benchmark.get("extra_info") or {}
    return not ("case" in info and "experiment" in info and info.get("kind") is None and "accuracy" not in info)


def run_format(run: dict[str, Any]) -> int:
    """The record format of a run `read_run` accepted: 1 for runs made before it was written."""
    return int(run["machine_info"][RECORD_KEY].get(FORMAT_KEY, UNVERSIONED_FORMAT))


MACHINE_LINE_MAX = 160  # characters of a machine_info difference line, before it names fewer keys
VALUE_WIDTH = 20  # a setting's value shown in that line, at most


def flat(info: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as dotted path -> leaf value (lists, None and empty dicts are leaves)."""
    if not isinstance(info, dict) or (not info and prefix):
        return {prefix: info}
    out: dict[str, Any] = {}
    for key, value in info.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def machine_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """One short line naming what differs between this run's machine_info and a stored
    run's: the settings with both values (this run's first), then the other keys by
    name (those that decide whether the baseline gates first), as many as fit
    MACHINE_LINE_MAX; None when they are alike. It stands in for
    pytest-benchmark's warning, which prints both dicts whole."""
    mine, saved = flat(ours), flat(theirs)
    ended = f"{RECORD_KEY}.{RUN_KEY}"  # how each run ended: not the machine
    differ = sorted(key for key in mine.keys() | saved.keys()
                    if mine.get(key) != saved.get(key) and key != ended and not key.startswith(ended + "."))
    if not differ:
        return None
    prefix = f"{RECORD_KEY}.settings."

    def shown(value: Any) -> str:
        text = "unset" if value is None else str(value)
        return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."

    def listed(items: list[str], most: int) -> str:
        more = len(items) - most
        return ", ".join(items[:most]) + (f" and {more} more" if more > 0 else "")

    first = {f"{prefix}{key}": rank for rank, key in enumerate(HISTORY_SETTINGS)}  # what decides gating
    first[f"{RECORD_KEY}.gpu.name"] = -1
    differ.sort(key=lambda key: (first.get(key, len(first)), key))
    settings = [f"{key[len(prefix):]} {shown(mine.get(key))} vs {shown(saved.get(key))}"
                for key in differ if key.startswith(prefix)]
    others = [key for key in differ if not key.startswith(prefix)]
    # Fewer other keys first, then fewer settings, until the line fits.
    counts = [(len(settings), n) for n in range(len(others), 0, -1)] or [(len(settings), 0)]
    counts += [(n, min(1, len(others))) for n in range(len(settings) - 1, 0, -1)]
    line = ""
    for shown_settings, shown_others in counts:
        parts = [f"settings {listed(settings, shown_settings)}"] if settings else []
        parts += [listed(others, shown_others)] if others else []
        line = f"baseline machine_info differs (this run vs baseline): {'; '.join(parts)}"
        if len(line) <= MACHINE_LINE_MAX:
            break
    return line


def same_measurement(gpu: str, settings: dict[str, Any], other_gpu: str, other_settings: dict[str, Any]) -> bool:
    """Whether two runs measured the same thing: one GPU model and the HISTORY_SETTINGS alike."""
    return gpu == other_gpu and all(setting(settings, key) == setting(other_settings, key) for key in HISTORY_SETTINGS)


def setting(settings: dict[str, Any], key: str) -> Any:
    """A run's setting, with SETTING_DEFAULTS standing in for runs made before it existed."""
    return settings.get(key, SETTING_DEFAULTS.get(key))


def comparable(run: dict[str, Any], baseline_run: dict[str, Any]) -> bool:
    """Whether a stored run measured what the baseline measured: same GPU model and settings."""
    return same_measurement(
        gpu_name(run["machine_info"]), run["machine_info"][RECORD_KEY].get("settings", {}),
        gpu_name(baseline_run["machine_info"]), baseline_run["machine_info"][RECORD_KEY].get("settings", {}),
    )


def load_history(baseline_path: Path, baseline_run: dict[str, Any], candidates: Sequence[Path]) -> list[dict[str, Any]]:
    """The stored runs that tell a case's run-to-run noise: the baseline and the newest
    earlier runs beside it or in the storage, on the same GPU model with the same
    settings, oldest first. Files that are not our runs are passed over.

    A long-lived runner's storage holds many runs: files are read newest-modified
    first and reading stops once MAX_HISTORY - 1 earlier comparable runs are found."""
    runs = {baseline_path.resolve(): baseline_run}
    newest_first = sorted(candidates, key=lambda p: p.stat().st_mtime if p.exists() else 0.0, reverse=True)
    for path in newest_first:
        if len(runs) >= MAX_HISTORY:
            break
        if path.resolve() in runs:
            continue
        try:
            run = read_run(path)
        except BaselineError:
            continue
        if comparable(run, baseline_run) and str(run.get("datetime", "")) <= str(baseline_run.get("datetime", "")):
            runs[path.resolve()] = run
    ordered = sorted(runs.values(), key=lambda run: str(run.get("datetime", "")))
    return ordered[-MAX_HISTORY:]


def case_history(runs: Sequence[dict[str, Any]], fullname: str) -> list[dict[str, Any]]:
    """The extra_info records of one case across stored runs."""
    return [b.get("extra_info", {}) for run in runs for b in run["benchmarks"] if b.get("fullname") == fullname]


@dataclass(frozen=True)
class Run:
    path: Path
    datetime: str
    commit: str  # short id, or "unknown"
    gpu: str
    settings: dict[str, Any]
    benchmarks: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return f"{self.commit} {self.datetime[:16].replace('T', ' ')}"

    def cases(self) -> list[dict[str, Any]]:
        """Benchmarks that are training cases (they carry a case id and metrics), in the
        study's order whatever order the run file holds."""
        cases = [b for b in self.benchmarks if "case" in b.get("extra_info", {}) and "accuracy" in b["extra_info"]
                 and not is_inference(b["extra_info"])]
        return sorted(cases, key=lambda b: study_order(b["extra_info"]["case"]))

    def inference_records(self) -> list[dict[str, Any]]:
        """extra_info of the serving cases (bench/test_inference.py), in the study's order."""
        records = [b["extra_info"] for b in self.benchmarks if is_inference(b.get("extra_info", {}))]
        return sorted(records, key=lambda r: study_order(str(r.get("case", ""))))


def is_inference(info: dict[str, Any]) -> bool:
    """A serving record, not a training case: the report draws it in the inference view."""
    return info.get("kind") == INFERENCE_KIND


def find_run_files(storage: Path) -> list[Path]:
    """pytest-benchmark's layout: STORAGE/<machine id>/NNNN_*.json."""
    return sorted(storage.glob("*/*.json")) + sorted(storage.glob("*.json"))


def load_runs(paths: list[Path]) -> tuple[list[Run], list[str]]:
    """The runs read, oldest first, and a warning "skipped PATH: REASON" for each file not read."""
    runs, warnings = [], []
    for path in paths:
        if not path.is_file():
            warnings.append(f"skipped {path}: {'not a file' if path.exists() else 'no such file'}")
            continue
        if path.stat().st_size == 0:
            warnings.append(f"skipped {path}: empty file")  # clearer than JSON's "Expecting value"
            continue
        try:
            data = read_run(path)
        except BaselineError as exc:
            warnings.append(f"skipped {path}: {unreadable_reason(path, exc)}")
            continue
        commit = str(data.get("commit_info", {}).get("id") or "unknown")
        runs.append(
            Run(
                path=path,
                datetime=str(data.get("datetime", "")),
                commit=commit[:8],
                gpu=gpu_name(data["machine_info"]),
                settings=data["machine_info"]["loadbench"].get("settings", {}),
                benchmarks=data["benchmarks"],
            )
        )
    runs.sort(key=lambda run: run.datetime)
    return runs, warnings


def by_gpu(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs grouped by GPU model, oldest first within each: runs on different models are
    never one history. The newest run's model comes first, then the others by how
    recently each last ran."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.gpu, []).append(run)
    return dict(sorted(groups.items(), key=lambda item: item[1][-1].datetime, reverse=True))


def unreadable_reason(path: Path, exc: BaselineError) -> str:
    """read_run's reason without its "baseline PATH: " prefix or its advice after "; ",
    which is about --benchmark-compare, not the report."""
    return str(exc).removeprefix(f"baseline {path}: ").split("; ", 1)[0]
