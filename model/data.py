"""The study's dataset: CSV loader, embedded synthetic generator, split by video.

Schema (one row per video frame): ``video_name, video_frame, skill_id`` then 75
numeric features, the (x, y, confidence) of the 25 OpenPose BODY_25 joints. Labels
are encoded in sorted order of their names, so the study's ten classes are always
``BL=0, FL=1, FLAG=2, IC=3, MAL=4, NONE=5, OAFL=6, OAHS=7, PL=8, VSIT=9``.

The real CSV is not public, so `synthesize` writes frames with the same schema,
class frequencies and video grouping from a small 2-D skeleton model (see its
docstring). A user's CSV in the schema loads through `read_csv` and the same split.
"""

from __future__ import annotations

import csv
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ID_COLUMNS = ("video_name", "video_frame", "skill_id")
JOINTS = (
    "Nose", "Neck", "RShoulder", "RElbow", "RWrist", "LShoulder", "LElbow", "LWrist",
    "MidHip", "RHip", "RKnee", "RAnkle", "LHip", "LKnee", "LAnkle", "REye", "LEye",
    "REar", "LEar", "LBigToe", "LSmallToe", "LHeel", "RBigToe", "RSmallToe", "RHeel",
)
FEATURE_COLUMNS = tuple(f"{joint}_{axis}" for joint in JOINTS for axis in ("x", "y", "c"))
BACKGROUND = "NONE"  # frames before and after a skill inside a skill's video

# Frames per class in the study's 101,136-frame dataset.
STUDY_FRAMES = {
    "BL": 10236, "FL": 7561, "FLAG": 6964, "IC": 9791, "MAL": 7309,
    "NONE": 23150, "OAFL": 6389, "OAHS": 7950, "PL": 8694, "VSIT": 13092,
}
STUDY_CLASSES = tuple(sorted(STUDY_FRAMES))


class DataError(ValueError):
    """A dataset that cannot be used; the message names the file, row or column."""


@dataclass(frozen=True)
class Frames:
    """Frames on the host, as read from a CSV or generated."""

    videos: np.ndarray  # (N,) video names, str
    frame_index: np.ndarray  # (N,) int64
    labels: np.ndarray  # (N,) int64 codes into `classes`
    features: np.ndarray  # (N, 75) float32
    classes: tuple[str, ...]
    source: str

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Dataset:
    """A train/test split held as tensors on the training device."""

    x_train: torch.Tensor  # (N_train, 75) float32, standardised with train statistics
    y_train: torch.Tensor  # (N_train,) int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: tuple[str, ...]
    source: str
    train_videos: int
    test_videos: int

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def device(self) -> torch.device:
        return self.x_train.device

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "train_frames": len(self.y_train),
            "test_frames": len(self.y_test),
            "train_videos": self.train_videos,
            "test_videos": self.test_videos,
            "classes": list(self.classes),
        }


# ---------------------------------------------------------------------------- CSV


