"""The CI jobs as one command: `python -m bench.tools.ci pr|main|nightly`.

Each mode finds main's stored history (a folder on the runner, or a git data branch
shared by several runners), takes the newest run of main measured like this one as the
baseline (a case it lacks is judged against the newest run that holds it), runs its tier
of the bench against it, and measures every case that came out slower again beside main's
commit (bench/tools/confirm.py): a slowdown fails only if those paired runs confirm it.
It then stores main's run, writes the job summary from the gate's own verdicts and
pytest's JUnit report (a test that failed before it had a verdict is named, never
reported as ok), builds ``history.html`` from main's runs plus this one, and exits with
pytest's status after pairing (2 when the run could not be stored or the input is
unusable). The workflows only call this; tests/test_ci.py drives it on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from kernels.ground.args import directory_problem
from bench.gate.record import RECORD_KEY
from bench.gate.record import RUN_KEY
from bench.gate.runs import COMPLETE
from bench.gate.runs import FAILED
from bench.gate.runs import BaselineError
from bench.gate.runs import RunState
from bench.gate.runs import find_run_files
from bench.gate.runs import gpu_name
from bench.gate.runs import PARTIAL_SUFFIX
from bench.gate.runs import is_inference
from bench.gate.runs import partial_path
from bench.gate.runs import read_run
from bench.gate.runs import run_state
from bench.gate.runs import setting
from bench.gate.verdict import Verdict
from bench.tools.confirm import Confirmation
from bench.tools.confirm import confirm
from bench.tools.rows import KINDS
from bench.tools.rows import append_rows
from bench.tools.rows import csv_problem
from bench.tools.rows import gate_row
from bench.tools.rows import tier_row
from kernels.ground import env as loadbench_env
from kernels.ground.files import write_atomic

MODES = {  # mode: (tier, whether the run is stored as main's newest)
    "pr": ("pr", False),
    "main": ("pr", True),
    "nightly": ("nightly", True),
}
USAGE = 2
PAIRS = 3  # paired runs of main and the change for a case the first run found slower
# pytest options ci sets itself: given after --, they would change what the summary reports.
CONTROLLED = {
    "--tier": "ci's mode picks the tier (pr, main: the pull-request tier; nightly: every case)",
    "--benchmark-json": "ci writes the run to --out/run.json",
    "--benchmark-storage": "ci finds main's history itself (--storage or --data-repo)",
    "--benchmark-compare": "ci picks the baseline: the newest stored run of main measured like this one",
    "--benchmark-save": "ci stores main's and the nightly's runs itself",
    "--benchmark-autosave": "ci stores main's and the nightly's runs itself",
    "--benchmark-disable": "ci's summary is made of the gate's verdicts, which a disabled benchmark never reaches",
    "--junitxml": "ci reads pytest's report from --out/junit.xml",
    "--series-dir": "ci keeps the series in --out/series",
}


class CiError(Exception):
    """Input the command cannot use; the message is the one line it prints."""


@dataclass(frozen=True)
class CaseLine:
    """One case of the summary: what was measured and what the gate decided."""

    name: str
    figure: str  # median epoch (training) or batch-1 p99 (serving)
    accuracy: str
    verdict: Verdict | None  # None: the test failed before the gate judged it


@dataclass(frozen=True)
class Outcome:
    """Everything the job summary states, gathered before it is written."""

    mode: str
    gpu: str  # what this machine measured on
    history_gpu: str  # whose history was searched (the same unless --gpu overrides)
    baseline: Path | None
    history_runs: int
    cases: list[CaseLine]
    failed_tests: list[tuple[str, str]]  # (test, first line) from the JUnit report
    exit_code: int  # the job's, after the paired runs and the store
    plant: str | None = None  # the planted slowdown the run carried
    state: RunState | None = None  # how the run ended; None: no run file at all
    landed: str = ""  # where the run was stored, or that it was not
    store_error: str | None = None  # why storing it failed
    pairing: Confirmation | None = None


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


def data_branch(*args: str) -> str:
    """Run `python -m bench.tools.databranch ARGS`: the last line it printed; CiError with
    its message on failure."""
    done = subprocess.run([sys.executable, "-m", "bench.tools.databranch", *args], capture_output=True, text=True)
    if done.returncode != 0:  # said once, in ci's own line
        said = [line.removeprefix("mlp-loadbench history: ") for line in done.stderr.strip().splitlines()]
        raise CiError(f"data branch {args[0]}: {said[-1] if said else f'exit {done.returncode}'}")
    sys.stderr.write(done.stderr)
    return (done.stdout.strip().splitlines() or [""])[-1]


# ------------------------------------------------------------------ summary


def read_verdicts(run_path: Path) -> list[CaseLine]:
    """Every case of a run file with the verdict the gate stored, in the run's order."""
    run = read_run(run_path)
    lines = []
    for bench in run["benchmarks"]:
        info = bench.get("extra_info", {})
        stored = info.get("verdict")
        verdict = Verdict.from_dict(stored) if isinstance(stored, dict) else None
        if is_inference(info):
            p99 = info.get("latency_p99_s")
            figure = f"p99 {p99 * 1e6:.1f} us" if p99 else "n/a"
        elif info.get("median_call_s"):  # a kernel cell, a batch-1 forward: microseconds a call
            figure = f"{info['median_call_s'] * 1e6:.1f} us/call"
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


