"""The CI jobs as one command: `python -m bench.tools.ci pr|main|nightly`.

Each mode finds main's stored history (a folder on the runner, or a git data branch
shared by several runners), takes the newest run of main measured like this one as the
baseline, runs its tier of the bench against it, writes the job summary from the gate's
own verdicts and pytest's JUnit report (a test that failed before it had a verdict is
named, never reported as ok), builds ``history.html`` from main's runs plus this one,
and exits with pytest's status. `main` also stores the run as main's newest. The
workflows only call this; tests/test_ci.py drives it on a CPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from bench.gate.runs import BaselineError
from bench.gate.runs import gpu_name
from bench.gate.runs import read_run
from bench.gate.runs import setting
from bench.gate.verdict import Verdict
from bench.gate.runs import find_run_files
from kernels import env as loadbench_env

MODES = {  # mode: (tier, whether the run is stored as main's newest)
    "pr": ("pr", False),
    "main": ("pr", True),
    "nightly": ("nightly", True),
}
USAGE = 2


class CiError(Exception):
    """Input the command cannot use; the message is the one line it prints."""


@dataclass(frozen=True)
class CaseLine:
    """One case of the summary: what was measured and what the gate decided."""

    name: str
    figure: str  # median epoch (training) or batch-1 p99 (serving)
    accuracy: str
    verdict: Verdict | None  # None: the test failed before the gate judged it


# ------------------------------------------------------------------ history


def this_gpu() -> str:
    """The GPU model this job measures on, named as the runs name it (NVML's name of the
    first visible device), or "no GPU"."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: the run will say "no GPU" too
        return "no GPU"
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        index = int(visible) if visible.isdigit() else 0
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "no GPU"
    finally:
        pynvml.nvmlShutdown()


