"""Classification metrics over the whole test set, computed on the tensors' device.

The study computed F1 on its last test batch only; these use every test frame.
Macro and weighted F1 follow scikit-learn's defaults: classes that appear in
neither the labels nor the predictions are left out, and a class with no
predicted or no true frames scores 0.
"""

from __future__ import annotations

import torch


def confusion_matrix(y_true: torch.Tensor, y_pred: torch.Tensor, n_classes: int) -> torch.Tensor:
    """(C, C) int64 counts; rows are true classes, columns predicted."""
    flat = y_true.long() * n_classes + y_pred.long()
    return torch.bincount(flat, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def accuracy(cm: torch.Tensor) -> float:
    # Divide as Python floats: integer tensors divide in float32, off in the 8th digit.
    total = int(cm.sum())
    return int(cm.diagonal().sum()) / total if total else 0.0


def f1_per_class(cm: torch.Tensor) -> torch.Tensor:
    tp = cm.diagonal().double()
    denominator = cm.sum(0).double() + cm.sum(1).double()  # 2 TP + FP + FN
    return torch.where(denominator > 0, 2 * tp / denominator.clamp(min=1), torch.zeros_like(tp))


def macro_f1(cm: torch.Tensor) -> float:
    present = (cm.sum(0) + cm.sum(1)) > 0
    return float(f1_per_class(cm)[present].mean()) if present.any() else 0.0


def weighted_f1(cm: torch.Tensor) -> float:
    support = cm.sum(1).double()
    return float((f1_per_class(cm) * support).sum() / support.sum()) if support.sum() else 0.0


def classification_report(y_true: torch.Tensor, y_pred: torch.Tensor, n_classes: int) -> dict[str, object]:
    cm = confusion_matrix(y_true, y_pred, n_classes)
    return {
        "accuracy": accuracy(cm),
        "macro_f1": macro_f1(cm),
        "weighted_f1": weighted_f1(cm),
        "confusion": cm.cpu().tolist(),
    }