def summary_markdown(job: Outcome) -> str:
    """The job summary: the gate's verdict per case, what failed, how much history there was,
    where the run went. It states only what happened: a planted run says so first, a store
    that failed is reported before anything could read as passed."""
    cases = job.cases
    judged = [c for c in cases if c.verdict is not None]
    counts: dict[str, int] = {}
    for case in cases:
        status = case.verdict.status if case.verdict is not None else "no verdict"
        counts[status] = counts.get(status, 0) + 1
    # A test with a verdict is reported by it (one the paired runs cleared failed in pytest, and passes now).
    unjudged = [(name, msg) for name, msg in job.failed_tests if name not in {c.name for c in judged}]
    passed = job.exit_code == 0
    head = "passed" if passed else "FAILED"
    planted = f", planted slowdown {job.plant}" if job.plant else ""
    lines = [f"## mlp-loadbench {job.mode}{planted}: {head} on {job.gpu}", ""]
    if job.store_error:
        lines += [f"**The run was not stored:** {job.store_error}", ""]
    if job.plant:
        lines += [f"This run planted a slowdown of {job.plant} in every timed epoch (--plant-slowdown): its "
                  "verdicts show what the gate catches, not a change of the code.", ""]
    if job.history_gpu != job.gpu:
        lines += [f"History of **{job.history_gpu}** was asked for (--gpu) on a machine measuring on {job.gpu}: "
                  "its runs are shown, not gated.", ""]
    if job.baseline is None:
        lines.append("No stored run of main measured like this one yet: nothing was compared, budgets only.")
    else:
        alike = "GPU model, profile, epochs" + (", without the plant" if job.plant else "")
        lines.append(f"Baseline: `{job.baseline.name}`, the newest of {job.history_runs} stored run(s) of main "
                     f"measured like this one ({alike}); a case it lacks is judged against the newest stored "
                     "run that holds it.")
    if job.state is None:
        lines += ["", "pytest wrote no run file: nothing was measured."]
    elif job.state.line():
        lines += ["", f"**Not a whole run:** {job.state.line()}."]
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no case recorded"
    lines += ["", f"{len(cases)} case(s): {tally}."]
    unknown = [c.name for c in judged if c.verdict.noise is not None and not c.verdict.noise.get("known")]  # type: ignore[union-attr]
    if unknown:
        lines += ["", f"Noise unknown for {len(unknown)} case(s): fewer than 3 stored runs of main on this GPU, so the "
                      "time gate assumed a conservative spread (time_noise_unknown_pct) and catches only large "
                      "slowdowns there."]
    untimed = sorted({c.verdict.reason.rsplit("; ", 1)[-1] for c in judged if "time not gated" in c.verdict.reason})  # type: ignore[union-attr]
    if untimed:
        lines += ["", f"Time was not judged against main in this run: {untimed[0]}."]
    lines += pairing_lines(job.pairing)
    bad = [c for c in judged if not c.verdict.passed]  # type: ignore[union-attr]
    if bad:
        lines += ["", "### What the gate failed", ""]
        for case in bad:
            lines.append(f"- **{case.name}** ({case.verdict.status}):")  # type: ignore[union-attr]
            lines += [f"  - {f.message}" for f in case.verdict.failures]  # type: ignore[union-attr]
    if unjudged:
        lines += ["", "### Tests that failed without a verdict", ""]
        lines += [f"- **{name}**: {message}" for name, message in unjudged]
    if not passed and not bad and not unjudged and not job.store_error:
        lines += ["", f"pytest exited with status {job.exit_code} (see the job log)."]
    if job.landed:
        lines += ["", job.landed]
    rows = [[c.name, c.figure, c.accuracy, c.verdict.line() if c.verdict else "no verdict"] for c in cases]
    if rows:
        lines += ["", "<details><summary>Every case</summary>", "",
                  tabulate(rows, headers=["case", "measured", "accuracy", "verdict"], tablefmt="github",
                           disable_numparse=True),
                  "", "</details>"]
    return "\n".join(lines) + "\n"