def option_value(args: Sequence[str], name: str) -> str | None:
    """The value of a pytest option among pass-through args (`--name V` or `--name=V`)."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def wanted_settings(pytest_args: Sequence[str], gpu: str) -> dict[str, Any]:
    """The settings a baseline must share with the run about to start: the profile (the
    plugin's default: quick with a GPU, smoke without) and the epochs where given."""
    profile = option_value(pytest_args, "--profile") or ("smoke" if gpu == "no GPU" else "quick")
    wanted: dict[str, Any] = {"profile": profile, "plant": None}
    epochs = option_value(pytest_args, "--epochs")
    if epochs is not None:
        wanted["epochs"] = int(epochs) if epochs.isdigit() else epochs
    return wanted


def find_baseline(paths: Sequence[Path], gpu: str, wanted: dict[str, Any]) -> tuple[Path | None, int]:
    """The newest run among `paths` made on `gpu` with the `wanted` settings, and how many
    such runs there are (the history the time gate's noise estimate can draw on)."""
    matching: list[tuple[str, Path]] = []
    for path in paths:
        try:
            run = read_run(path)
        except BaselineError:
            continue  # not ours, or broken: the report names such files
        settings = run["machine_info"]["loadbench"].get("settings", {})
        if gpu_name(run["machine_info"]) != gpu:
            continue
        if any(setting(settings, key) != value for key, value in wanted.items()):
            continue
        matching.append((str(run.get("datetime", "")), path))
    if not matching:
        return None, 0
    return max(matching)[1], len(matching)


def data_branch(*args: str) -> None:
    """Run `python -m bench.tools.databranch ARGS`; CiError with its message on failure."""
    done = subprocess.run([sys.executable, "-m", "bench.tools.databranch", *args], capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise CiError(f"data branch {args[0]}: {last}")


# ------------------------------------------------------------------ summary


def read_verdicts(run_path: Path) -> list[CaseLine]:
    """Every case of a run file with the verdict the gate stored, in the run's order."""
    run = read_run(run_path)
    lines = []
    for bench in run["benchmarks"]:
        info = bench.get("extra_info", {})
        stored = info.get("verdict")
        verdict = Verdict.from_dict(stored) if isinstance(stored, dict) else None
        if info.get("kind") == "inference":
            p99 = info.get("latency_p99_s")
            figure = f"p99 {p99 * 1e6:.1f} us" if p99 else "n/a"
        else:
            median = info.get("median_epoch_s")
            figure = f"{median:.4f} s/epoch" if median else "n/a"
        accuracy = info.get("accuracy")
        lines.append(CaseLine(bench.get("name", bench.get("fullname", "?")), figure,
                              f"{accuracy:.4f}" if isinstance(accuracy, (int, float)) else "n/a", verdict))
    return lines


def junit_failures(path: Path) -> list[tuple[str, str]]:
    """(test name, first line of its message) of every failed or erroring test."""
    if not path.is_file():
        return []
    failed = []
    for case in ET.parse(path).getroot().iter("testcase"):
        for tag in ("failure", "error"):
            found = case.find(tag)
            if found is not None:
                message = (found.get("message") or found.text or tag).strip().splitlines()
                failed.append((case.get("name", "?"), message[0] if message else tag))
    return failed


def summary_markdown(
    mode: str, gpu: str, baseline: Path | None, history_runs: int, cases: list[CaseLine],
    failed_tests: list[tuple[str, str]], exit_code: int,
) -> str:
    """The job summary: the gate's verdict per case, what failed, how much history there was."""
    judged = [c for c in cases if c.verdict is not None]
    counts: dict[str, int] = {}
    for case in judged:
        counts[case.verdict.status] = counts.get(case.verdict.status, 0) + 1  # type: ignore[union-attr]
    verdict_names = {c.name for c in judged if not c.verdict.passed}  # type: ignore[union-attr]
    unjudged = [(name, msg) for name, msg in failed_tests if name not in verdict_names]
    passed = exit_code == 0
    head = "passed" if passed else "FAILED"
    lines = [f"## mlp-loadbench {mode}: {head} on {gpu}", ""]
    if baseline is None:
        lines.append("No stored run of main measured like this one yet: nothing was compared, budgets only.")
    else:
        lines.append(f"Baseline: `{baseline.name}`, the newest of {history_runs} stored run(s) of main "
                     "measured like this one (GPU model, profile, epochs).")
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no case recorded"
    lines += ["", f"{len(cases)} case(s): {tally}."]
    unknown = [c.name for c in judged if c.verdict.noise is not None and not c.verdict.noise.get("known")]  # type: ignore[union-attr]
    if unknown:
        lines += ["", f"Noise unknown for {len(unknown)} case(s): fewer than 3 stored runs of main on this GPU, so the "
                      "time gate assumed a conservative spread (time_noise_unknown_pct) and catches only large "
                      "slowdowns there."]
    bad = [c for c in judged if not c.verdict.passed]  # type: ignore[union-attr]
    if bad:
        lines += ["", "### What the gate failed", ""]
        for case in bad:
            lines.append(f"- **{case.name}** ({case.verdict.status}):")  # type: ignore[union-attr]
            lines += [f"  - {f.message}" for f in case.verdict.failures]  # type: ignore[union-attr]
    if unjudged:
        lines += ["", "### Tests that failed without a verdict", ""]
        lines += [f"- **{name}**: {message}" for name, message in unjudged]
    if not passed and not bad and not unjudged:
        lines += ["", f"pytest exited with status {exit_code} (see the job log)."]
    rows = [[c.name, c.figure, c.accuracy, c.verdict.line() if c.verdict else "no verdict"] for c in cases]
    if rows:
        lines += ["", "<details><summary>Every case</summary>", "",
                  tabulate(rows, headers=["case", "measured", "accuracy", "verdict"], tablefmt="github",
                           disable_numparse=True),
                  "", "</details>"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the job


def run_job(args: argparse.Namespace) -> int:
    tier, stores = MODES[args.mode]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    gpu = args.gpu or this_gpu()
    work = Path(tempfile.mkdtemp(prefix="loadbench-ci-"))
    try:
        if args.data_repo:
            history_dir = work / "history"
            data_branch("pull", "--repo", args.data_repo, "--branch", args.data_branch, "--out", str(history_dir))
        else:
            history_dir = args.storage
        stored = find_run_files(history_dir) if history_dir.exists() else []
        stored += [p for p in history_dir.glob("runs/*/*.json")] if history_dir.exists() else []
        stored = sorted(set(stored))
        pytest_args = list(args.pytest_args)
        baseline, history_runs = find_baseline(stored, gpu, wanted_settings(pytest_args, gpu))
        run_json = out / "run.json"
        junit = out / "junit.xml"
        command = [sys.executable, "-m", "pytest", *args.bench, f"--tier={tier}", f"--benchmark-json={run_json}",
                   f"--series-dir={out / 'series'}", f"--junitxml={junit}", "-p", "no:cacheprovider"]
        if baseline is not None:
            command.append(f"--benchmark-compare={baseline}")
        if stores and not args.data_repo:
            args.storage.mkdir(parents=True, exist_ok=True)
            command += [f"--benchmark-storage=file://{args.storage.resolve()}", f"--benchmark-save={args.save_name}"]
        command += pytest_args
        print("mlp-loadbench ci:", " ".join(command), flush=True)
        exit_code = subprocess.run(command).returncode
        partial = out / "run.partial.json"
        run_file = run_json if run_json.is_file() else partial if partial.is_file() else None
        cases = read_verdicts(run_file) if run_file is not None else []
        summary = summary_markdown(args.mode, gpu, baseline, history_runs, cases, junit_failures(junit), exit_code)
        (out / "summary.md").write_text(summary, encoding="utf-8")
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as handle:
                handle.write(summary)
        print(summary)
        if stores and args.data_repo and run_file is not None:
            data_branch("push", "--repo", args.data_repo, "--branch", args.data_branch, "--series",
                        str(out / "series"), str(run_file))
        if run_file is not None and not args.no_history:
            history(stored, run_file, out / "report")
        return exit_code
    finally:
        shutil.rmtree(work, ignore_errors=True)


def history(stored: list[Path], run_file: Path, out: Path) -> None:
    """history.html (and the report beside it) from main's stored runs plus this run; a
    report that cannot be built is a warning, never the job's verdict."""
    try:
        from bench.tools.report import ReportError
        from bench.tools.report import build_report

        paths = sorted(set(stored) - {run_file}) + [run_file]
        _, warnings = build_report(paths, out)
    except (ReportError, ImportError, OSError) as exc:
        print(f"mlp-loadbench ci: warning: no history page: {exc}", file=sys.stderr)
        return
    for warning in warnings:
        print(f"mlp-loadbench ci: warning: {warning}", file=sys.stderr)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.ci",
        description="Run a tier of the bench against main's stored history and write the job summary from the "
                    "gate's verdicts. Exit status: pytest's (0 passed, 1 a case failed or regressed), 2 on "
                    "unusable input.",
        epilog="Arguments after -- go to pytest, e.g. -- --profile thesis bench/test_experiments.py",
    )
    parser.add_argument("mode", choices=sorted(MODES),
                        help="pr: the pull-request tier gated against main; main: the same, stored as main's "
                             "newest run; nightly: the nightly tier (every case), stored")
    parser.add_argument("--storage", type=Path,
                        default=Path(loadbench_env.read("LOADBENCH_STORAGE") or ".benchmarks/main"),
                        help="main's stored runs on this runner (pytest-benchmark storage). Default: "
                             "$LOADBENCH_STORAGE or .benchmarks/main")
    parser.add_argument("--data-repo", default=None, metavar="URL",
                        help="keep main's history on a git data branch of this repository instead of --storage "
                             "(shared by every runner; python -m bench.tools.databranch)")
    parser.add_argument("--data-branch", default="bench-data", help="the data branch. Default: %(default)s")
    parser.add_argument("--out", type=Path, default=Path("ci-out"),
                        help="run.json, junit.xml, series/, summary.md and report/ go here. Default: %(default)s")
    parser.add_argument("--save-name", default=(os.environ.get("GITHUB_SHA") or "run")[:8],
                        help="name of the stored run (main, nightly). Default: the commit's first 8 characters")
    parser.add_argument("--gpu", default=None, help="the GPU model to find history for. Default: this machine's")
    parser.add_argument("--no-history", action="store_true", help="do not build history.html")
    parser.add_argument("--bench", nargs="+", default=["bench/"], metavar="PATH",
                        help="what pytest runs. Default: bench/")
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    args.pytest_args = pytest_args
    if args.storage.exists() and not args.storage.is_dir():
        parser.error(f"--storage {args.storage}: is a file; give the folder of main's stored runs")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run_job(args)
    except CiError as exc:
        print(f"mlp-loadbench ci: {exc}", file=sys.stderr)
        return USAGE


if __name__ == "__main__":
    sys.exit(main())
