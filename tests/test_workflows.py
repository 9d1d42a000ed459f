"""The GitHub workflow files: valid against the schema, and safe to run on our GPU runner.

The safety rules are checked on the parsed YAML by functions that return problems, so
a test can also show that each check fails on a copy with its rule broken.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
GPU_LABEL = "gpu-bench"
SAME_REPO = "github.event.pull_request.head.repo.full_name == github.repository"
MAIN_PUSH = ("github.event_name == 'push'", "github.ref == 'refs/heads/main'")
# What stores a run as main's history: pytest-benchmark's saves, the CI command's storing
# modes, a push to the data branch.
SAVES_BASELINE = ("--benchmark-save", "--benchmark-autosave", "bench.tools.ci main", "bench.tools.ci nightly",
                  "databranch push")
SCHEDULED_ONLY = {"schedule", "workflow_dispatch"}  # events that run the default branch's code only


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    """The `on:` table, whichever of its three forms the file uses. YAML 1.1 reads the bare key `on` as True."""
    on = workflow.get("on", workflow.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return on


# ------------------------------------------------------------------ the checks


def guard_problems(workflow: dict[str, Any], job: str = "bench") -> list[str]:
    """A job on the self-hosted runner must not run a fork's pull request unless a maintainer labelled it."""
    problems = []
    pull_request = triggers(workflow).get("pull_request") or {}
    if "labeled" not in pull_request.get("types", []):
        problems.append("pull_request does not trigger on 'labeled': the label cannot start the job")
    guard = " ".join(str(workflow["jobs"][job].get("if", "")).split())
    if SAME_REPO not in guard:
        problems.append(f"jobs.{job}.if does not require the pull request's head repository to be this one")
    if f"'{GPU_LABEL}'" not in guard:
        problems.append(f"jobs.{job}.if does not name the maintainers' label {GPU_LABEL!r}")
    for event in ("fork_opened", "fork_synchronize", "fork_synchronize_labelled", "own_labeled_other"):
        if evaluate(guard, EVENTS[event]):
            problems.append(f"jobs.{job}.if runs the job on {event}")
    for event in ("own_opened", "own_synchronize", "fork_labeled_gpu"):
        if not evaluate(guard, EVENTS[event]):
            problems.append(f"jobs.{job}.if skips the job on {event}")
    return problems


def permission_problems(workflow: dict[str, Any]) -> list[str]:
    """Least privilege: a read-only token at the top; a job adds only what it needs, never write-all."""
    top = workflow.get("permissions")
    if not isinstance(top, dict):
        return [f"top-level permissions is {top!r}: name each scope (contents: read)"]
    problems = [f"top-level permissions gives {scope}: {level}" for scope, level in top.items() if level == "write"]
    if top.get("contents") not in ("read", "none"):
        problems.append(f"top-level permissions has contents: {top.get('contents')!r}, not read")
    for name, job in workflow.get("jobs", {}).items():
        if job.get("permissions") in ("write-all", "read-all"):
            problems.append(f"jobs.{name}.permissions is {job['permissions']}")
    return problems


def baseline_problems(workflow: dict[str, Any]) -> list[str]:
    """A step that saves a baseline runs only on a push to main (its job's or its own `if:`),
    or in a workflow that only a schedule or a maintainer starts; else a pull request could
    plant one."""
    problems = []
    scheduled = set(triggers(workflow)) <= SCHEDULED_ONLY
    for name, job in workflow.get("jobs", {}).items():
        for step in job.get("steps", []):
            if not any(flag in str(step.get("run", "")) for flag in SAVES_BASELINE) or scheduled:
                continue
            conditions = [" ".join(str(c).split()) for c in (job.get("if", ""), step.get("if", "")) if c]
            if not any(all(part in c for part in MAIN_PUSH) and "||" not in c for c in conditions):
                problems.append(f"jobs.{name}: step {step.get('name')!r} saves a baseline under if: {conditions!r}")
    return problems


