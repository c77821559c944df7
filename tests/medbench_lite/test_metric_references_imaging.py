"""The imaging and report metrics against reference implementations and edge cases.

Dice is checked against scikit-learn's F1 on flattened masks, SSIM against
scikit-image's ``structural_similarity`` (uniform 7 x 7 window, sample covariance),
and the report metric's size pairing against what its docstring states.
"""

from __future__ import annotations

import numpy as np
import pytest

from bat_gym.envs.medbench_lite import metrics

skimage_metrics = pytest.importorskip("skimage.metrics")
sk_metrics = pytest.importorskip("sklearn.metrics")


def _masks(rng: np.random.Generator, shape: tuple[int, ...], p: float, q: float):
    return rng.random(shape) < p, rng.random(shape) < q


@pytest.mark.parametrize("seed", range(12))
def test_dice_is_sklearn_f1_of_the_flattened_masks(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 12, size=int(rng.integers(1, 4))))
    pred, truth = _masks(rng, shape, *rng.choice([0.0, 0.01, 0.3, 0.9, 1.0], size=2))
    ref = sk_metrics.f1_score(truth.ravel(), pred.ravel(), zero_division=0.0)
    assert metrics.dice(pred, truth) == pytest.approx(ref, abs=1e-12)


def test_dice_edge_cases():
    empty, full = np.zeros((5, 5), bool), np.ones((5, 5), bool)
    assert metrics.dice(empty, empty) == 0.0  # nothing earned by an empty answer
    assert metrics.dice(empty, empty, empty=1.0) == 1.0
    assert metrics.dice(empty, full) == 0.0 and metrics.dice(full, empty) == 0.0
    assert metrics.dice(full, full) == 1.0
    assert metrics.dice(np.full((2, 2), 7), full[:2, :2]) == 1.0  # non-zero is foreground
    with pytest.raises(ValueError, match="shapes differ"):
        metrics.dice(empty, full[:4])


def _sk_ssim(x, y, data_range, **kw):
    return skimage_metrics.structural_similarity(
        x,
        y,
        data_range=data_range,
        win_size=7,
        gaussian_weights=False,
        use_sample_covariance=True,
        **kw,
    )


@pytest.mark.parametrize("seed", range(8))
def test_ssim_equals_skimage_on_random_images(seed):
    rng = np.random.default_rng(seed)
    h, w = (int(n) for n in rng.integers(7, 40, size=2))
    x = rng.normal(0, 1, (h, w)).cumsum(axis=0) * rng.uniform(0.1, 500)
    y = x + rng.normal(0, rng.uniform(0.01, 3) * x.std(), x.shape)
    data_range = float(max(np.ptp(x), 1e-3))
    assert metrics.ssim(x, y, data_range) == pytest.approx(_sk_ssim(x, y, data_range), abs=1e-10)


def test_ssim_edge_cases_match_skimage():
    rng = np.random.default_rng(0)
    flat = np.full((12, 12), 5.0)
    noisy = flat + rng.normal(0, 1, flat.shape)
    for x, y in ((flat, flat), (flat, noisy), (noisy, -noisy), (flat, flat + 100.0)):
        assert metrics.ssim(x, y, 10.0) == pytest.approx(_sk_ssim(x, y, 10.0), abs=1e-10)
    # The smallest image with an interior: 7 x 7, one window, one pixel.
    a, b = rng.normal(size=(7, 7)), rng.normal(size=(7, 7))
    assert metrics.ssim(a, b, 4.0) == pytest.approx(_sk_ssim(a, b, 4.0), abs=1e-10)


def test_ssim_of_a_stack_is_the_mean_over_its_slices_and_a_mask_selects_interior_pixels():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 24, 3))
    y = x + rng.normal(0, 0.5, x.shape)
    per_slice = [_sk_ssim(x[..., k], y[..., k], 6.0) for k in range(3)]
    assert metrics.ssim(x, y, 6.0) == pytest.approx(np.mean(per_slice), abs=1e-10)
    mask = rng.random(x.shape[:2]) < 0.5
    _, full = skimage_metrics.structural_similarity(
        x[..., 0], y[..., 0], data_range=6.0, win_size=7, full=True
    )
    keep = mask & metrics.interior(mask.shape)
    assert metrics.ssim(x[..., 0], y[..., 0], 6.0, mask=mask) == pytest.approx(
        full[keep].mean(), abs=1e-10
    )
    border_only = ~metrics.interior(mask.shape)
    assert metrics.ssim(x[..., 0], y[..., 0], 6.0, mask=border_only) == 0.0


def test_ssim_of_non_finite_input_is_nan_and_bad_ranges_raise():
    x = np.zeros((10, 10))
    y = x.copy()
    y[5, 5] = np.inf
    assert np.isnan(metrics.ssim(x, y, 1.0))
    with pytest.raises(ValueError, match="data_range"):
        metrics.ssim(x, x, 0.0)
    with pytest.raises(ValueError, match="data_range"):
        metrics.ssim(x, x, float("nan"))


def test_report_sizes_pair_closest_first():
    truth = [("right upper lobe", 10.0), ("right upper lobe", 14.0)]
    # In true-size order 10 mm would take 13 mm (3 mm off: wrong) and 14 mm the 30 mm;
    # closest first pairs 14 with 13 (right) and 10 with 30.
    pred = [("right upper lobe", 13.0), ("right upper lobe", 30.0)]
    assert metrics.finding_f1(pred, truth) == (1.0, 0.5)
    assert metrics.finding_f1(list(reversed(pred)), truth) == (1.0, 0.5)


@pytest.mark.parametrize("seed", range(20))
def test_report_pairing_matches_a_brute_force_closest_first(seed):
    rng = np.random.default_rng(seed)
    locs = ("a", "b")
    truth = [(str(rng.choice(locs)), float(rng.uniform(5, 30))) for _ in range(rng.integers(0, 5))]
    pred = [(str(rng.choice(locs)), float(rng.uniform(5, 30))) for _ in range(rng.integers(0, 5))]
    tp = sized = 0
    for loc in locs:
        ts = [s for lo, s in truth if lo == loc]
        ps = [s for lo, s in pred if lo == loc]
        while ts and ps:
            d, i, j = min((abs(p - t), i, j) for i, t in enumerate(ts) for j, p in enumerate(ps))
            tp += 1
            sized += d <= max(2.0, 0.15 * ts[i])
            ts.pop(i)
            ps.pop(j)
    if not truth and not pred:
        want = (1.0, 1.0)
    else:
        want = (2 * tp / (len(pred) + len(truth)), sized / len(truth) if truth else 1.0)
    assert metrics.finding_f1(pred, truth) == pytest.approx(want)


def test_report_sizes_that_are_not_finite_score_and_never_count_as_right():
    truth = [("right upper lobe", 10.0)]
    for bad in (float("inf"), float("nan"), 1e308):
        assert metrics.finding_f1([("right upper lobe", bad)], truth) == (1.0, 0.0)