def pairing_lines(pairing: Confirmation | None) -> list[str]:
    """What the paired runs decided, for the summary."""
    if pairing is None or not (pairing.paired or pairing.unpaired):
        return []
    confirmed = [t for t, p in pairing.paired.items() if p.confirmed]
    cleared = [t for t, p in pairing.paired.items() if not p.confirmed]
    lines = ["", "### Paired runs", ""]
    if pairing.paired:
        lines.append(f"{len(pairing.paired)} case(s) slower than main's history in this run were measured again, "
                     f"alternately at main's commit `{(pairing.commit or '')[:8]}` and this one, on this machine: "
                     f"{len(confirmed)} confirmed, {len(cleared)} not (ok: the first run's slowdown was the "
                     "machine's or the day's, not the code's).")
    for test, why in sorted(pairing.unpaired.items()):
        lines.append(f"- {test}: not paired ({why}); the first run's verdict stands")
    return lines


# ------------------------------------------------------------------ the job


def run_job(args: argparse.Namespace) -> int:
    started = time.monotonic()
    tier, stores = MODES[args.mode]
    stores = stores and not args.no_store
    out: Path = args.out
    gpu = this_gpu()
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
        history_gpu = checked_gpu(args.gpu, gpu, stored)
        pytest_args = list(args.pytest_args)
        baseline, history_runs = find_baseline(stored, history_gpu, wanted_settings(pytest_args, gpu))
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
        before = set(find_run_files(args.storage)) if stores and not args.data_repo else set()
        tier_started = time.monotonic()
        exit_code = subprocess.run(command).returncode
        pytest_s = time.monotonic() - tier_started
        run_file = finished_run(run_json, partial_path(run_json))
        failed_tests = junit_failures(junit)
        pairing = None
        if run_file is not None and exit_code == 1:
            main_commit = commit_of(baseline) if baseline is not None else None
            pairing = confirm(run_file, main_commit, repo=Path.cwd(), tier=tier,
                              pytest_args=pytest_args, pairs=args.pairs, out=out)
            exit_code = exit_after_pairing(exit_code, failed_tests, pairing)
            if exit_code == 0:
                settle(run_file)
        state = run_state(read_run(run_file)) if run_file is not None else None
        why = "--no-store" if args.no_store else "a pull request's run is never main's history"
        landed, store_error = f"Not stored ({why}): the run stays in {run_json}.", None
        if stores and run_file is not None:
            try:
                landed = store(args, run_file, out, before)
            except CiError as exc:
                landed, store_error = "", str(exc)
                exit_code = USAGE
        elif stores:
            landed = "Not stored: pytest wrote no run file."
        plant = option_value(pytest_args, "--plant-slowdown")
        cases = read_verdicts(run_file) if run_file is not None else []
        summary = summary_markdown(Outcome(args.mode, gpu, history_gpu, baseline, history_runs, cases, failed_tests,
                                           exit_code, plant, state, landed, store_error, pairing))
        (out / "summary.md").write_text(summary, encoding="utf-8")
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as handle:
                handle.write(summary)
        print(summary)
        if run_file is not None and args.rows is not None:
            append_rows(args.rows, [gate_row(read_run(run_file), str(run_file), f"ci {args.mode}")])
        if run_file is not None and args.tier_rows is not None:
            # the job's own time: the history pulled, the tier run, its slow cases paired, the run stored
            append_rows(args.tier_rows, [tier_row(read_run(run_file), f"ci {args.mode}", time.monotonic() - started,
                                                  str(run_file), "ci: history, tier, paired runs, store",
                                                  pytest_s)])
        if run_file is not None and not args.no_history:
            history(stored, run_file, out / "report")
        return exit_code
    finally:
        shutil.rmtree(work, ignore_errors=True)


def finished_run(run_json: Path, partial: Path) -> Path | None:
    """The run file pytest left: run.json where it is a whole run file, else the partial
    file the plugin rewrites after every case. A killed pytest leaves run.json empty, since
    pytest-benchmark opens it when the session starts."""
    for path in (run_json, partial):
        if path.is_file():
            try:
                read_run(path)
            except BaselineError:
                continue
            return path
    return None


def checked_gpu(asked: str | None, gpu: str, stored: Sequence[Path]) -> str:
    """The GPU model whose history gates this run: this machine's, or --gpu where the
    history holds runs of it (shown, not gated, when it is not this machine's model)."""
    if asked is None or asked == gpu:
        return gpu
    held = set()
    for path in stored:
        try:
            held.add(gpu_name(read_run(path)["machine_info"]))
        except BaselineError:
            continue  # not ours, or broken: the report names such files
    held = sorted(held)
    if asked not in held:
        raise CiError(f"--gpu {asked!r}: this machine measures on {gpu!r}, and no stored run of main was measured on "
                      f"{asked!r} (the history holds: {', '.join(held) or 'no runs'})")
    return asked


def commit_of(run_path: Path) -> str | None:
    """The commit a stored run measured, as its commit_info names it."""
    try:
        commit = (read_run(run_path).get("commit_info") or {}).get("id")
    except BaselineError:
        return None
    return str(commit) if commit else None


