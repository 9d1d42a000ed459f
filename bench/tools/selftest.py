"""The time gate's self-test: how often the gate fails a case that did not change, how
often it catches a planted slowdown, and which per-case budget keeps it quiet.

    python -m bench.tools.selftest -k EXPR [--runs N] [--plant PCT ...] [--mode host|gpu]
                                   [--gpus 0,1,...] [--out DIR] [--resume] [-- PYTEST ARGS...]
    python -m bench.tools.selftest --from DIR [--out DIR] [--budgets PATH]

The chosen cases run N times as they are (A/A), then N times per planted slowdown, each
run one pytest process writing its own JSON (``--gpus`` runs one lane per GPU). The
analysis judges every A/A run against the others and every planted run against the A/A
history with the gate's own rules, and writes ``selftest.md`` (false alarms, catches per
case) and ``suggested-budgets.toml``. ``--from DIR`` analyses runs made elsewhere. The
file layout and the analysis in full: docs/reports.md.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from bench.gate.budgets import Budget
from bench.gate.budgets import BudgetError
from bench.gate.budgets import Budgets
from bench.gate.timing import DEFAULT_NOISE_K
from bench.gate.runs import HISTORY_SETTINGS
from bench.gate.runs import MAX_HISTORY
from bench.gate.runs import PARTIAL_SUFFIX
from bench.gate.timing import MIN_NOISE_DOF
from bench.gate.record import RECORD_KEY
from bench.gate.runs import BaselineError
from bench.gate.timing import check_time
from bench.gate.timing import estimate_noise
from bench.gate.runs import gpu_name
from bench.gate.runs import read_run
from bench.gate.timing import time_limit
from bench.gate.timing import time_samples
from bench.gate.profiles import DEFAULT_BUDGETS
from kernels.ground.args import parse_seconds
from kernels.ground import env as loadbench_env
from kernels.ground.files import write_atomic

FORMULA = (
    "suggested time_slower_pct = max(1.0, k x spread, 1.5 x largest A/A change) in percent, "
    "rounded up to 0.5 (k: the budget's time_noise_k, default 3)"
)
CHANGE_MARGIN = 1.5  # how far above the largest A/A change the budget sits
MIN_SUGGESTED_PCT = 1.0  # a floor: ten quiet runs can understate the jitter of a very steady case
AA_NAME = re.compile(r"^aa-(\d+)\.json$")
PLANT_NAME = re.compile(r"^plant(\d+(?:\.\d+)?)-(\d+)\.json$")
PYTEST_OK = (0, 1)  # 1: a case broke its own budgets; its record is still in the JSON
EPILOG = """\
Everything after -- goes to every pytest run unchanged (profile, device, dataset, ...), e.g.:

    python -m bench.tools.selftest -k units-512 --runs 10 --plant 5 --mode gpu -- --profile quick
    python -m bench.tools.selftest -k "" --runs 10 --plant 5 --plant 15 --mode gpu --gpus 0,1 -- --profile quick

Run files (written here, read by --from): aa-01.json ... aa-NN.json and plantX-01.json ...,
X the planted percentage (plant05-01.json, plant15-02.json).
"""


class SelftestError(Exception):
    """The self-test cannot go on; the message is one line that says why."""


# ------------------------------------------------------------------------ the run files


@dataclass(frozen=True)
class Campaign:
    """The run files of one self-test, each as (file name, run dict), in run order."""

    aa: list[tuple[str, dict[str, Any]]]
    planted: dict[float, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)  # percentage -> runs

    @property
    def aa_runs(self) -> list[dict[str, Any]]:
        return [run for _, run in self.aa]

    @property
    def planted_runs(self) -> dict[float, list[dict[str, Any]]]:
        return {pct: [run for _, run in runs] for pct, runs in sorted(self.planted.items())}

    def labelled(self) -> list[tuple[str, dict[str, Any]]]:
        return self.aa + [entry for pct in sorted(self.planted) for entry in self.planted[pct]]


def run_name(plant_pct: float | None, index: int) -> str:
    """aa-01, plant05-01: the stem of a run's files."""
    return f"aa-{index:02d}" if plant_pct is None else f"plant{plant_pct:02g}-{index:02d}"


def classify(name: str) -> tuple[float | None, int] | None:
    """(planted percentage or None for A/A, run number) from a run file's name; None: not one."""
    if found := AA_NAME.match(name):
        return None, int(found.group(1))
    if found := PLANT_NAME.match(name):
        return float(found.group(1)), int(found.group(2))
    return None


