"""The Optuna study: storage, identity, the hand-picked variants as first trials, the
trial objective, progress and resume.

Resume is Optuna's own: the study lives in an RDB storage (SQLite by default) and is
opened with `load_if_exists=True`; `--trials N` is the number of trials the study
should hold with an answer (complete, pruned as unsupported, or failed with a reason),
so a rerun of the same command runs only the rest. A trial cut short (Ctrl-C, a killed
process) is no answer and is run again; a killed process's trial is marked failed by
Optuna's heartbeat once its grace period passes.

A study records what makes its trials comparable (profile, dataset, GPU model,
objectives, accuracy-drop limit, space, base configuration); resuming it with other
settings is refused with the differences named, since its front would mix
measurements that cannot be ranked together.
"""

from __future__ import annotations

import json
import random
import time
import warnings
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from bench.search.objective import Evaluator
from bench.search.objective import MissingMeasurement
from bench.search.objective import Objective
from bench.search.objective import p99_latency
from bench.search.objective import values
from bench.search.space import Space
from bench.search.space import compression_label
from bench.search.space import preset_params
from bench.search.space import random_point
from bench.search.space import suggest
from model.compress import Compression
from model.compress import Unsupported
from model.config import TrainConfig

IDENTITY_KEY = "mlp-loadbench"  # study user attribute: what the trials were measured under
REFERENCE_KEY = "reference_accuracy"  # with --train-space: the base configuration's fp32 accuracy
CONSTRAINT = "accuracy_drop"  # Trial.set_constraint key: drop minus the limit, feasible at <= 0
HEARTBEAT_S = 30  # a trial's process proves it is alive this often ...
GRACE_S = 120  # ... and its trial is failed this long after the last proof
EXPLORE_DRAWS = 200  # random points tried for one no trial holds, after a repeat
MAX_FAILURES_IN_A_ROW = 3  # then the search stops: a broken evaluator would fail every trial
RECORD_KEYS = ("latency_graph_s", "latency_eager_s", "throughput", "energy_j_per_1k", "accuracy", "macro_f1",
               "accuracy_drop", "speedup", "notes", "unavailable")
SAMPLERS = ("tpe", "nsga2")


class SearchError(Exception):
    """The search cannot start or go on; the message says why and what to change."""


@dataclass(frozen=True)
class SearchSettings:
    study_name: str
    storage: str
    trials: int  # trials with an answer the study should hold
    objectives: tuple[Objective, ...]
    objectives_note: str | None  # why the second objective is not energy, where it is not
    max_accuracy_drop: float = 0.01
    train_space: bool = False
    space: Space = field(default_factory=Space)
    base: TrainConfig = field(default_factory=TrainConfig)
    timeout: float | None = None
    sampler: str = "tpe"
    seed: int = 0
    context: Mapping[str, Any] = field(default_factory=dict)  # profile, dataset, gpu, impl

    def identity(self) -> dict[str, Any]:
        """JSON-able: what a resumed study must share with this run."""
        return json.loads(json.dumps({
            **self.context,
            "objectives": [o.key for o in self.objectives],
            "max_accuracy_drop": self.max_accuracy_drop,
            "train_space": self.train_space,
            "space": self.space.as_dict(),
            "base_config": self.base.as_dict(),
        }))