def read_csv(path: str | Path) -> Frames:
    """Read a CSV in the study's schema; any problem raises one `DataError`.

    Columns are found by name, in whatever order the file has them; the features
    come out in `FEATURE_COLUMNS` order.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a CSV file")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:  # utf-8-sig: spreadsheets often save a byte-order mark before the header
        with path.open(newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a UTF-8 text file (byte {exc.start}): is it a CSV?") from None
    rows = [row for row in rows if row]  # a trailing blank line is not a frame
    if not rows:
        raise DataError(f"{path}: the file is empty")
    header = [name.strip() for name in rows[0]]
    _check_separator(path, header)
    column = _column_positions(path, header)
    body = rows[1:]
    if not body:
        raise DataError(f"{path}: no data rows after the header")
    width = len(header)
    for line, row in enumerate(body, start=2):
        if len(row) != width:
            raise DataError(f"{path}:{line}: expected {width} fields, found {len(row)}")

    features = _parse_features(path, body, [column[name] for name in FEATURE_COLUMNS])
    frame_index = _parse_frame_index(path, body, column["video_frame"])
    names = np.array([row[column["skill_id"]].strip() for row in body])
    videos = np.array([row[column["video_name"]].strip() for row in body])
    for line, (video, name) in enumerate(zip(videos, names), start=2):
        if not video or not name:
            empty = "video_name" if not video else "skill_id"
            raise DataError(f"{path}:{line}: column {empty!r} is empty")
    classes = tuple(sorted(set(names.tolist())))
    if len(classes) < 2:
        raise DataError(f"{path}: found {len(classes)} class ({', '.join(classes)}); need at least 2")
    _check_one_skill_per_video(path, videos, names)
    labels = np.searchsorted(np.array(classes), names).astype(np.int64)
    return Frames(videos, frame_index, labels, features, classes, str(path))


def _check_separator(path: Path, header: list[str]) -> None:
    """A header that csv reads as one field is usually another dialect's separator;
    naming it beats listing all 78 columns as missing."""
    if len(header) != 1:
        return
    counts = {"semicolon": header[0].count(";"), "tab": header[0].count("\t")}
    separator = max(counts, key=counts.get)
    if counts[separator]:
        raise DataError(f"{path}: looks {separator}-separated; mlp-loadbench reads comma-separated CSV")


def _column_positions(path: Path, header: list[str]) -> dict[str, int]:
    """The 0-based position of each schema column, found by name.

    Reading by position would let a duplicated or renamed column shift the features
    silently, so every name must appear exactly once and nothing else may appear.
    """
    found: dict[str, list[int]] = {}
    for position, name in enumerate(header):
        found.setdefault(name, []).append(position)
    problems = [
        f"column {name!r} appears {_times(len(where))} (columns {_listing([p + 1 for p in where])})"
        for name, where in found.items()
        if len(where) > 1
    ]
    missing_ids = [name for name in ID_COLUMNS if name not in found]
    if missing_ids:
        problems.append(f"missing column(s) {_listing(missing_ids)}")
    missing_features = [name for name in FEATURE_COLUMNS if name not in found]
    if missing_features:
        problems.append(f"missing feature column(s) {_listing(missing_features)}")
    schema = set(ID_COLUMNS + FEATURE_COLUMNS)
    unexpected = [f"{name!r} (column {where[0] + 1})" for name, where in found.items() if name not in schema]
    if unexpected:
        problems.append(f"unexpected column(s) {_listing(unexpected)}")
    if problems:
        raise DataError(f"{path}: {'; '.join(problems)}")
    return {name: where[0] for name, where in found.items()}


def _times(count: int) -> str:
    return "twice" if count == 2 else f"{count} times"


def _listing(items: Sequence[object], limit: int = 5) -> str:
    """'a, b and c'; long lists are cut so the message stays one readable line."""
    words = [str(item) for item in items[:limit]]
    if len(items) > limit:
        return f"{', '.join(words)} and {len(items) - limit} more"
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _parse_features(path: Path, body: list[list[str]], positions: list[int]) -> np.ndarray:
    """The features in `FEATURE_COLUMNS` order, taken from their `positions` in each row."""
    pick = operator.itemgetter(*positions)
    try:
        values = np.array([pick(row) for row in body], dtype=np.float64)
    except ValueError:
        values = None
    if values is None:  # find the first cell that is not a number, to name it
        for line, row in enumerate(body, start=2):
            for column, position in zip(FEATURE_COLUMNS, positions):
                cell = row[position]
                try:
                    float(cell)
                except ValueError:
                    raise DataError(f"{path}:{line}: column {column!r}: {cell!r} is not a number") from None
    bad = ~np.isfinite(values)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        what = "NaN" if np.isnan(values[row, col]) else "infinite"
        raise DataError(f"{path}:{row + 2}: column {FEATURE_COLUMNS[col]!r}: value is {what}")
    return values.astype(np.float32)


def _parse_frame_index(path: Path, body: list[list[str]], position: int) -> np.ndarray:
    out = np.empty(len(body), dtype=np.int64)
    for i, row in enumerate(body):
        try:
            out[i] = int(float(row[position]))
        except ValueError:
            cell = row[position]
            raise DataError(f"{path}:{i + 2}: column 'video_frame': {cell!r} is not a frame number") from None
    return out


def _check_one_skill_per_video(path: Path, videos: np.ndarray, names: np.ndarray) -> None:
    """A video shows one skill; NONE frames around it are allowed in any video."""
    skill_of: dict[str, tuple[str, int]] = {}
    for line, (video, name) in enumerate(zip(videos.tolist(), names.tolist()), start=2):
        if name == BACKGROUND:
            continue
        seen = skill_of.setdefault(video, (name, line))
        if seen[0] != name:
            raise DataError(
                f"{path}:{line}: video {video!r} is labelled {name!r} here but {seen[0]!r} at line {seen[1]}; "
                "a video id may carry one skill (plus NONE frames)"
            )


def write_csv(frames: Frames, path: str | Path) -> Path:
    """Write frames in the study's schema (used by tests and to inspect the generator)."""
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(ID_COLUMNS + FEATURE_COLUMNS)
        for video, frame, label, row in zip(frames.videos, frames.frame_index, frames.labels, frames.features):
            writer.writerow([video, int(frame), frames.classes[label], *(f"{v:.4f}" for v in row)])
    return path