SETUP = "./.github/actions/gpu-runner"  # the composite action: venv, caches, install
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "LOADBENCH_CACHE_DIR")
MAIN_REF = "refs/heads/main"


def concurrency_problems(workflow: dict[str, Any]) -> list[str]:
    """One concurrency group per workflow and ref, none shared between jobs (GitHub keeps one
    pending run per group and cancels the rest), and no run of main ever cancelled: where
    main's pushes run, main gets a group per commit and cancel-in-progress is false for it."""
    top = workflow.get("concurrency") or {}
    group = " ".join(str(top.get("group", "")).split())
    problems = []
    if "github.workflow" not in group or "github.ref" not in group:
        problems.append(f"concurrency.group {group!r} is not one group per workflow and ref")
    for name, job in workflow.get("jobs", {}).items():
        if "concurrency" in job and "self-hosted" in job.get("runs-on", []):  # (the Pages deploy may drop a stale one)
            problems.append(f"jobs.{name}.concurrency: a job-level group queues, and drops, other runs' jobs")
    if "push" in triggers(workflow):
        cancel = str(top.get("cancel-in-progress", False))
        if "github.sha" not in group:
            problems.append("pushes to main share one group: a queued main run is dropped by the next")
        if cancel not in ("False", "false") and f"github.ref != '{MAIN_REF}'" not in cancel:
            problems.append(f"cancel-in-progress {cancel!r} can cancel a run of main")
    return problems


def runner_problems(workflow: dict[str, Any]) -> list[str]:
    """A job on the self-hosted runner sets up with the composite action (its own venv, the
    runner's caches) before anything runs Python, and installs nothing into the runner's
    system Python."""
    problems = []
    for name, job in workflow.get("jobs", {}).items():
        if "self-hosted" not in job.get("runs-on", []):
            continue
        steps = job.get("steps", [])
        uses = [i for i, step in enumerate(steps) if step.get("uses") == SETUP]
        python = [i for i, step in enumerate(steps) if "python" in str(step.get("run", ""))]
        if not uses:
            problems.append(f"jobs.{name} does not use {SETUP}")
        elif python and min(python) < uses[0]:
            problems.append(f"jobs.{name} runs Python before {SETUP}")
        problems += [f"jobs.{name}: step {step.get('name')!r} installs with pip outside the job's venv"
                     for step in steps if "pip install" in str(step.get("run", ""))]
    return problems


def setup_problems(action: dict[str, Any]) -> list[str]:
    """The composite action makes a venv, puts it first on PATH, keeps every kernel cache
    in the runner's tool cache and installs into the venv."""
    script = " ".join(str(step.get("run", "")) for step in action.get("runs", {}).get("steps", []))
    problems = [] if "-m venv" in script and "GITHUB_PATH" in script else ["no venv first on the PATH"]
    problems += [f"{name} is not kept in the runner's tool cache" for name in CACHE_VARIABLES
                 if not re.search(rf"{name}=\$caches/", script) or "$RUNNER_TOOL_CACHE" not in script]
    if not re.search(r"venv/bin/python\" -m pip install", script):
        problems.append("the project is not installed into the venv")
    return problems


def shard_problems(workflow: dict[str, Any]) -> list[str]:
    """The nightly tier is dealt over the runner pool: a matrix job runs `--shard i/N` for
    i = 1..N without storing, and a job that needs it merges the shards and stores one run."""
    jobs = workflow.get("jobs", {})
    sharded = {name: job for name, job in jobs.items() if "shard" in (job.get("strategy") or {}).get("matrix", {})}
    if not sharded:
        return ["no job runs the nightly tier as a matrix of shards"]
    problems = []
    for name, job in sharded.items():
        shards = job["strategy"]["matrix"]["shard"]
        runs = " ".join(str(step.get("run", "")) for step in job.get("steps", []))
        if shards != list(range(1, len(shards) + 1)) or f"--shard ${{{{ matrix.shard }}}}/{len(shards)}" not in runs:
            problems.append(f"jobs.{name} does not run shards 1..{len(shards)} of {len(shards)}")
        if "bench.tools.ci nightly" not in runs or "--no-store" not in runs:
            problems.append(f"jobs.{name}: a shard must be gated by ci nightly and not stored on its own")
        merging = [other for other, spec in jobs.items() if name in (spec.get("needs") or [])
                   and "bench.tools.merge" in " ".join(str(s.get("run", "")) for s in spec.get("steps", []))
                   and "databranch push" in " ".join(str(s.get("run", "")) for s in spec.get("steps", []))]
        if not merging:
            problems.append(f"no job needs jobs.{name}, merges its runs and stores the merged run")
    return problems


