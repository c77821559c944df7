"""The classification, detection and VQA metrics against reference implementations.

Balanced accuracy against scikit-learn's ``balanced_accuracy_score``; AP@0.5 against
pycocotools' ``COCOeval`` (one category, one IoU threshold, area "all", 100 boxes per
image), on random and edge-case inputs; the scorers on hostile cells (``inf``,
``1e400``, ``nan``) give a score, never an exception.
"""

import contextlib
import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bat_gym.envs.medbench_lite import metrics
from bat_gym.envs.medbench_lite.tracks import get_track

sk_metrics = pytest.importorskip("sklearn.metrics")


# -- balanced accuracy ---------------------------------------------------------------------


# The -1 predictions are a class the truth never holds, on purpose: scikit-learn warns
# of it once a call, and scores it as we do (recall over the truth's classes).
@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true:UserWarning")
@pytest.mark.parametrize("seed", range(20))
def test_balanced_accuracy_equals_sklearn_on_random_labels(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    truth = rng.integers(0, 2, n)
    pred = rng.choice([0, 1, -1], n)  # -1: what the scorer makes of an unusable label
    assert metrics.balanced_accuracy(list(truth), list(pred)) == pytest.approx(
        sk_metrics.balanced_accuracy_score(truth, pred), abs=1e-12
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "truth, pred",
    [([1, 1, 1], [1, 1, 1]), ([1, 1, 1], [0, 0, 0]), ([0, 1], [1, 0]), ([0, 0, 1], [0, 0, 0])],
)
def test_balanced_accuracy_equals_sklearn_on_edge_cases(truth, pred):
    assert metrics.balanced_accuracy(truth, pred) == pytest.approx(
        sk_metrics.balanced_accuracy_score(truth, pred), abs=1e-12
    )


def test_balanced_accuracy_never_rewards_empty_or_unusable_labels():
    assert metrics.balanced_accuracy([], []) == 0.0
    assert metrics.balanced_accuracy([0, 1, 1], [-1, -1, -1]) == 0.0


_HOSTILE = st.sampled_from(["inf", "-inf", "1e400", "-1e400", "nan", "NaN", "1e308", "", "x"])


@settings(max_examples=60, deadline=None)
@given(cells=st.lists(st.one_of(_HOSTILE, st.sampled_from(["0", "1", "1.0"])), min_size=3))
def test_classification_scores_any_label_cell(cells):
    track = get_track("classification")
    ids = [f"c{k}" for k in range(len(cells))]
    truth = {cid: k % 2 for k, cid in enumerate(ids)}

    class _Draw:
        answers = {"labels": truth}

    rows = {cid: {"label": cell} for cid, cell in zip(ids, cells, strict=True)}
    score = track.score_cases(_Draw(), None, rows, ids)
    assert 0.0 <= score <= 1.0
    valid = [int(float(c)) if c in ("0", "1", "1.0") else -1 for c in cells]
    assert score == metrics.balanced_accuracy([truth[c] for c in ids], valid)


# -- AP@0.5 against pycocotools ---------------------------------------------------------------


def _coco_ap(preds, truths):
    """AP@0.5 by pycocotools, images in sorted id order, detections as given."""
    coco = pytest.importorskip("pycocotools.coco")
    cocoeval = pytest.importorskip("pycocotools.cocoeval")
    order = sorted(truths)
    num = {k: i + 1 for i, k in enumerate(order)}
    anns = []
    for k in order:
        for x0, y0, x1, y1 in truths[k]:
            w, h = x1 - x0, y1 - y0
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": num[k],
                    "category_id": 1,
                    "bbox": [x0, y0, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    gt = coco.COCO()
    gt.dataset = {
        "images": [{"id": num[k]} for k in order],
        "annotations": anns,
        "categories": [{"id": 1, "name": "lesion"}],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        res = [
            {
                "image_id": num[k],
                "category_id": 1,
                "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                "score": s,
            }
            for k, b, s in preds
        ]
        dt = gt.loadRes(res) if res else coco.COCO()
        ev = cocoeval.COCOeval(gt, dt, "bbox")
        ev.params.iouThrs = np.array([0.5])
        ev.evaluate()
        ev.accumulate()
    prec = ev.eval["precision"][0, :, 0, 0, -1]  # IoU 0.5, all recall points, area all, 100 boxes
    return float(np.mean(np.where(prec < 0, 0.0, prec)))


def _canonical(preds):
    return sorted(preds, key=lambda p: (-p[2], p[0], *p[1]))


def _random_case(rng):
    truths, preds = {}, []
    for k in range(int(rng.integers(2, 6))):
        img = f"img_{k:02d}"
        boxes = []
        for _ in range(int(rng.integers(0, 5))):
            x0, y0 = rng.uniform(0, 80, 2)
            w, h = rng.uniform(4, 20, 2)
            boxes.append([float(x0), float(y0), float(x0 + w), float(y0 + h)])
        truths[img] = boxes
        for b in boxes:
            if rng.random() < 0.8:  # a detection near the truth, IoU spread around 0.5
                j = rng.normal(0, 0.25, 4) * (b[2] - b[0])
                x0, y0 = b[0] + j[0], b[1] + j[1]
                x1, y1 = max(x0 + 1, b[2] + j[2]), max(y0 + 1, b[3] + j[3])
                preds.append((img, [x0, y0, x1, y1], float(np.round(rng.random(), 1))))  # ties
        for _ in range(int(rng.integers(0, 4))):  # false positives
            x0, y0 = rng.uniform(0, 80, 2)
            preds.append(
                (
                    img,
                    [float(x0), float(y0), float(x0 + 10), float(y0 + 10)],
                    float(np.round(rng.random(), 1)),
                )
            )
    if sum(len(v) for v in truths.values()) == 0:
        truths["img_00"] = [[10.0, 10.0, 20.0, 20.0]]
    return _canonical(preds), truths


@pytest.mark.parametrize("seed", range(40))
def test_ap50_equals_pycocotools_on_random_boxes(seed):
    preds, truths = _random_case(np.random.default_rng(seed))
    assert metrics.average_precision(preds, truths, 0.5) == pytest.approx(
        _coco_ap(preds, truths), abs=1e-12
    )


T = {
    "a": [[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]],
    "b": [[5.0, 5.0, 15.0, 15.0]],
    "c": [],
}


@pytest.mark.parametrize(
    "preds",
    [
        [],  # no output
        [("c", [0.0, 0.0, 5.0, 5.0], 0.9)],  # only a false positive
        [("a", [0.0, 0.0, 10.0, 10.0], 0.5)] * 3,  # duplicates of one true box
        [
            ("a", [0.0, 0.0, 10.0, 10.0], 0.5),
            ("b", [5.0, 5.0, 15.0, 15.0], 0.5),
            ("a", [20.0, 20.0, 30.0, 30.0], 0.5),
        ],  # all tied, all right
        [("a", [0.0, 0.0, 10.0, 10.0], 0.5), ("c", [1.0, 1.0, 9.0, 9.0], 0.5)],  # a tie, one wrong
        [("a", [0.0, 0.0, 7.0, 10.0], 0.7)],  # IoU exactly 0.7
        [("a", [0.0, 0.0, 5.0, 10.0], 0.7)],  # IoU exactly 0.5
    ],
)
def test_ap50_equals_pycocotools_on_edge_cases(preds):
    preds = _canonical(preds)
    assert metrics.average_precision(preds, T, 0.5) == pytest.approx(_coco_ap(preds, T), abs=1e-12)


def test_ap50_ties_do_not_depend_on_submission_order():
    preds = [
        ("a", [0.0, 0.0, 10.0, 10.0], 0.5),
        ("c", [1.0, 1.0, 9.0, 9.0], 0.5),
        ("b", [40.0, 40.0, 50.0, 50.0], 0.5),
        ("b", [5.0, 5.0, 15.0, 15.0], 0.5),
    ]
    scores = {metrics.average_precision(p, T) for p in (preds, preds[::-1], preds[1:] + preds[:1])}
    assert len(scores) == 1


def test_ap50_counts_a_degenerate_box_as_a_false_positive():
    # Deliberate: COCO drops a negative-area box (outside its area range); here it is a
    # wrong box, so malformed output can never thin out the false positives.
    bad = [
        ("a", [0.0, 0.0, 10.0, 10.0], 0.9),
        ("a", [30.0, 30.0, 20.0, 20.0], 0.8),
        ("a", [20.0, 20.0, 30.0, 30.0], 0.7),
    ]
    assert metrics.average_precision(bad, T) < metrics.average_precision(bad[:1] + bad[2:], T)


def test_ap50_gives_nothing_for_nothing():
    assert metrics.average_precision([], T) == 0.0
    assert metrics.average_precision([("c", [0, 0, 5, 5], 1.0)], T) == 0.0
    nonfinite = [
        ("a", [0.0, 0.0, float("inf"), 10.0], 1.0),
        ("a", [0.0, 0.0, 10.0, 10.0], float("nan")),
    ]
    assert metrics.average_precision(nonfinite, T) == 0.0


_NUM = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["1e400", "nan", "x"])
)


@settings(max_examples=60, deadline=None)
@given(boxes=st.lists(st.lists(_NUM, min_size=0, max_size=6), max_size=5))
def test_detection_scores_any_box_file(boxes, tmp_path_factory):
    track = get_track("detection")
    ws = tmp_path_factory.mktemp("det")
    (ws / "d.json").write_text(json.dumps({"id": "a", "boxes": boxes}).replace('"1e400"', "1e400"))

    class _Draw:
        answers = {"boxes": T}

    rows = {k: {"detections_file": "d.json" if k == "a" else ""} for k in T}
    score = track.score_cases(_Draw(), ws, rows, list(T))
    assert 0.0 <= score <= 1.0


@settings(max_examples=60, deadline=None)
@given(answer=st.one_of(st.text(max_size=8), _HOSTILE))
def test_vqa_exact_match_scores_any_answer(answer):
    assert metrics.exact_match(answer, "left") in (0.0, 1.0)
