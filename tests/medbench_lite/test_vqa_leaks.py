"""VQA leaks nothing but through the pixels: a classifier on everything else is at chance.

For every test question of many tasks we collect what an agent can read without
looking at the pixels: the question's type, its position in ``questions.jsonl``, the
numbers in its qid and image id, the image's display convention, pixel spacing, size,
PNG byte size and place in ``metadata.csv``, the image's question count and the task's
image count. Per question type, a logistic regression (scikit-learn, standardised
features) is fitted to predict the answer with 5-fold cross-validation grouped by task,
next to the majority rule fitted on the same folds.

Statistical test: one-sided exact binomial test of the classifier's held-out hits
against the majority rule's held-out accuracy ``p0`` (H0: accuracy <= p0). A leak is
declared when ``p < 0.001``; the test also bounds the raw gain at 0.05.
"""

import csv
import io
import json
import re

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
scipy_stats = pytest.importorskip("scipy.stats")

from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import GroupKFold  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from bat_gym.envs.medbench_lite.tracks.vqa import QUESTIONS, Vqa  # noqa: E402

ALPHA = 1e-3


def _number(text: str) -> int:
    return int(re.sub(r"\D", "", text) or 0)


def _rows(seeds):
    track = Vqa()
    feats, answers, kinds, groups = [], [], [], []
    for seed in seeds:
        d = track.draw(seed, "train")
        questions = [json.loads(x) for x in d.files["data/questions.jsonl"].splitlines()]
        meta = list(csv.DictReader(io.StringIO(d.files["data/metadata.csv"].decode())))
        place = {m["image_id"]: k for k, m in enumerate(meta)}
        conv = {m["image_id"]: m["view_convention"] for m in meta}
        spacing = {m["image_id"]: float(m["pixel_spacing_mm"]) for m in meta}
        per_image: dict[str, int] = {}
        for q in questions:
            per_image[q["image_id"]] = per_image.get(q["image_id"], 0) + 1
        for pos, q in enumerate(questions):
            png = d.files[f"data/images/{q['image_id']}.png"]
            kind = QUESTIONS.index(q["question"])
            feats.append(
                [
                    *(kind == k for k in range(len(QUESTIONS))),
                    pos / len(questions),
                    _number(q["qid"]),
                    _number(q["image_id"]),
                    conv[q["image_id"]] == "radiological",
                    spacing[q["image_id"]],
                    d.params["image_px"],
                    len(png),
                    place[q["image_id"]],
                    per_image[q["image_id"]],
                    d.params["images"],
                ]
            )
            answers.append(d.answers["answers"][q["qid"]])
            kinds.append(kind)
            groups.append(seed)
    return np.array(feats, dtype=float), np.array(answers), np.array(kinds), np.array(groups)


def _check(seeds):
    x, y, kinds, groups = _rows(seeds)
    for kind in range(len(QUESTIONS)):
        sel = kinds == kind
        xs, ys, gs = x[sel], y[sel], groups[sel]
        hits = base = 0
        for train, test in GroupKFold(n_splits=5).split(xs, ys, gs):
            labels, counts = np.unique(ys[train], return_counts=True)
            base += int(np.sum(ys[test] == labels[np.argmax(counts)]))
            if labels.size < 2:
                hits += int(np.sum(ys[test] == labels[0]))
                continue
            clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
            clf.fit(xs[train], ys[train])
            hits += int(np.sum(clf.predict(xs[test]) == ys[test]))
        n = int(sel.sum())
        p0 = base / n
        p = scipy_stats.binomtest(
            hits, n, min(max(p0, 1e-9), 1 - 1e-9), alternative="greater"
        ).pvalue
        assert p >= ALPHA and hits / n <= p0 + 0.05, (QUESTIONS[kind], hits / n, p0, p)


def test_nothing_but_the_pixels_predicts_an_answer():
    _check(range(0, 40))


@pytest.mark.slow
def test_nothing_but_the_pixels_predicts_an_answer_over_many_tasks():
    _check(range(40, 300))


def test_every_image_is_asked_the_same_questions():
    d = Vqa().draw(3, "train")
    questions = [json.loads(x) for x in d.files["data/questions.jsonl"].splitlines()]
    asked: dict[str, list[str]] = {}
    for q in questions:
        asked.setdefault(q["image_id"], []).append(q["question"])
    assert all(sorted(v) == sorted(QUESTIONS) for v in asked.values())
    assert [q["qid"] for q in questions] == sorted(q["qid"] for q in questions)