# ------------------------------------------- the guard's meaning, on sample events

REPO = "owner/mlp-loadbench"


def pull_request(action: str, fork: bool, labels: tuple[str, ...] = (), label: str | None = None) -> dict[str, Any]:
    """The contexts an `if:` sees for a pull_request event (`label`: the one a 'labeled' event adds)."""
    contexts = {
        "github.event_name": "pull_request",
        "github.event.action": action,
        "github.event.pull_request.head.repo.full_name": "someone/mlp-loadbench" if fork else REPO,
        "github.event.pull_request.labels.*.name": list(labels),
    }
    return contexts | ({"github.event.label.name": label} if label else {})


EVENTS = {  # name: the contexts an `if:` sees for that event
    "push_main": {"github.event_name": "push", "github.ref": "refs/heads/main"},
    "own_opened": pull_request("opened", fork=False),
    "own_synchronize": pull_request("synchronize", fork=False),
    "own_labeled_other": pull_request("labeled", fork=False, labels=("docs",), label="docs"),
    "fork_opened": pull_request("opened", fork=True),
    "fork_synchronize": pull_request("synchronize", fork=True),
    # a fork's push after a maintainer labelled an earlier commit: not read yet
    "fork_synchronize_labelled": pull_request("synchronize", fork=True, labels=(GPU_LABEL,)),
    "fork_labeled_gpu": pull_request("labeled", fork=True, labels=(GPU_LABEL,), label=GPU_LABEL),
}
IDENTIFIER = r"[A-Za-z_][\w.\-*]*"


def evaluate(expression: str, event: dict[str, Any]) -> bool:
    """A GitHub `if:` expression of contexts, literals, ==, !=, &&, ||, parentheses and
    contains(), for one sample event. An unset context is null, and no `if:` always runs, as on GitHub."""
    expression = expression.strip().removeprefix("${{").removesuffix("}}")
    if not expression.strip():
        return True
    contexts = {"github.repository": REPO, **event}
    literals = {"true": "True", "false": "False", "null": "None", "contains": "contains"}
    python = []
    for token in re.findall(rf"'[^']*'|==|!=|&&|\|\||[(),]|{IDENTIFIER}|\S", expression):
        if token.startswith("'") or token in ("==", "!=", "(", ")", ","):
            python.append(token)
        elif token in ("&&", "||"):
            python.append({"&&": "and", "||": "or"}[token])
        elif token in literals:
            python.append(literals[token])
        elif re.fullmatch(IDENTIFIER, token):
            python.append(repr(contexts.get(token)))
        else:
            raise ValueError(f"the test's evaluator does not know {token!r} in {expression!r}")
    namespace = {"__builtins__": {}, "contains": lambda within, item: within is not None and item in within}
    return bool(eval(" ".join(python), namespace))  # only literals, comparisons, and/or, contains


# ------------------------------------------------------------------------ tests


def test_workflow_files_are_valid() -> None:
    workflows = sorted(WORKFLOWS.glob("*.yml"))
    assert {p.name for p in workflows} == {"ci.yml", "gpu-bench.yml", "nightly.yml"}
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", *map(str, workflows)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_workflow_is_caught(tmp_path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-onn: ubuntu-latest\n    steps:\n      - run: echo\n")
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(broken)],
        capture_output=True, text=True,
    )
    assert result.returncode != 0 and "runs-on" in result.stdout


def test_the_gpu_job_runs_a_pull_request_only_from_here_or_labelled() -> None:
    assert guard_problems(load("gpu-bench.yml")) == []