# ---------------------------------------------------------------------- generator

# Segment lengths as a fraction of body height, and the joint each segment hangs from.
_TORSO, _HEAD, _UPPER_ARM, _FOREARM, _THIGH, _SHIN = 0.30, 0.10, 0.17, 0.15, 0.24, 0.24
# Pose angles, degrees, 0 = up, 90 = the way the person faces, 180 = down:
# torso, head, R upper arm, R forearm, L upper arm, L forearm, R thigh, R shin, L thigh, L shin.
_STANDING = (0, 0, 175, 170, 185, 190, 178, 180, 182, 180)
_SKILL_POSES = {
    "BL": (90, 120, 340, 335, 345, 340, 268, 270, 272, 270),  # horizontal, face down, arms up behind
    "FL": (90, 65, 335, 330, 340, 335, 268, 270, 272, 270),  # horizontal, face up, arms up to the bar
    "FLAG": (85, 75, 15, 10, 165, 170, 265, 268, 275, 272),  # sideways on a pole, one arm up, one down
    "IC": (0, 0, 92, 90, 268, 270, 180, 180, 182, 180),  # upright, arms straight out to the sides
    "MAL": (92, 100, 205, 200, 210, 205, 272, 272, 274, 272),  # horizontal, low, arms wide and back
    "OAFL": (90, 70, 335, 330, 250, 255, 268, 270, 272, 270),  # front lever, free arm along the body
    "OAHS": (180, 180, 182, 180, 95, 100, 0, 5, 350, 355),  # inverted on one arm
    "PL": (88, 100, 180, 178, 182, 180, 272, 272, 274, 272),  # horizontal, arms straight down
    "VSIT": (330, 345, 200, 195, 205, 200, 45, 40, 50, 45),  # leaning back, legs raised in a V
}


def synthesize(scale: float = 1.0, seed: int = 42) -> Frames:
    """Generate the default dataset: the study's schema, class counts and video grouping.

    Each skill video is NONE frames (standing, swaying), a transition into the skill,
    the skill held with small motion, a transition out and NONE again; a tenth of the
    NONE frames come in videos of their own. Each video draws its own person size,
    position, camera roll, facing (left or right) and execution of the pose; each
    frame adds sway, joint noise, confidences and missing joints written as (0, 0, 0)
    as OpenPose does. Transition frames carry the skill's label while looking half
    like NONE, which with the look-alike skills (FL, OAFL, BL; PL, MAL) keeps the
    best accuracy well below 1. ``scale`` shrinks every class (at least 4 videos each).
    """
    if not (0 < scale <= 1):
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    rng = np.random.default_rng(seed)
    seg_lo, seg_hi = (max(4, round(n * min(1.0, 4 * scale))) for n in (60, 240))
    videos: list[tuple[str, str, int, int, int]] = []  # (name, skill, lead_in, skill_len, lead_out)
    for skill in sorted(_SKILL_POSES):
        total = max(4 * seg_lo, round(STUDY_FRAMES[skill] * scale))
        for k, length in enumerate(_partition(rng, total, seg_lo, seg_hi)):
            videos.append((f"{skill}_{k:04d}", skill, 0, length, 0))
    none_total = max(8, round(STUDY_FRAMES[BACKGROUND] * scale))
    none_only = none_total // 10
    share = rng.multinomial(none_total - none_only, np.full(len(videos), 1 / len(videos)))
    for i, n in enumerate(share):
        lead_in = int(rng.integers(0, n + 1))
        name, skill, _, length, _ = videos[i]
        videos[i] = (name, skill, lead_in, length, int(n) - lead_in)
    for k, length in enumerate(_partition(rng, none_only, seg_lo, seg_hi)):
        videos.append((f"NONE_{k:04d}", BACKGROUND, length, 0, 0))

    parts = [_video_frames(rng, *video) for video in videos]
    classes = STUDY_CLASSES
    names = np.concatenate([p[0] for p in parts])
    return Frames(
        videos=np.concatenate([np.full(len(p[0]), v[0]) for p, v in zip(parts, videos)]),
        frame_index=np.concatenate([np.arange(len(p[0])) for p in parts]),
        labels=np.searchsorted(np.array(classes), names).astype(np.int64),
        features=np.concatenate([p[1] for p in parts]).astype(np.float32),
        classes=classes,
        source=f"synthetic(scale={scale:g}, seed={seed})",
    )