def run_files(folder: Path) -> list[Path]:
    """The self-test's run files in `folder`; other files there (the outputs, logs) are
    passed over, but a JSON named like a run file that does not parse as one is an error."""
    if not folder.is_dir():
        raise SelftestError(f"{folder}: no such directory")
    # run.partial.json: the cases a killed run finished (bench/plugin/partial.py); the
    # campaign runs that run again whole
    paths = sorted(p for p in folder.glob("*.json") if not p.name.endswith(PARTIAL_SUFFIX))
    for path in paths:
        if path.name.startswith(("aa-", "plant")) and classify(path.name) is None:
            raise SelftestError(f"{path}: not a self-test run name; use aa-NN.json or plantX-NN.json "
                                "(X the percentage)")
    found = [path for path in paths if classify(path.name) is not None]
    if not found:
        raise SelftestError(f"{folder}: no self-test run files (aa-NN.json, plantX-NN.json)")
    return found


def load_campaign(paths: Sequence[Path]) -> Campaign:
    """Read the run files named aa-NN / plantX-NN; SelftestError on anything unusable."""
    aa: list[tuple[int, str, dict[str, Any]]] = []
    planted: dict[float, list[tuple[int, str, dict[str, Any]]]] = {}
    for path in paths:
        kind = classify(path.name)
        if kind is None:
            raise SelftestError(f"{path}: not a self-test run name; use aa-NN.json or plantX-NN.json")
        try:
            run = read_run(path)
        except BaselineError as exc:
            raise SelftestError(str(exc).replace("baseline ", "run ", 1)) from None
        pct, index = kind
        (aa if pct is None else planted.setdefault(pct, [])).append((index, path.name, run))
    if not aa:
        where = f" in {paths[0].parent}" if paths else ""
        raise SelftestError(f"no A/A run files (aa-NN.json){where}: the planted runs need them as baseline")

    def ordered(entries: list[tuple[int, str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        entries = sorted(entries, key=lambda entry: entry[0])  # by number: run order, also past 99
        for (index, one, _), (again, other, _) in zip(entries, entries[1:]):
            if index == again:
                raise SelftestError(f"{one} and {other} are both run {index}: keep one")
        return [(name, run) for _, name, run in entries]

    campaign = Campaign(ordered(aa), {pct: ordered(runs) for pct, runs in planted.items()})
    check_campaign(campaign)
    return campaign


# ------------------------------------------------------------------------ checks


def settings(run: dict[str, Any]) -> dict[str, Any]:
    return run["machine_info"][RECORD_KEY].get("settings", {}) or {}


def plant_pct(plant: object) -> float | None:
    """The percentage of a recorded plant setting ('5%:gpu' -> 5.0); None without one."""
    if not plant:
        return None
    try:
        return float(str(plant).partition("%")[0])
    except ValueError:
        return math.nan  # recorded, but not as --plant-slowdown writes it: never equal to a name's X


def timed_cases(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """fullname -> extra_info of the benchmarks that are timed training cases."""
    return {
        b["fullname"]: b["extra_info"]
        for b in run["benchmarks"]
        if "case" in b.get("extra_info", {}) and time_samples(b["extra_info"])
    }


def check_campaign(campaign: Campaign) -> None:
    """One GPU model and one set of settings, the plant the names say, the same cases."""
    if len(campaign.aa) < 2:
        raise SelftestError(f"{len(campaign.aa)} A/A run: the false-alarm rate needs at least 2 (--runs 2)")
    first_name, first = campaign.aa[0]
    gpu, base = gpu_name(first["machine_info"]), settings(first)
    keys = [key for key in HISTORY_SETTINGS if key != "plant"]  # the plant differs by design
    for name, run in campaign.labelled():
        if gpu_name(run["machine_info"]) != gpu:
            raise SelftestError(f"{name}: measured on {gpu_name(run['machine_info'])}, {first_name} on {gpu}: "
                                "a self-test's runs must come from one GPU model")
        ours = settings(run)
        differ = ", ".join(f"{k} {ours.get(k)!r} vs {base.get(k)!r}" for k in keys if ours.get(k) != base.get(k))
        if differ:
            raise SelftestError(f"{name}: settings differ from {first_name}'s: {differ}")
    for name, run in campaign.aa:
        if settings(run).get("plant"):
            raise SelftestError(f"{name}: ran with --plant-slowdown {settings(run)['plant']}; A/A runs run without one")
    for pct, runs in campaign.planted.items():
        for name, run in runs:
            recorded = settings(run).get("plant")
            if plant_pct(recorded) != pct:
                what = f"--plant-slowdown {recorded}" if recorded else "no planted slowdown"
                raise SelftestError(f"{name}: ran with {what}, but its name says {pct:g}%")
    if not any(timed_cases(run) for _, run in campaign.labelled()):
        raise SelftestError(f"no timed training cases in {campaign.aa[0][0]} or the other runs")


def missing_cases(campaign: Campaign) -> list[str]:
    """Runs that lack cases others hold (a case that crashed in one run): each case is
    judged on the runs that hold it, and the outputs say which runs lacked what."""
    every = [(name, set(timed_cases(run))) for name, run in campaign.labelled()]
    union = set().union(*(cases for _, cases in every))
    notes = []
    for name, cases in every:
        missing = sorted(union - cases)
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            notes.append(f"{name}: lacks {len(missing)} case(s) that other runs hold: {shown}; "
                         "judged on the runs that hold them")
    return notes


# ------------------------------------------------------------------------ analysis


@dataclass(frozen=True)
class CaseResult:
    fullname: str
    case_id: str
    experiment: str
    runs: int  # A/A runs
    spread: float | None  # relative; None while unknown
    largest_change: float  # relative, as a slowdown
    false_alarms: int
    comparisons: int  # A/A judgements: runs - 1
    detected: dict[float, tuple[int, int]]  # planted percentage -> (runs failed, runs)
    detectable: float | None  # relative limit now; None when the budget does not judge time
    detectable_rule: str
    k: float
    suggested_pct: float | None
    cards: int = 1  # distinct GPUs among the A/A runs; 0: some run does not say which
    card_offset: float | None = None  # relative, slowest card's median over the fastest's; None: one card or unknown
    red_runs: tuple[str, ...] = ()  # the A/A runs (by name) this case failed in, against the run before


def card_of(run: dict[str, Any]) -> str | None:
    """The UUID of the GPU a run was made on; None for runs that do not record it."""
    gpu = run["machine_info"][RECORD_KEY].get("gpu") or {}
    return gpu.get("uuid")


def card_offset(records: Sequence[dict[str, Any]], cards: Sequence[str | None]) -> tuple[int, float | None]:
    """(distinct cards, offset): the median of each card's run medians, the slowest over
    the fastest minus 1. A campaign on a multi-GPU host alternates cards; this says how
    much of the A/A spread is the cards rather than the runs. (0, None) when some run
    does not name its card, (1, None) on one card."""
    if not cards or any(card is None for card in cards):
        return 0, None
    per_card: dict[str | None, list[float]] = {}
    for record, card in zip(records, cards):
        per_card.setdefault(card, []).append(median_epoch(record))
    if len(per_card) < 2:
        return len(per_card), None
    medians = [statistics.median(values) for values in per_card.values()]
    return len(per_card), max(medians) / min(medians) - 1


def median_epoch(extra_info: dict[str, Any]) -> float:
    """The median steady epoch, as check_time takes it."""
    return statistics.median(time_samples(extra_info))


def largest_change(records: Sequence[dict[str, Any]]) -> float:
    """The largest change of the median epoch between consecutive runs, either way, as a
    slowdown: which run of a pair came first is chance, so a speedup counts as well."""
    changes = [0.0]
    for before, now in zip(records, records[1:]):
        ratio = median_epoch(now) / median_epoch(before)
        changes.append(max(ratio, 1 / ratio) - 1)
    return max(changes)


def gate_history(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the suite would hold as stored history: the newest MAX_HISTORY runs."""
    return list(records[-MAX_HISTORY:])


def false_alarm_runs(budget: Budget, aa: Sequence[dict[str, Any]]) -> list[int]:
    """A/A run i against run i-1, history runs 1..i-1, for i = 2..N: the i that failed (0-based)."""
    return [i for i in range(1, len(aa)) if check_time(budget, aa[i], aa[i - 1], history=gate_history(aa[:i]))]


def count_false_alarms(budget: Budget, aa: Sequence[dict[str, Any]]) -> int:
    """How many A/A comparisons failed (false_alarm_runs)."""
    return len(false_alarm_runs(budget, aa))


def count_detections(budget: Budget, aa: Sequence[dict[str, Any]], planted: Sequence[dict[str, Any]]) -> int:
    """Planted runs against the last A/A run, history all A/A runs: how many failed."""
    history = gate_history(aa)
    return sum(bool(check_time(budget, run, aa[-1], history=history)) for run in planted)


def noise_k(budget: Budget) -> float:
    return budget.time_noise_k if budget.time_noise_k is not None else DEFAULT_NOISE_K


def suggest_pct(k: float, spread: float | None, change: float) -> float | None:
    """max(1.0, k x spread, 1.5 x largest change) in percent, rounded up to 0.5; None
    while the spread is unknown: a budget from two runs would only guess."""
    if spread is None:
        return None
    pct = max(MIN_SUGGESTED_PCT, 100 * k * spread, 100 * CHANGE_MARGIN * change)
    return math.ceil(round(2 * pct, 9)) / 2  # round(): 3 x 0.5% must stay 1.5, not 1.5000000001 -> 2.0


def smallest_detectable(budget: Budget, aa: Sequence[dict[str, Any]]) -> tuple[float | None, str]:
    """time_limit against the A/A history, and a short name of the rule that set it."""
    if budget.time_slower_pct is None:
        return None, "time not judged (no time_slower_pct)"
    noise = estimate_noise(gate_history(aa))
    limit, rule = time_limit(budget, noise)
    if rule.startswith("budget"):
        return limit, "budget"
    return limit, f"{noise_k(budget):g} x spread" if noise.known else "noise unknown"


def analyse_case(
    budget: Budget,
    fullname: str,
    aa: Sequence[dict[str, Any]],
    planted: dict[float, Sequence[dict[str, Any]]],
    cards: Sequence[str | None] = (),
    names: Sequence[str] = (),
) -> CaseResult:
    """One case's figures from its extra_info records: A/A in run order, planted per
    percentage; `cards`, the GPU of each A/A record (card_of), where known; `names`, the
    A/A runs' names (aa-01 ...), for the run-level false-red rate."""
    red = false_alarm_runs(budget, aa)
    spread = estimate_noise(aa).spread
    change = largest_change(aa)
    detectable, rule = smallest_detectable(budget, aa)
    n_cards, offset = card_offset(aa, cards)
    return CaseResult(
        fullname=fullname,
        case_id=str(aa[0].get("case", fullname)),
        experiment=str(aa[0].get("experiment", "")),
        runs=len(aa),
        spread=spread,
        largest_change=change,
        false_alarms=len(red),
        comparisons=len(aa) - 1,
        detected={pct: (count_detections(budget, aa, runs), len(runs)) for pct, runs in sorted(planted.items())},
        detectable=detectable,
        detectable_rule=rule,
        k=noise_k(budget),
        suggested_pct=suggest_pct(noise_k(budget), spread, change),
        cards=n_cards,
        card_offset=offset,
        red_runs=tuple(names[i] if i < len(names) else str(i + 1) for i in red),
    )


def analyse(
    aa_runs: Sequence[dict[str, Any]], planted_runs: dict[float, Sequence[dict[str, Any]]], budgets: Budgets,
    aa_names: Sequence[str] = (),
) -> list[CaseResult]:
    """Every case of the runs (checked alike beforehand), in name order; `aa_names` names the A/A runs."""
    campaign_names = list(zip(aa_names, aa_runs))
    run_settings = settings(aa_runs[0])
    profile, dataset = run_settings.get("profile", "smoke"), run_settings.get("dataset", "synthetic")
    results = []
    every = sorted(set().union(*(timed_cases(run) for run in aa_runs)))
    for fullname in every:
        holding = [run for run in aa_runs if fullname in timed_cases(run)]
        aa = [timed_cases(run)[fullname] for run in holding]
        if len(aa) < 2:
            continue  # no A/A comparison to make; missing_cases says which runs lack it
        planted = {pct: [timed_cases(run)[fullname] for run in runs if fullname in timed_cases(run)]
                   for pct, runs in planted_runs.items()}
        budget = budgets.resolve(profile, str(aa[0].get("experiment", "")), str(aa[0].get("case", "")), dataset)
        names = [name for name, run in campaign_names if run in holding] if campaign_names else []
        results.append(analyse_case(budget, fullname, aa, planted, [card_of(run) for run in holding], names))
    return results


@dataclass(frozen=True)
class Totals:
    false_alarms: int
    comparisons: int
    caught_always: dict[float, int]  # percentage -> cases caught in every planted run
    cases: int
    red_runs: int = 0  # A/A runs in which some case failed against the run before
    run_comparisons: int = 0  # A/A runs judged against the one before (runs - 1)
    estimated_red: float | None = None  # 1 - prod(1 - each case's false-alarm rate): a run of all these cases


def totals(results: Sequence[CaseResult], aa_runs: int = 0) -> Totals:
    pcts = sorted({pct for r in results for pct in r.detected})
    clear = 1.0
    for r in results:
        clear *= 1 - (r.false_alarms / r.comparisons if r.comparisons else 0.0)
    return Totals(
        false_alarms=sum(r.false_alarms for r in results),
        comparisons=sum(r.comparisons for r in results),
        caught_always={pct: sum(r.detected.get(pct, (0, 1))[0] == r.detected.get(pct, (0, 1))[1] for r in results)
                       for pct in pcts},
        cases=len(results),
        red_runs=len({name for r in results for name in r.red_runs}),
        run_comparisons=max(aa_runs - 1, 0),
        estimated_red=1 - clear if results else None,
    )


def false_red_line(t: Totals) -> str:
    """The chance that an unchanged run of these cases is red, before any paired re-run:
    as observed over the A/A runs, with the rule of three's 95% bound where none was red,
    and as estimated from the cases' own rates taken as independent."""
    if not t.run_comparisons:
        return "false-red rate per run: unknown (needs 2 A/A runs)"
    observed = f"{t.red_runs}/{t.run_comparisons} A/A runs red against the run before"
    if t.red_runs == 0:
        observed += f" (under {min(1.0, 3 / t.run_comparisons):.0%} at 95% confidence)"
    estimate = f"; from the cases' own rates {t.estimated_red:.1%}" if t.estimated_red is not None else ""
    return (f"false-red rate per run (an unchanged run of these {t.cases} case(s) failing somewhere, before the "
            f"paired re-runs of `ci`): {observed}{estimate}")


# ------------------------------------------------------------------------ outputs


def percent(value: float | None, unknown: str = "unknown") -> str:
    return unknown if value is None else f"{100 * value:.2f}%"


def table(results: Sequence[CaseResult]) -> str:
    pcts = sorted({pct for r in results for pct in r.detected})
    headers = ["case", "runs", "spread", "largest A/A change", "between cards", "false alarms"]
    headers += [f"detected at +{pct:g}%" for pct in pcts] + ["smallest detectable now", "suggested time_slower_pct"]
    rows = []
    for r in results:
        needs = f"unknown (needs {MIN_NOISE_DOF + 1} runs)"
        detected = [f"{r.detected[pct][0]}/{r.detected[pct][1]}" if pct in r.detected else "-" for pct in pcts]
        rows.append([
            r.case_id, r.runs, percent(r.spread, needs), percent(r.largest_change), between_cards(r),
            f"{r.false_alarms}/{r.comparisons}", *detected,
            f"{percent(r.detectable, 'n/a')} ({r.detectable_rule})",
            "n/a (spread unknown)" if r.suggested_pct is None else f"{r.suggested_pct:.1f}",
        ])
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def between_cards(r: CaseResult) -> str:
    if r.card_offset is not None:
        return f"{percent(r.card_offset)} ({r.cards} cards)"
    return "one card" if r.cards == 1 else "unknown"


def totals_line(t: Totals) -> str:
    parts = [f"false failures {t.false_alarms}/{t.comparisons} A/A comparisons over {t.cases} case(s)"]
    parts += [f"+{pct:g}% caught in every run in {n}/{t.cases} case(s)" for pct, n in t.caught_always.items()]
    return "totals: " + "; ".join(parts)


def describe(campaign: Campaign) -> str:
    """Where and how the runs were made, for the outputs' headers."""
    first = campaign.aa_runs[0]
    s = settings(first)
    commit = str(first.get("commit_info", {}).get("id") or "unknown")[:12]
    planted_runs = [run for runs in campaign.planted_runs.values() for run in runs]
    plants = list(dict.fromkeys(str(settings(run).get("plant")) for run in planted_runs))  # in percentage order
    planted = f"; planted {', '.join(plants)}" if plants else "; nothing planted"
    shown = ", ".join(f"{key} {s.get(key)}" for key in ("profile", "epochs", "dataset", "loop", "impl", "precision"))
    return f"{gpu_name(first['machine_info'])}, commit {commit}, {shown}; {len(campaign.aa)} A/A runs{planted}"


def markdown(campaign: Campaign, results: Sequence[CaseResult], budgets_path: Path) -> str:
    notes = [f"- {note}" for note in missing_cases(campaign)]
    return "\n".join([
        "# Time gate self-test",
        "",
        f"Runs: {describe(campaign)}. Budgets: {budgets_path}.",
        "",
        "False alarms: A/A run i judged against run i-1 (history runs 1..i-1). Detected: each planted run judged "
        "against the last A/A run (history all A/A runs). Spread: standard deviation of log run medians over the "
        "A/A runs. Largest A/A change: between consecutive A/A runs, either way. Between cards: where the A/A "
        "runs were made on several GPUs (the record's GPU UUID), the slowest card's median epoch over the "
        "fastest's, each the median of that card's runs: what of the spread is the cards. Smallest detectable "
        "now: the slowdown a run must exceed to fail against this history.",
        "",
        f"{FORMULA}.",
        "",
        table(results),
        "",
        totals_line(totals(results)),
        "",
        false_red_line(totals(results, len(campaign.aa))),
        "",
        *notes,
    ])


def toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def suggested_toml(campaign: Campaign, results: Sequence[CaseResult]) -> str:
    """The suggestions in the budgets file's own format: one table per case id."""
    from kernels.ground.cases import CASE_IDS  # the ids Budgets.load accepts

    profile = settings(campaign.aa_runs[0]).get("profile", "smoke")
    lines = [
        "# Suggested time budgets from `python -m bench.tools.selftest` (generated: review, then copy",
        "# the tables you want into bench/budgets.toml).",
        f"# {FORMULA}.",
        f"# Measured on: {describe(campaign)}.",
        "",
    ]
    for case_id, group in by_case_id(results).items():
        evidence = "; ".join(
            f"spread {percent(r.spread)} over {r.runs} runs (k {r.k:g}), largest A/A change {percent(r.largest_change)}"
            for r in group
        )
        header = f"[profiles.{profile}.cases.{toml_string(case_id)}]"
        known = [r.suggested_pct for r in group if r.suggested_pct is not None]
        if case_id not in CASE_IDS:
            lines += [f"# {header}: {case_id!r} is not a case id of kernels/ground/cases.py; not written "
                      f"({evidence})", ""]
        elif len(known) < len(group):
            lines += [f"# {header}: no suggestion: spread unknown with fewer than {MIN_NOISE_DOF + 1} A/A runs "
                      f"({evidence})", ""]
        else:
            lines += [f"# {evidence}", header, f"time_slower_pct = {max(known):.1f}", ""]
    return "\n".join(lines)


def by_case_id(results: Sequence[CaseResult]) -> dict[str, list[CaseResult]]:
    """Budgets are keyed by case id; two benchmarks of one id share the larger suggestion."""
    groups: dict[str, list[CaseResult]] = {}
    for r in results:
        groups.setdefault(r.case_id, []).append(r)
    return groups


def write_outputs(out: Path, campaign: Campaign, results: Sequence[CaseResult], budgets_path: Path) -> str:

    text = markdown(campaign, results, budgets_path)
    write_atomic(out / "selftest.md", text)
    write_atomic(out / "suggested-budgets.toml", suggested_toml(campaign, results))
    return text


# ------------------------------------------------------------------------ running


def pytest_command(path: str, expr: str, out_json: Path, plant: str | None, extra: Sequence[str]) -> list[str]:
    plant_args = [f"--plant-slowdown={plant}"] if plant else []
    return [sys.executable, "-m", "pytest", path, "-k", expr, "-p", "no:cacheprovider", "-q",
            f"--benchmark-json={out_json}", *plant_args, *extra]


def run_one(
    command: list[str], out_json: Path, name: str, log: Path, env: dict[str, str] | None = None
) -> tuple[int, float]:
    """One pytest run into `out_json`, its output into `log`: (exit code, seconds)."""
    out_json.unlink(missing_ok=True)  # a JSON left from an earlier campaign must not pass for this run's
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode
    seconds = time.perf_counter() - start
    # pytest-benchmark opens --benchmark-json's file while it parses the command line, so a
    # run stopped by a usage error leaves it there, empty.
    written = out_json.is_file() and out_json.stat().st_size > 0
    if code not in PYTEST_OK or not written:
        why = f"pytest exit {code}" + ("" if written else ", no JSON written")
        raise SelftestError(f"run {name} failed ({why}; output in {log}): {shlex.join(command)}")
    return code, seconds


class CampaignStopped(Exception):
    """--stop-after ended the campaign before its last run; the message says how to go on."""


def finished_run(path: Path) -> bool:
    """Whether `path` holds a complete run of this suite (what --resume keeps)."""
    try:
        read_run(path)
    except BaselineError:
        return False
    return True


def run_campaign(out: Path, path: str, expr: str, runs: int, plants: Sequence[float], mode: str,
                 extra: Sequence[str], gpus: Sequence[str] = (), resume: bool = False,
                 stop_after: float | None = None) -> list[Path]:
    """Every run, A/A first, printing a line per run as it ends; the JSON files written.
    With `gpus`, one lane per GPU runs the plan's next run as it frees; the first
    failure stops the lanes from starting more and is raised once the running ones end.

    `resume`: a run whose JSON in `out` is already a complete run is kept, not run again
    (an interrupted run leaves none, or one that does not parse, and runs again).
    `stop_after`: seconds; a lane starts no run that would end past them, judged by the
    longest run so far, and CampaignStopped is raised once the running ones end. So a
    campaign can be spread over sessions of limited time: the same command with
    ``--resume`` goes on where the last one stopped."""
    out.mkdir(parents=True, exist_ok=True)
    plan = [(None, i) for i in range(1, runs + 1)] + [(pct, i) for pct in plants for i in range(1, runs + 1)]
    own_series = any(arg.startswith("--series-dir") for arg in extra)
    width = len(str(len(plan)))
    pending = list(enumerate(plan, 1))
    if resume:
        pending = [(step, (pct, i)) for step, (pct, i) in pending if not finished_run(out / f"{run_name(pct, i)}.json")]
        if len(pending) < len(plan):
            print(f"resuming: {len(plan) - len(pending)} of {len(plan)} runs already in {out}", flush=True)
    failures: list[Exception] = []
    lock = threading.Lock()
    begin, longest = time.monotonic(), [0.0]  # longest: a cell the lanes share

    def lane(gpu: str | None) -> None:
        env = None if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        while True:
            with lock:
                if failures or not pending:
                    return
                if stop_after is not None and time.monotonic() - begin + longest[0] > stop_after:
                    return
                step, (pct, index) = pending.pop(0)
            name = run_name(pct, index)
            series = [] if own_series else [f"--series-dir={out / 'series' / name}"]
            plant = f"{pct:g}:{mode}" if pct is not None else None
            command = pytest_command(path, expr, out / f"{name}.json", plant, [*series, *extra])
            try:
                code, seconds = run_one(command, out / f"{name}.json", name, out / f"{name}.log", env)
            except Exception as exc:  # raised again by the caller's thread, below
                with lock:
                    failures.append(exc)
                return
            with lock:
                longest[0] = max(longest[0], seconds)
            note = " (a case broke its own budgets; its record counts)" if code == 1 else ""
            where = f" on GPU {gpu}" if gpu is not None else ""
            print(f"[{step:>{width}}/{len(plan)}] {name}{where}: {seconds:.1f} s, pytest exit {code}{note}", flush=True)

    if gpus:
        lanes = [threading.Thread(target=lane, args=(gpu,), name=f"selftest-gpu{gpu}") for gpu in gpus]
        for thread in lanes:
            thread.start()
        for thread in lanes:
            thread.join()
    else:
        lane(None)
    if failures:
        raise failures[0]
    if pending:  # no failure, so --stop-after left them
        raise CampaignStopped(
            f"stopped after {time.monotonic() - begin:.0f} s (--stop-after {stop_after:g}): "
            f"{len(plan) - len(pending)} of {len(plan)} runs in {out}; the same command with --resume goes on"
        )
    return [out / f"{run_name(pct, index)}.json" for pct, index in plan]


def parse_gpus(value: str) -> list[str]:
    """'0,1' -> ['0', '1']: CUDA device indices, each once."""
    parts = [part.strip() for part in value.split(",")]
    if not all(part.isdigit() for part in parts) or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"{value!r}: GPU indices separated by commas, each once (e.g. 0,1)")
    return parts


def visible_gpus() -> int:
    """How many GPUs `--gpus` may name: NVML's count of this machine's devices (the
    indices CUDA_VISIBLE_DEVICES takes, which each lane sets for its pytest); 0 where
    there is no NVIDIA driver or NVML library."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def gpus_problem(gpus: Sequence[str], count: int) -> str | None:
    """Why `--gpus` cannot run on a machine with `count` GPUs (a run would train on no
    GPU, or fail after the runs before it), or None when every index names one."""
    given = ",".join(gpus)
    if count == 0:
        return f"--gpus {given}: no GPU on this machine (NVML finds none); leave --gpus out to run one run at a time"
    missing = [gpu for gpu in gpus if int(gpu) >= count]
    if missing:
        return (f"--gpus {given}: this machine has {count} GPU(s), indices 0 to {count - 1}; "
                f"no GPU {', '.join(missing)}")
    return None


# ------------------------------------------------------------------------ command line


def parse_pct(value: str) -> float:
    try:
        pct = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a percentage") from None
    if not 0 < pct <= 1000:
        raise argparse.ArgumentTypeError(f"{value!r}: the planted slowdown must be in (0, 1000] percent")
    return pct


def parse_runs(value: str) -> int:
    if not value.isdigit() or int(value) < 2:
        raise argparse.ArgumentTypeError(f"{value!r}: at least 2 runs (one A/A comparison)")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.selftest",
        usage="%(prog)s (-k EXPR | --from DIR) [--runs N] [--plant PCT ...] [--mode host|gpu] [--gpus 0,1] [--out DIR] "
              "[--path PATH] [--budgets PATH] [--resume] [--stop-after SECONDS] [-- PYTEST ARGS...]",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keep the epilog's lines
    )
    parser.add_argument("-k", dest="expr", help="the cases (a pytest -k expression)")
    parser.add_argument("--runs", type=parse_runs, default=None, metavar="N", help="runs of each kind. Default: 10")
    parser.add_argument("--plant", type=parse_pct, action="append", default=[], metavar="PCT",
                        help="a planted slowdown in percent; repeat for several")
    parser.add_argument("--mode", choices=("host", "gpu"), default=None,
                        help="how the slowdown is planted (--plant-slowdown's mode). Default: host")
    parser.add_argument("--gpus", type=parse_gpus, default=None, metavar="0,1,...",
                        help="run on these GPUs (this machine's GPU indices) at once, one run per GPU at a "
                             "time; refused where a GPU is not there. Default: one run at a time")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where the run files and outputs go. "
                             "Default: selftest/ (with --from: its folder)")
    parser.add_argument("--path", default=None, help="what pytest runs. Default: bench/test_experiments.py")
    parser.add_argument("--budgets", type=Path, default=DEFAULT_BUDGETS, metavar="PATH",
                        help="the budgets file the runs are judged with. Default: bench/budgets.toml")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs already complete in --out; run only the rest")
    parser.add_argument("--stop-after", type=parse_seconds, default=None, metavar="SECONDS",
                        help="start no run that would end later than this (judged by the longest run so far); "
                             "exit 3, to go on with --resume")
    parser.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                        help="do not run: analyse the run files already in DIR")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, pytest_args = parser.parse_args(argv[:split]), argv[split + 1 :]  # after --: for pytest
    loadbench_env.check("mlp-loadbench selftest")  # before any of the pytest sessions would refuse it each
    running = (("-k", args.expr), ("--runs", args.runs), ("--plant", args.plant), ("--mode", args.mode),
               ("--path", args.path), ("--gpus", args.gpus), ("--resume", args.resume),
               ("--stop-after", args.stop_after), ("pytest arguments", pytest_args))
    running_only = [name for name, given in running if given not in (None, False, [])]  # -k "": every case
    if args.from_dir is not None and running_only:
        parser.error(f"--from analyses runs already made: {', '.join(running_only)} do not apply")
    if args.from_dir is None and args.expr is None:
        parser.error("-k EXPR (the cases to run) or --from DIR (runs already made) is required")
    out = args.out or args.from_dir or Path("selftest")
    problem = gpus_problem(args.gpus, visible_gpus()) if args.gpus else None
    if problem:  # before any run: the lanes would train on no GPU, or on GPUs that are not there
        print(f"mlp-loadbench selftest: {problem}", file=sys.stderr)
        return 2
    try:
        budgets = Budgets.load(args.budgets)
        if args.from_dir is not None:
            paths = run_files(args.from_dir)
        else:
            paths = run_campaign(out, args.path or "bench/test_experiments.py", args.expr, args.runs or 10,
                                 args.plant, args.mode or "host", pytest_args, args.gpus or (),
                                 resume=args.resume, stop_after=args.stop_after)
        campaign = load_campaign(paths)
        results = analyse(campaign.aa_runs, campaign.planted_runs, budgets, [name for name, _ in campaign.aa])
    except CampaignStopped as exc:
        print(f"mlp-loadbench selftest: {exc}", file=sys.stderr)
        return 3
    except (SelftestError, BudgetError) as exc:
        print(f"mlp-loadbench selftest: {exc}", file=sys.stderr)
        return 2
    for note in missing_cases(campaign):
        print(f"warning: {note}", file=sys.stderr)
    print(write_outputs(out, campaign, results, args.budgets))
    print(f"wrote {out / 'selftest.md'} and {out / 'suggested-budgets.toml'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