@pytest.mark.parametrize("name", ["ci.yml", "gpu-bench.yml", "nightly.yml"])
def test_every_workflow_has_least_privilege_permissions(name) -> None:
    assert permission_problems(load(name)) == []


@pytest.mark.parametrize("name", ["ci.yml", "gpu-bench.yml", "nightly.yml"])
def test_only_a_push_to_main_saves_a_baseline(name) -> None:
    assert baseline_problems(load(name)) == []


def test_gpu_bench_saves_a_baseline_somewhere() -> None:
    # Else the baseline check above would pass by finding nothing to check.
    steps = load("gpu-bench.yml")["jobs"]["bench-main"]["steps"]
    assert any("bench.tools.ci main" in str(step.get("run", "")) for step in steps)


def test_the_gpu_jobs_only_call_the_ci_command() -> None:
    """The workflows hold no gate logic: each bench step is one `python -m bench.tools.ci` call."""
    runs = {name: " ".join(str(s.get("run", "")) for s in job["steps"])
            for name, job in load("gpu-bench.yml")["jobs"].items()}
    assert "bench.tools.ci pr" in runs["bench"] and "pytest" not in runs["bench"]
    assert "bench.tools.ci main" in runs["bench-main"] and "pytest" not in runs["bench-main"]
    nightly = " ".join(str(s.get("run", "")) for job in load("nightly.yml")["jobs"].values() for s in job["steps"])
    assert "bench.tools.ci nightly" in nightly and "--profile thesis" in nightly
    assert "schedule" in triggers(load("nightly.yml"))


def test_the_main_job_runs_only_on_a_push_to_main() -> None:
    guard = load("gpu-bench.yml")["jobs"]["bench-main"]["if"]
    assert evaluate(guard, EVENTS["push_main"])
    assert not any(evaluate(guard, EVENTS[e]) for e in EVENTS if e != "push_main")
    assert not evaluate(load("gpu-bench.yml")["jobs"]["bench"]["if"], EVENTS["push_main"])


def test_the_guard_check_fails_without_the_guard() -> None:
    workflow = copy.deepcopy(load("gpu-bench.yml"))
    del workflow["jobs"]["bench"]["if"]
    problems = guard_problems(workflow)
    assert any("head repository" in p for p in problems) and any(GPU_LABEL in p for p in problems)
    assert any("runs the job on fork_opened" in p for p in problems)


def test_the_guard_check_fails_on_a_label_that_stays_on() -> None:
    # "The pull request carries the label" would run a fork's pushes made after the label.
    workflow = copy.deepcopy(load("gpu-bench.yml"))
    carries = f"contains(github.event.pull_request.labels.*.name, '{GPU_LABEL}')"
    workflow["jobs"]["bench"]["if"] = f"github.event_name == 'push' || {SAME_REPO} || {carries}"
    assert "jobs.bench.if runs the job on fork_synchronize_labelled" in guard_problems(workflow)


def test_the_guard_check_needs_the_labeled_trigger() -> None:
    workflow = copy.deepcopy(load("gpu-bench.yml"))
    triggers(workflow)["pull_request"]["types"].remove("labeled")
    assert any("'labeled'" in p for p in guard_problems(workflow))


@pytest.mark.parametrize(
    "permissions", [None, "write-all", "read-all", {"contents": "write"}, {"contents": "read", "packages": "write"}]
)
def test_the_permission_check_fails_on_broad_tokens(permissions) -> None:
    workflow = copy.deepcopy(load("ci.yml"))
    workflow.pop("permissions")
    if permissions is not None:
        workflow["permissions"] = permissions
    assert permission_problems(workflow) != []