def settle(run_file: Path) -> None:
    """A run whose only failures the paired runs cleared is stored as complete, not failed."""
    run = read_run(run_file)
    ended = run["machine_info"][RECORD_KEY].get(RUN_KEY)
    if isinstance(ended, dict) and ended.get("state") == FAILED:
        ended["state"] = COMPLETE
        write_atomic(run_file, json.dumps(run, indent=4))


def exit_after_pairing(exit_code: int, failed_tests: Sequence[tuple[str, str]], pairing: Confirmation) -> int:
    """pytest's status once the paired runs cleared some cases: 0 when every failed test
    was one of them, else unchanged."""
    cleared = {test.rsplit("::", 1)[-1] for test, paired in pairing.paired.items() if not paired.confirmed}
    if exit_code == 1 and failed_tests and all(name in cleared for name, _ in failed_tests):
        return 0
    return exit_code


def store(args: argparse.Namespace, run_file: Path, out: Path, before: set[Path]) -> str:
    """Store the run as main's newest (the data branch, or the storage pytest-benchmark
    saved into) and say where it landed; CiError when it could not be stored."""
    if args.data_repo:
        said = data_branch("push", "--repo", args.data_repo, "--branch", args.data_branch, "--series",
                           str(out / "series"), str(run_file))
        return f"Stored: {said}."
    new = sorted(set(find_run_files(args.storage)) - before)
    if not new and run_file.name.endswith(PARTIAL_SUFFIX):  # pytest died before pytest-benchmark saved anything
        new = [store_partial(args.storage, run_file, args.save_name)]
    if not new:
        raise CiError(f"pytest-benchmark saved no run in {args.storage}")
    return f"Stored as main's newest run: {new[-1]}."


def store_partial(storage: Path, run_file: Path, name: str) -> Path:
    """The partial run file as the storage's next run, where pytest-benchmark would have
    saved it (its machine's folder, NNNN_name.json); the run says itself that it is partial."""
    from pytest_benchmark.utils import get_machine_id  # loads no pytest

    folder = storage / get_machine_id()
    numbers = [int(p.name[:4]) for p in folder.glob("*.json") if p.name[:4].isdigit()]
    return write_atomic(folder / f"{max(numbers, default=0) + 1:04d}_{name}.json", run_file.read_bytes())


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
    parser.add_argument("--rows", type=Path, default=None, metavar="CSV",
                        help="append the run's row (card, commit, verdicts, paired runs) to this CSV "
                             "(python -m bench.tools.rows)")
    parser.add_argument("--tier-rows", type=Path, default=None, metavar="CSV",
                        help="append the job's wall time, with its card, commit and cases, to this CSV "
                             "(docs/data/tier-times.csv)")
    parser.add_argument("--no-store", action="store_true",
                        help="gate, but do not store the run (a shard of the nightly tier, merged and stored later)")
    parser.add_argument("--bench", nargs="+", default=["bench/"], metavar="PATH",
                        help="what pytest runs. Default: bench/")
    parser.add_argument("--pairs", type=pairs_count, default=PAIRS, metavar="N",
                        help="a case slower than main's history is measured again N times beside main's commit "
                             "(alternately, on this machine) and fails only if every pair confirms it; 0: the "
                             "first run decides. Default: %(default)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    args.pytest_args = pytest_args
    for arg in pytest_args:
        flag = arg.split("=", 1)[0]
        if flag in CONTROLLED:
            parser.error(f"-- {arg}: refused: {CONTROLLED[flag]}")
    for flag, csv_path, kind in (("--rows", args.rows, "gate-runs"), ("--tier-rows", args.tier_rows, "tier-times")):
        problem = csv_problem(csv_path, KINDS[kind]) if csv_path is not None else None
        if problem:
            parser.error(f"{flag} {csv_path}: {problem}")
    if args.storage.exists() and not args.storage.is_dir():
        parser.error(f"--storage {args.storage}: is a file; give the folder of main's stored runs")
    problem = directory_problem(args.out)
    if problem:
        parser.error(f"--out {args.out}: {problem}")
    return args


def pairs_count(value: str) -> int:
    """--pairs: a whole number from 0 (off) to 10."""
    if not value.isdigit() or int(value) > 10:
        raise argparse.ArgumentTypeError(f"{value!r}: give a whole number of pairs from 0 (off) to 10")
    return int(value)


def main(argv: Sequence[str] | None = None) -> int:
    loadbench_env.check("mlp-loadbench ci")  # the variables its pytest sessions and tools read
    args = parse_args(argv)
    try:
        return run_job(args)
    except CiError as exc:
        print(f"mlp-loadbench ci: {exc}", file=sys.stderr)
        return USAGE


if __name__ == "__main__":
    sys.exit(main())