def _partition(rng: np.random.Generator, total: int, lo: int, hi: int) -> list[int]:
    """Split `total` frames into video lengths drawn from [lo, hi] that sum exactly."""
    lengths: list[int] = []
    left = total
    while left > hi:
        n = int(rng.integers(lo, hi + 1))
        if left - n < lo:
            n = left - lo
        lengths.append(n)
        left -= n
    if left:
        lengths.append(left)
    return lengths


def _video_frames(
    rng: np.random.Generator, name: str, skill: str, lead_in: int, length: int, lead_out: int
) -> tuple[np.ndarray, np.ndarray]:
    n = lead_in + length + lead_out
    standing = np.array(_STANDING, dtype=np.float64)
    target = np.array(_SKILL_POSES.get(skill, _STANDING), dtype=np.float64)
    target = target + rng.normal(0, 7, size=10)  # this person's execution of the skill
    # Blend weight 0 = standing, 1 = the skill: ramps at both ends of the skill segment.
    weight = np.zeros(n)
    ramp = max(1, int(length * rng.uniform(0.08, 0.25)))
    t = np.arange(length)
    weight[lead_in : lead_in + length] = np.clip(np.minimum(t + 1, length - t) / ramp, 0, 1)
    angles = standing + weight[:, None] * _angle_delta(standing, target)
    phase = rng.uniform(0, 2 * math.pi)
    sway = np.sin(np.arange(n)[:, None] * rng.uniform(0.05, 0.3) + phase + np.arange(10))
    angles = angles + sway * rng.uniform(2, 10) * (1 - 0.6 * weight[:, None]) + rng.normal(0, 3, (n, 10))

    points = _skeleton(np.radians(angles))  # (n, 25, 2), y up, unit body height
    height = rng.uniform(220, 420)
    roll = np.radians(rng.normal(0, 6))
    rotation = np.array([[math.cos(roll), -math.sin(roll)], [math.sin(roll), math.cos(roll)]])
    points = points @ rotation.T
    if rng.random() < 0.5:  # the person faces left in this video
        points[..., 0] *= -1
    centre = np.array([rng.uniform(640, 1280), rng.uniform(380, 700)])
    drift = np.cumsum(rng.normal(0, 0.4, (n, 1, 2)), axis=0)
    noise = rng.normal(0, 0.012 * height, (n, 25, 2))
    xy = centre + drift + noise + points * np.array([height, -height])  # image y grows downwards

    confidence = np.clip(rng.normal(0.72, 0.12, (n, 25)) - 0.15 * weight[:, None], 0.05, 0.99)
    occluded = rng.random(25) < 0.08  # joints this camera rarely sees
    missing = (rng.random((n, 25)) < 0.03) | (occluded & (rng.random((n, 25)) < 0.6))
    confidence[missing] = 0.0
    xy[missing] = 0.0
    features = np.concatenate([xy, confidence[..., None]], axis=2).reshape(n, 75)
    names = np.array([BACKGROUND] * lead_in + [skill] * length + [BACKGROUND] * lead_out)
    return names, features


