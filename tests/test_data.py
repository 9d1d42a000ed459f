"""The dataset: generator, CSV loader errors, split by video."""

from __future__ import annotations

import csv
from dataclasses import replace

import numpy as np
import pytest
import torch

from model.data import FEATURE_COLUMNS
from model.data import ID_COLUMNS
from model.data import STUDY_CLASSES
from model.data import STUDY_FRAMES
from model.data import DataError
from model.data import load_dataset
from model.data import read_csv
from model.data import split_by_video
from model.data import synthesize
from model.data import to_device
from model.data import write_csv


@pytest.fixture(scope="module")
def full():
    return synthesize()


@pytest.fixture(scope="module")
def small():
    return synthesize(scale=0.02)


def test_full_size_and_class_shares_match_the_study(full) -> None:
    assert len(full) == sum(STUDY_FRAMES.values()) == 101_136
    counts = np.bincount(full.labels, minlength=10)
    for name, count in zip(full.classes, counts):
        share, study = count / len(full), STUDY_FRAMES[name] / 101_136
        assert abs(share - study) < 0.01, name


def test_labels_are_encoded_in_sorted_order(full) -> None:
    assert full.classes == STUDY_CLASSES == tuple(sorted(STUDY_FRAMES))
    assert STUDY_CLASSES.index("NONE") == 5


def test_videos_hold_one_skill_with_none_around_it(full) -> None:
    none = STUDY_CLASSES.index("NONE")
    for video in np.unique(full.videos)[:50]:
        labels = set(full.labels[full.videos == video].tolist()) - {none}
        assert len(labels) <= 1


def test_missing_joints_are_written_as_zeros(full) -> None:
    xyc = full.features.reshape(len(full), 25, 3)
    missing = xyc[..., 2] == 0
    assert missing.mean() > 0.01
    assert np.all(xyc[missing][:, :2] == 0)


def test_generator_is_deterministic_and_seeded(small) -> None:
    again = synthesize(scale=0.02)
    assert np.array_equal(small.features, again.features)
    assert not np.array_equal(small.features, synthesize(scale=0.02, seed=7).features)


def test_split_is_by_video_and_about_80_20(full) -> None:
    train, test = split_by_video(full)
    assert not set(full.videos[train]) & set(full.videos[test])
    assert 0.7 < train.mean() < 0.9


def test_dataset_is_standardised_on_train_statistics(small) -> None:
    data = load_dataset("synthetic", scale=0.02)
    assert data.x_train.shape[1] == 75 and data.n_classes == 10
    assert abs(float(data.x_train.mean())) < 1e-3


def test_test_frames_do_not_move_the_standardisation(small) -> None:
    train, test = split_by_video(small)
    planted = small.features.copy()
    planted[np.flatnonzero(test)[0]] = 1e6  # one extreme test frame
    data = to_device(small)
    leaked = to_device(replace(small, features=planted))
    assert np.array_equal(leaked.x_train.numpy(), data.x_train.numpy())
    # The training features are standardised on their own statistics.
    x = data.x_train.numpy().astype(np.float64)
    varying = small.features[train].std(axis=0) > 0
    assert np.allclose(x.mean(axis=0), 0.0, atol=1e-4)
    assert np.allclose(x.std(axis=0)[varying], 1.0, atol=1e-3)
    mean, std = small.features[train].mean(axis=0), small.features[train].std(axis=0)
    expected = (small.features[test] - mean) / np.where(varying, std, 1.0)
    assert np.allclose(data.x_test.numpy(), expected, atol=1e-4)


def test_the_split_follows_its_seed(small) -> None:
    same = [split_by_video(small, seed=3) for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*same))
    tests = {seed: split_by_video(small, seed=seed)[1] for seed in (1, 2, 3)}
    assert not np.array_equal(tests[1], tests[2]) and not np.array_equal(tests[2], tests[3])
    # The dataset is split with the seed it is given.
    assert len(to_device(small, seed=1).y_test) == int(tests[1].sum())
    assert not torch.equal(to_device(small, seed=1).x_train[:50], to_device(small, seed=2).x_train[:50])


def test_csv_round_trip_loads_the_same_frames(small, tmp_path) -> None:
    frames = read_csv(write_csv(small, tmp_path / "frames.csv"))
    assert frames.classes == small.classes
    assert np.array_equal(frames.labels, small.labels)
    assert np.allclose(frames.features, small.features, atol=1e-3)


# ------------------------------------------------------------------- bad input

HEADER = ",".join(ID_COLUMNS + FEATURE_COLUMNS)


def _row(video: str = "v1", frame: str = "0", skill: str = "FL", value: str = "1.0") -> str:
    return ",".join([video, frame, skill] + [value] * 75)