@dataclass
class Outcome:
    study: optuna.Study
    ran: int = 0  # trials this process ran
    interrupted: bool = False
    stopped: str | None = None  # why the search stopped early, where it did
    skipped_presets: dict[str, str] = field(default_factory=dict)  # preset -> why it is not in the study


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Optuna's RDB storage with a heartbeat, so a killed worker's trial is failed, not
    left running; any SQLAlchemy URL Optuna accepts (sqlite:///, postgresql://, mysql://)."""
    if "://" not in url:
        raise SearchError(f"--storage {url}: not a database URL; use e.g. sqlite:///search.db or "
                          "postgresql://user@host/db")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
    except Exception as exc:  # SQLAlchemy's errors, a missing driver, an unreachable server
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SearchError(f"--storage {url}: cannot open the database: {reason}") from None


def make_sampler(settings: SearchSettings) -> optuna.samplers.BaseSampler:
    """TPE by default: with the presets first and ten random trials after them it models
    the rest, where NSGA-II's first generation alone would be most of a 50-trial budget.
    constant_liar keeps workers sharing one study from proposing the same point."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if settings.sampler == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=settings.seed, population_size=16)
        return optuna.samplers.TPESampler(seed=settings.seed, multivariate=True, group=True, constant_liar=True)


def open_study(settings: SearchSettings) -> optuna.Study:
    """Create the study, or load it and check it was made under the same settings."""
    storage = open_storage(settings.storage)
    study = optuna.create_study(
        study_name=settings.study_name,
        storage=storage,
        sampler=make_sampler(settings),
        directions=["minimize"] * len(settings.objectives),
        load_if_exists=True,
    )
    mine = settings.identity()
    theirs = study.user_attrs.get(IDENTITY_KEY)
    if theirs is None:
        if study.trials:
            raise SearchError(f"study {settings.study_name!r} in {settings.storage} holds trials but was not made "
                              "by python -m bench.search; choose another --study-name")
        study.set_user_attr(IDENTITY_KEY, mine)
    elif theirs != mine:
        raise SearchError(f"study {settings.study_name!r} in {settings.storage} was made under other settings "
                          f"({identity_diff(theirs, mine)}); its trials could not be ranked with this run's. "
                          "Rerun with its settings, or choose another --study-name")
    return study


def identity_diff(theirs: Mapping[str, Any], mine: Mapping[str, Any]) -> str:
    keys = sorted(set(theirs) | set(mine))
    return "; ".join(f"{k}: study {theirs.get(k)!r}, now {mine.get(k)!r}" for k in keys if theirs.get(k) != mine.get(k))


def answered(trial: FrozenTrial) -> bool:
    """A trial that gave an answer: measured, pruned as unsupported, or failed with a reason.
    An interrupted or killed trial did not, and is run again."""
    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return trial.state == TrialState.FAIL and "reason" in trial.user_attrs


def enqueue_presets(study: optuna.Study, settings: SearchSettings,
                    presets: Mapping[str, Compression]) -> dict[str, str]:
    """Each hand-picked variant as a trial (first in a new study; never twice), tagged
    with its name so the results can compare the front with it. Returns the presets
    left out and why (outside the space)."""
    skipped = {}
    trials = study.get_trials(deepcopy=False)
    for name, compression in presets.items():
        params = preset_params(compression, settings.space, settings.base, settings.train_space)
        if isinstance(params, str):
            skipped[name] = params
            continue
        # Optuna's skip_if_exists would also skip a preset whose trial a Ctrl-C or a kill cut
        # short, and it would never be measured: queue it again unless it answered or waits.
        mine = [t for t in trials if t.user_attrs.get("preset") == name]
        if any(answered(t) or t.state == TrialState.WAITING for t in mine):
            continue
        study.enqueue_trial(params, user_attrs={"preset": name})
    return skipped


def reference_accuracy(study: optuna.Study, settings: SearchSettings, evaluate: Evaluator,
                       log: Callable[[str], None]) -> float | None:
    """With --train-space, the fp32 accuracy of the base configuration, measured once per
    study: a trial's accuracy drop is taken against it, so a smaller network that is
    less accurate does not pass the limit by being compared with itself."""
    if not settings.train_space:
        return None
    if REFERENCE_KEY not in study.user_attrs:
        log("search: measuring the reference (base configuration, fp32) for the accuracy-drop limit")
        record = evaluate(settings.base, Compression())
        study.set_user_attr(REFERENCE_KEY, float(record["accuracy"]))
    return float(study.user_attrs[REFERENCE_KEY])


def make_objective(settings: SearchSettings, evaluate: Evaluator,
                   reference: float | None) -> Callable[[optuna.Trial], tuple[float, ...]]:
    def objective(trial: optuna.Trial) -> tuple[float, ...]:
        setting = suggest(trial, settings.space, settings.base, settings.train_space)
        trial.set_user_attr("label", trial_label(setting.config, setting.compression, settings))
        trial.set_user_attr("compression", setting.compression.as_dict())
        if settings.train_space:
            trial.set_user_attr("config", {k: getattr(setting.config, k) for k in settings.space.train})
        earlier = repeat_of(trial)
        if earlier is not None:
            if explore_next(trial.study, settings, trial.number) is not None:
                trial.set_user_attr("queued_random", True)
            return repeat(trial, earlier)
        try:
            record = evaluate(setting.config, setting.compression)
            measured = values(record, settings.objectives)
        except Unsupported as exc:
            trial.set_user_attr("reason", f"unsupported: {exc}")
            raise optuna.TrialPruned(f"unsupported: {exc}") from None
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            raise
        except MissingMeasurement as exc:
            trial.set_user_attr("reason", str(exc))
            raise
        except Exception as exc:
            trial.set_user_attr("reason", f"{type(exc).__name__}: {exc}")
            raise
        drop = reference - float(record["accuracy"]) if reference is not None else float(record["accuracy_drop"])
        trial.set_user_attr("record", jsonable({k: record.get(k) for k in RECORD_KEYS}))
        trial.set_user_attr("latency_kind", p99_latency(record)[1])
        trial.set_user_attr("drop", drop)
        trial.set_constraint(CONSTRAINT, drop - settings.max_accuracy_drop)
        return tuple(measured[o.key] for o in settings.objectives)

    return objective


def repeat_of(trial: optuna.Trial) -> FrozenTrial | None:
    """An earlier trial with the same parameters that gave an answer. A sampler proposes
    a discrete point again once it looks best; measuring it again would spend the
    budget on a point the front already holds."""
    for other in trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if (other.number != trial.number and same_point(other.params, trial.params)
                and "repeat_of" not in other.user_attrs):
            return other
    return None


def explore_next(study: optuna.Study, settings: SearchSettings, number: int) -> dict[str, Any] | None:
    """Queue a point no trial holds, drawn at random, as the next trial, where trial
    `number` repeated one. TPE returns to the front's points once it has modelled them:
    in a 50-trial search on an H100, 31 trials repeated one and 19 settings were
    measured. Optuna has no sampler option that avoids measured points, so the search
    queues one itself (seeded by the repeating trial's number: a rerun draws the same)."""
    taken = [t.params for t in study.get_trials(deepcopy=False) if t.state != TrialState.FAIL]
    rng = random.Random(settings.seed * 1_000_003 + number)
    for _ in range(EXPLORE_DRAWS):
        params = random_point(rng, settings.space, settings.train_space)
        if not any(same_point(params, other) for other in taken):
            study.enqueue_trial(params, user_attrs={"explored": True})
            return params
    return None  # the space is (nearly) all measured


def same_point(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal parameters, floats to 9 places: a queued 0.3 + 7 * 0.05 and the sampler's
    0.65 are one point."""
    if a.keys() != b.keys():
        return False
    return all(round(a[k], 9) == round(b[k], 9) if isinstance(a[k], float) else a[k] == b[k] for k in a)


def repeat(trial: optuna.Trial, earlier: FrozenTrial) -> tuple[float, ...]:
    """The earlier trial's answer, marked as a repeat of it (the results list it once)."""
    trial.set_user_attr("repeat_of", earlier.number)
    for key in ("record", "latency_kind", "drop", "reason"):
        if key in earlier.user_attrs:
            trial.set_user_attr(key, earlier.user_attrs[key])
    if earlier.state == TrialState.PRUNED:
        raise optuna.TrialPruned(earlier.user_attrs.get("reason", "pruned"))
    for key, value in earlier.system_attrs.items():
        if key.startswith("constraints:"):
            trial.set_constraint(key.split(":", 1)[1], value)
    return tuple(earlier.values)


def trial_label(config: TrainConfig, compression: Compression, settings: SearchSettings) -> str:
    label = compression_label(compression)
    if not settings.train_space:
        return label
    short = {"depth": "d", "width": "w", "batch_size": "b", "activation": "", "optimizer": ""}
    parts = [f"{short[k]}{getattr(config, k)}" for k in settings.space.train]
    return f"{' '.join(parts)} {label}"


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class Progress:
    """One line per finished trial: what was tried, what it measured or why not, and how
    far the study is; stops the study once it holds `trials` answers (several workers
    sharing one study stop together) or after failures in a row."""

    def __init__(self, settings: SearchSettings, log: Callable[[str], None]) -> None:
        self.settings = settings
        self.log = log
        self.failures_in_a_row = 0
        self.stopped: str | None = None
        self.ran = 0

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.ran += 1
        trials = study.get_trials(deepcopy=False)
        done = sum(answered(t) for t in trials)
        label = trial.user_attrs.get("label", "?")
        preset = trial.user_attrs.get("preset")
        head = (f"search: trial {trial.number} [{done}/{self.settings.trials}] {label}"
                + (f" (preset {preset})" if preset else ""))
        if "repeat_of" in trial.user_attrs:
            head += f" (repeat of trial {trial.user_attrs['repeat_of']}, not measured again"
            head += "; a point drawn at random is queued)" if trial.user_attrs.get("queued_random") else ")"
        elif trial.user_attrs.get("explored"):
            head += " (drawn at random after a repeat)"
        seconds = ((trial.datetime_complete - trial.datetime_start).total_seconds()
                   if trial.datetime_complete and trial.datetime_start else 0.0)
        if trial.state == TrialState.COMPLETE:
            self.failures_in_a_row = 0
            shown = ", ".join(f"{o.key.split('_')[0]} {v * o.scale:.4g} {o.unit}"
                              for o, v in zip(self.settings.objectives, trial.values))
            drop = trial.user_attrs.get("drop", float("nan"))
            verdict = ("feasible" if drop <= self.settings.max_accuracy_drop
                       else f"INFEASIBLE (limit {self.settings.max_accuracy_drop:g})")
            kind = trial.user_attrs.get("latency_kind", "?")
            accuracy = (trial.user_attrs.get("record") or {}).get("accuracy")
            acc = f"accuracy {accuracy:.4f}, " if isinstance(accuracy, (int, float)) else ""
            front = sum("repeat_of" not in t.user_attrs for t in study.best_trials)  # a repeat is one point
            self.log(f"{head}: {shown} [{kind}], {acc}drop {drop:+.4f} {verdict}; {seconds:.1f} s; front {front}")
        elif trial.state == TrialState.PRUNED:
            self.failures_in_a_row = 0
            self.log(f"{head}: pruned: {trial.user_attrs.get('reason', 'pruned')}; {seconds:.1f} s")
        elif trial.state == TrialState.FAIL:
            reason = trial.user_attrs.get("reason", "interrupted")
            self.log(f"{head}: FAILED: {reason}; {seconds:.1f} s")
            self.failures_in_a_row += 1
            if self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
                self.stopped = f"{self.failures_in_a_row} trials failed in a row, the last with: {reason}"
                study.stop()
        if done >= self.settings.trials:
            study.stop()


def run_search(
    settings: SearchSettings,
    evaluate: Evaluator,
    presets: Mapping[str, Compression],
    log: Callable[[str], None] = print,
) -> Outcome:
    """Open or resume the study, put the presets first, run the trials it still needs."""
    # Our progress line replaces Optuna's, which would also print a Ctrl-C's traceback.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = open_study(settings)
    outcome = Outcome(study)
    outcome.skipped_presets = enqueue_presets(study, settings, presets)
    for name, why in outcome.skipped_presets.items():
        log(f"search: preset {name} is not evaluated: {why}")
    done = sum(answered(t) for t in study.trials)
    remaining = max(0, settings.trials - done)
    note = f" ({settings.objectives_note})" if settings.objectives_note else ""
    log(f"search: study {settings.study_name!r} in {settings.storage}: {done} trial(s) done, {remaining} to run; "
        f"minimising {' and '.join(o.label for o in settings.objectives)}{note}; "
        f"accuracy drop at most {settings.max_accuracy_drop:g}")
    if remaining == 0:
        return outcome
    progress = Progress(settings, log)
    started = time.monotonic()
    try:
        reference = reference_accuracy(study, settings, evaluate, log)
        study.optimize(make_objective(settings, evaluate, reference), n_trials=remaining, timeout=settings.timeout,
                       catch=(Exception,), callbacks=[progress])
    except KeyboardInterrupt:
        outcome.interrupted = True
    outcome.ran = progress.ran
    outcome.stopped = progress.stopped
    if settings.timeout is not None and not outcome.interrupted and time.monotonic() - started >= settings.timeout:
        outcome.stopped = outcome.stopped or f"--timeout {settings.timeout:g} s reached"
    return outcome