def _angle_delta(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    return (end - start + 180) % 360 - 180


def _skeleton(a: np.ndarray) -> np.ndarray:
    """Forward kinematics of the BODY_25 joints from the 10 pose angles (radians)."""

    def step(origin: np.ndarray, angle: np.ndarray, length: float) -> np.ndarray:
        return origin + length * np.stack([np.sin(angle), np.cos(angle)], axis=-1)

    n = a.shape[0]
    torso, head, rua, rfa, lua, lfa, rth, rsh, lth, lsh = (a[:, i] for i in range(10))
    across = torso + math.pi / 2  # shoulders and hips spread across the torso, seen at 3/4
    mid_hip = np.zeros((n, 2))
    neck = step(mid_hip, torso, _TORSO)
    nose = step(neck, head, _HEAD)
    r_shoulder, l_shoulder = step(neck, across, 0.06), step(neck, across, -0.06)
    r_elbow, l_elbow = step(r_shoulder, rua, _UPPER_ARM), step(l_shoulder, lua, _UPPER_ARM)
    r_wrist, l_wrist = step(r_elbow, rfa, _FOREARM), step(l_elbow, lfa, _FOREARM)
    r_hip, l_hip = step(mid_hip, across, 0.04), step(mid_hip, across, -0.04)
    r_knee, l_knee = step(r_hip, rth, _THIGH), step(l_hip, lth, _THIGH)
    r_ankle, l_ankle = step(r_knee, rsh, _SHIN), step(l_knee, lsh, _SHIN)
    r_eye, l_eye = step(nose, head + 0.5, 0.02), step(nose, head - 0.5, 0.02)
    r_ear, l_ear = step(nose, head + 2.3, 0.045), step(nose, head - 2.3, 0.045)
    toe = (rsh + math.pi / 2, lsh + math.pi / 2)
    joints = [
        nose, neck, r_shoulder, r_elbow, r_wrist, l_shoulder, l_elbow, l_wrist, mid_hip,
        r_hip, r_knee, r_ankle, l_hip, l_knee, l_ankle, r_eye, l_eye, r_ear, l_ear,
        step(l_ankle, toe[1], 0.06), step(l_ankle, toe[1], 0.045), step(l_ankle, toe[1] + math.pi, 0.03),
        step(r_ankle, toe[0], 0.06), step(r_ankle, toe[0], 0.045), step(r_ankle, toe[0] + math.pi, 0.03),
    ]
    return np.stack(joints, axis=1)


# -------------------------------------------------------------------------- split


def split_by_video(frames: Frames, test_size: float = 0.2, seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """Boolean train and test masks; no video on both sides.

    Group-shuffle-split semantics: the unique videos are permuted with ``seed`` and the
    first ``ceil(test_size * n_videos)`` go to test.
    """
    unique = np.unique(frames.videos)
    if len(unique) < 2:
        raise DataError(f"{frames.source}: {len(unique)} video; a split by video needs at least 2")
    order = np.random.default_rng(seed).permutation(len(unique))
    n_test = math.ceil(test_size * len(unique))
    test_videos = unique[order[:n_test]]
    test = np.isin(frames.videos, test_videos)
    train = ~test
    present = np.bincount(frames.labels[train], minlength=len(frames.classes))
    empty = [name for name, count in zip(frames.classes, present) if count == 0]
    if empty:
        raise DataError(
            f"{frames.source}: class(es) {', '.join(empty)} have no training frames after the split by "
            "video; add videos of them"
        )
    return train, test


def load_frames(source: str | Path = "synthetic", scale: float = 1.0, seed: int = 42) -> Frames:
    if str(source) == "synthetic":
        return synthesize(scale=scale, seed=seed)
    return read_csv(source)


def to_device(frames: Frames, device: str | torch.device = "cpu", seed: int = 42) -> Dataset:
    """Split, standardise with train statistics, and move to `device` once."""
    train, test = split_by_video(frames, seed=seed)
    mean = frames.features[train].mean(axis=0)
    std = frames.features[train].std(axis=0)
    std[std == 0] = 1.0
    features = (frames.features - mean) / std

    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    return Dataset(
        x_train=tensor(features[train].astype(np.float32)),
        y_train=tensor(frames.labels[train]),
        x_test=tensor(features[test].astype(np.float32)),
        y_test=tensor(frames.labels[test]),
        classes=frames.classes,
        source=frames.source,
        train_videos=len(np.unique(frames.videos[train])),
        test_videos=len(np.unique(frames.videos[test])),
    )


def load_dataset(
    source: str | Path = "synthetic", scale: float = 1.0, device: str | torch.device = "cpu", seed: int = 42
) -> Dataset:
    """The embedded default (``'synthetic'``) or a CSV path, split and on `device`."""
    return to_device(load_frames(source, scale=scale, seed=seed), device=device, seed=seed)
