"""Metrics against scikit-learn as the oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from sklearn.metrics import accuracy_score
from sklearn.metrics import confusion_matrix as sk_confusion
from sklearn.metrics import f1_score

from model.metrics import classification_report

labels = st.integers(min_value=2, max_value=10).flatmap(
    lambda c: st.tuples(
        st.just(c),
        st.lists(st.tuples(st.integers(0, c - 1), st.integers(0, c - 1)), min_size=1, max_size=300),
    )
)


@settings(max_examples=200, deadline=None)
@given(labels)
def test_metrics_match_scikit_learn(case) -> None:
    classes, pairs = case
    y_true = [t for t, _ in pairs]
    y_pred = [p for _, p in pairs]
    report = classification_report(torch.tensor(y_true), torch.tensor(y_pred), classes)
    # Both sides compute in float64; only the order of a sum may differ.
    close = lambda expected: pytest.approx(expected, rel=1e-12)  # noqa: E731
    assert report["accuracy"] == close(accuracy_score(y_true, y_pred))
    assert report["macro_f1"] == close(f1_score(y_true, y_pred, average="macro", zero_division=0))
    assert report["weighted_f1"] == close(f1_score(y_true, y_pred, average="weighted", zero_division=0))
    assert report["confusion"] == sk_confusion(y_true, y_pred, labels=list(range(classes))).tolist()


def test_class_never_predicted_scores_zero_f1() -> None:
    y_true = torch.tensor([0, 0, 1, 1, 2])
    y_pred = torch.tensor([0, 0, 1, 1, 1])  # class 2 never predicted
    report = classification_report(y_true, y_pred, 3)
    assert report["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro", zero_division=0))
    assert report["macro_f1"] < 1


def test_accuracy_is_computed_in_double_precision() -> None:
    # 1/3 in float32 is 0.33333334; budgets and reports compare these figures.
    report = classification_report(torch.tensor([0, 1, 1]), torch.tensor([0, 0, 0]), 2)
    assert report["accuracy"] == 1 / 3