def test_the_baseline_check_fails_when_a_pull_request_can_save() -> None:
    workflow = copy.deepcopy(load("gpu-bench.yml"))
    job = workflow["jobs"]["bench-main"]
    job["if"] = "github.event_name == 'push'"  # any branch's push
    for step in job["steps"]:
        if "bench.tools.ci main" in str(step.get("run", "")):
            step["if"] = "github.event_name == 'push'"
    assert baseline_problems(workflow) != []
    for step in job["steps"]:
        step.pop("if", None)
    del job["if"]
    assert baseline_problems(workflow) != []
    # A pull request's own job storing a run is caught as well.
    storing = copy.deepcopy(load("gpu-bench.yml"))
    storing["jobs"]["bench"]["steps"][2]["run"] = "python -m bench.tools.ci main --data-repo origin"
    assert any(p.startswith("jobs.bench:") for p in baseline_problems(storing))


def test_the_evaluator_reads_github_expressions() -> None:
    event = {"github.event_name": "pull_request", "github.event.action": "labeled", "github.event.label.name": "x"}
    assert evaluate("github.event_name == 'pull_request' && (github.event.action != 'opened' || false)", event)
    assert not evaluate("github.event.label.name == 'gpu-bench'", event)
    assert not evaluate("github.event.pull_request.title == 'x'", {})  # unset: null
    labels = {"github.event.pull_request.labels.*.name": ["a"]}
    assert evaluate("contains(github.event.pull_request.labels.*.name, 'a')", labels)
    assert evaluate("${{ github.event_name == 'push' }}", EVENTS["push_main"])
    with pytest.raises(ValueError, match="does not know"):
        evaluate("!github.event.label", event)


@pytest.mark.parametrize("name", ["ci.yml", "gpu-bench.yml", "nightly.yml"])
def test_one_concurrency_group_per_workflow_and_ref_and_no_main_run_cancelled(name) -> None:
    assert concurrency_problems(load(name)) == []


@pytest.mark.parametrize("name", ["gpu-bench.yml", "nightly.yml"])
def test_every_gpu_job_sets_up_its_own_venv_and_the_runners_caches(name) -> None:
    assert runner_problems(load(name)) == []


def test_the_setup_action_keeps_a_venv_and_every_kernel_cache() -> None:
    action = yaml.safe_load((ROOT / ".github" / "actions" / "gpu-runner" / "action.yml").read_text())
    assert setup_problems(action) == []


def test_the_nightly_tier_is_dealt_over_the_runners_and_merged_into_one_stored_run() -> None:
    assert shard_problems(load("nightly.yml")) == []


def test_the_concurrency_check_fails_on_a_shared_group_and_on_cancelled_main_runs() -> None:
    workflow = copy.deepcopy(load("gpu-bench.yml"))
    workflow["jobs"]["bench"]["concurrency"] = {"group": "gpu-bench-gpu"}  # the bench job runs self-hosted
    assert any("jobs.bench.concurrency" in p for p in concurrency_problems(workflow))
    workflow = copy.deepcopy(load("gpu-bench.yml"))
    workflow["concurrency"] = {"group": "${{ github.workflow }}-${{ github.ref }}", "cancel-in-progress": True}
    problems = concurrency_problems(workflow)
    assert any("dropped by the next" in p for p in problems) and any("cancel a run of main" in p for p in problems)


def test_the_runner_check_fails_on_a_system_install_and_a_missing_setup() -> None:
    workflow = copy.deepcopy(load("gpu-bench.yml"))
    steps = workflow["jobs"]["bench"]["steps"]
    steps[:] = [step for step in steps if step.get("uses") != SETUP]
    steps.insert(1, {"name": "Install", "run": "python -m pip install -e ."})
    problems = runner_problems(workflow)
    assert "jobs.bench does not use ./.github/actions/gpu-runner" in problems
    assert "jobs.bench: step 'Install' installs with pip outside the job's venv" in problems


def test_the_shard_check_fails_without_the_merge_or_with_a_wrong_count() -> None:
    workflow = copy.deepcopy(load("nightly.yml"))
    workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"] = [1, 2, 3]
    assert any("does not run shards 1..3 of 3" in p for p in shard_problems(workflow))
    workflow = copy.deepcopy(load("nightly.yml"))
    del workflow["jobs"]["store"]
    assert any("merges its runs" in p for p in shard_problems(workflow))
