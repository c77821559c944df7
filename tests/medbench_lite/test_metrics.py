import numpy as np
import pytest

from bat_gym.envs.medbench_lite import metrics


def test_dice_perfect_disjoint_and_empty():
    a = np.zeros((8, 8), bool)
    a[2:5, 2:5] = True
    b = np.zeros_like(a)
    b[5:8, 5:8] = True
    assert metrics.dice(a, a) == 1.0
    assert metrics.dice(a, b) == 0.0
    empty = np.zeros_like(a)
    assert metrics.dice(empty, empty) == 0.0  # an empty answer earns nothing by itself
    assert metrics.dice(empty, empty, empty=1.0) == 1.0  # unless the caller says so
    half = a.copy()
    half[2:5, 2] = False
    assert metrics.dice(half, a) == pytest.approx(2 * 6 / (6 + 9))
    with pytest.raises(ValueError):
        metrics.dice(a, a[:4])


def test_balanced_accuracy_is_not_fooled_by_the_majority_class():
    truth = [0, 0, 0, 0, 0, 0, 1, 1]
    assert metrics.balanced_accuracy(truth, truth) == 1.0
    assert metrics.balanced_accuracy(truth, [0] * 8) == 0.5
    assert metrics.balanced_accuracy(truth, [1 - t for t in truth]) == 0.0
    assert metrics.balanced_accuracy([], []) == 0.0


def test_map50_perfect_transposed_and_missing():
    truths = {"a": [[10, 40, 20, 50]], "b": [], "c": [[60, 5, 70, 15], [30, 30, 44, 44]]}
    perfect = [(k, box, 0.9) for k, boxes in truths.items() for box in boxes]
    assert metrics.average_precision(perfect, truths) == pytest.approx(1.0)
    transposed = [(k, [b[1], b[0], b[3], b[2]], 0.9) for k, b, _ in perfect]
    assert metrics.average_precision(transposed, truths) < 0.4
    assert metrics.average_precision([], truths) == 0.0
    # A false positive ranked above the true ones costs precision; below them it does not.
    fp_high = [("b", [0, 0, 5, 5], 0.99), *perfect]
    fp_low = [*perfect, ("b", [0, 0, 5, 5], 0.1)]
    assert metrics.average_precision(fp_low, truths) == pytest.approx(1.0)
    assert metrics.average_precision(fp_high, truths) < 1.0
    assert metrics.average_precision([], {"a": []}) == 1.0
    assert metrics.box_iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(1 / 3)


def test_ssim_identical_noisy_and_masked():
    rng = np.random.default_rng(0)
    x = np.zeros((40, 40))
    x[10:30, 10:30] = 100.0
    assert metrics.ssim(x, x, 100.0) == pytest.approx(1.0)
    noisy = x + rng.normal(0, 30, x.shape)
    assert metrics.ssim(noisy, x, 100.0) < 0.5
    mask = np.zeros_like(x, bool)
    mask[:5] = True
    assert metrics.ssim(x, x, 100.0, mask=mask) == pytest.approx(1.0)
    stack = np.stack([x, x], axis=-1)
    assert metrics.ssim(stack, stack, 100.0) == pytest.approx(1.0)


def test_normalized_mae():
    t = np.array([1.0, 2.0, 3.0])
    assert metrics.normalized_mae(t, t) == 0.0
    assert metrics.normalized_mae(t + 1, t) == pytest.approx(0.5)
    assert metrics.normalized_mae(t, np.zeros(3)) == float("inf")


@pytest.mark.parametrize(
    ("pred", "truth", "hit"),
    [
        (" Yes.", "yes", 1.0),
        ("Two", "2", 1.0),
        ("the Left", "left", 1.0),
        ("right", "left", 0.0),
        ("3", "2", 0.0),
    ],
)
def test_exact_match_normalizes(pred, truth, hit):
    assert metrics.exact_match(pred, truth) == hit


def test_finding_f1_and_size_accuracy():
    truth = [("right upper lobe", 12.0), ("left lower lobe", 20.0)]
    assert metrics.finding_f1(truth, truth) == (1.0, 1.0)
    assert metrics.finding_f1([], []) == (1.0, 1.0)
    assert metrics.finding_f1([], truth) == (0.0, 0.0)
    wrong_lobe = [("right lower lobe", 12.0), ("left upper lobe", 20.0)]
    assert metrics.finding_f1(wrong_lobe, truth) == (0.0, 0.0)
    in_voxels = [("right upper lobe", 4.0), ("left lower lobe", 6.5)]
    assert metrics.finding_f1(in_voxels, truth) == (1.0, 0.0)
    close = [("right upper lobe", 13.5), ("left lower lobe", 17.5)]  # 1.5 mm and 12.5% off
    assert metrics.finding_f1(close, truth) == (1.0, 1.0)
    extra = [*truth, ("right middle lobe", 8.0)]
    assert metrics.finding_f1(extra, truth)[0] == pytest.approx(0.8)
