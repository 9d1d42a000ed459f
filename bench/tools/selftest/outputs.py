"""The self-test's outputs: selftest.md (false alarms, catches and suggested budget per
case) and suggested-budgets.toml, written whole or not at all."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from bench.gate.timing import MIN_NOISE_DOF
from bench.gate.runs import gpu_name
from kernels.ground.files import write_atomic
from bench.tools.selftest.analysis import CaseResult
from bench.tools.selftest.analysis import FORMULA
from bench.tools.selftest.analysis import Totals
from bench.tools.selftest.analysis import false_red_line
from bench.tools.selftest.analysis import totals
from bench.tools.selftest.campaign import Campaign
from bench.tools.selftest.campaign import missing_cases
from bench.tools.selftest.campaign import settings


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