def _write(tmp_path, *lines: str) -> str:
    path = tmp_path / "data.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ((), "the file is empty"),
        ((HEADER,), "no data rows"),
        ((HEADER.replace("video_name,", ""), _row()), "data.csv: missing column(s) video_name"),
        ((HEADER.replace(",Nose_x", ""), _row()[:-4]), "data.csv: missing feature column(s) Nose_x"),
        ((HEADER + ",extra", _row() + ",1"), "data.csv: unexpected column(s) 'extra' (column 79)"),
        ((HEADER.replace("RHeel_c", "Nose_x"), _row()),
         "data.csv: column 'Nose_x' appears twice (columns 4 and 78); missing feature column(s) RHeel_c"),
        ((HEADER.replace("video_frame", "skill_id"), _row()),
         "column 'skill_id' appears twice (columns 2 and 3); missing column(s) video_frame"),
        ((HEADER.replace(",", ";"), _row().replace(",", ";")),
         "data.csv: looks semicolon-separated; mlp-loadbench reads comma-separated CSV"),
        ((HEADER.replace(",", "\t"), _row().replace(",", "\t")),
         "data.csv: looks tab-separated; mlp-loadbench reads comma-separated CSV"),
        ((HEADER, _row(), _row()[:-4]), "data.csv:3: expected 78 fields, found 77"),
        ((HEADER, _row(), _row(value="abc")), "data.csv:3: column 'Nose_x': 'abc' is not a number"),
        ((HEADER, _row(value="nan")), "data.csv:2: column 'Nose_x': value is NaN"),
        ((HEADER, _row(value="inf")), "data.csv:2: column 'Nose_x': value is infinite"),
        ((HEADER, _row(frame="x")), "data.csv:2: column 'video_frame': 'x' is not a frame number"),
        ((HEADER, _row(), _row(frame="1")), "found 1 class (FL); need at least 2"),
        ((HEADER, _row(), _row(skill="PL")), "video 'v1' is labelled 'PL' here but 'FL' at line 2"),
        ((HEADER, _row(skill="")), "column 'skill_id' is empty"),
    ],
    ids=["empty", "header-only", "missing-column", "too-few-features", "extra-column", "duplicated-feature",
         "duplicated-id", "semicolon-separated", "tab-separated", "short-row",
         "non-numeric", "nan", "inf", "bad-frame", "one-class", "video-two-skills", "empty-label"],
)
def test_bad_csv_gives_one_clear_error(tmp_path, lines, message) -> None:
    with pytest.raises(DataError) as error:
        read_csv(_write(tmp_path, *lines))
    assert message in str(error.value)
    assert "data.csv" in str(error.value)


def test_missing_file_is_named(tmp_path) -> None:
    with pytest.raises(DataError, match="nope.csv: no such file"):
        read_csv(tmp_path / "nope.csv")


def test_directory_is_not_mistaken_for_a_missing_file(tmp_path) -> None:
    with pytest.raises(DataError) as error:
        read_csv(tmp_path)
    assert str(error.value) == f"{tmp_path}: is a directory, not a CSV file"


def test_a_bad_header_gives_one_line(tmp_path) -> None:
    # A header-less file: every schema name is missing and '1.0' repeats 75 times.
    with pytest.raises(DataError) as error:
        read_csv(_write(tmp_path, _row(), _row(frame="1")))
    message = str(error.value)
    assert "\n" not in message and len(message) < 400
    assert "column '1.0' appears 75 times (columns 4, 5, 6, 7, 8 and 70 more)" in message


def test_columns_are_read_by_name_in_any_order(small, tmp_path) -> None:
    canonical = write_csv(small, tmp_path / "canonical.csv")
    with canonical.open(newline="") as handle:
        rows = list(csv.reader(handle))
    order = np.random.default_rng(0).permutation(len(rows[0]))
    assert list(order[:3]) != [0, 1, 2]  # the id columns move too
    shuffled = tmp_path / "shuffled.csv"
    with shuffled.open("w", newline="") as handle:
        csv.writer(handle).writerows([row[i] for i in order] for row in rows)

    expected, frames = read_csv(canonical), read_csv(shuffled)
    assert frames.classes == expected.classes
    for field in ("videos", "frame_index", "labels", "features"):
        assert np.array_equal(getattr(frames, field), getattr(expected, field)), field


def test_class_without_training_frames_is_reported(tmp_path) -> None:
    # PL lives in one video of 21: some seeds send it to the test side.
    lines = [HEADER] + [_row(video=f"v{i}", skill="FL") for i in range(10)]
    lines += [_row(video=f"w{i}", skill="NONE") for i in range(10)]
    path = _write(tmp_path, *lines, _row(video="p0", skill="PL"))
    frames = read_csv(path)
    seed = next(s for s in range(100) if "p0" in frames.videos[~_train_mask(frames, s)])
    with pytest.raises(DataError, match="class\\(es\\) PL have no training frames"):
        load_dataset(path, seed=seed)


def _train_mask(frames, seed: int) -> np.ndarray:
    unique = np.unique(frames.videos)
    order = np.random.default_rng(seed).permutation(len(unique))
    return ~np.isin(frames.videos, unique[order[: int(np.ceil(0.2 * len(unique)))]])


def test_none_frames_may_share_a_video_with_a_skill(tmp_path) -> None:
    frames = read_csv(_write(tmp_path, HEADER, _row(skill="NONE"), _row(frame="1"), _row(frame="2", skill="NONE")))
    assert frames.classes == ("FL", "NONE")


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path) -> None:
    frames = synthesize(scale=0.02)
    plain = write_csv(frames, tmp_path / "plain.csv")
    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert (read_csv(marked).features == read_csv(plain).features).all()


def test_a_binary_file_is_one_clear_error(tmp_path) -> None:
    binary = tmp_path / "frames.csv"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(DataError, match="frames.csv: not a UTF-8 text file"):
        read_csv(binary)
