"""Report track: each task draws its own fissures, and a nodule's lobe follows them.

A reader who places the lobes by textbook fissure planes should misplace the nodules
near a fissure on every task; these tests hold the data to that.
"""

import numpy as np

from bat_gym.envs.medbench_lite.tracks import get_track
from bat_gym.envs.medbench_lite.tracks.report import _LUNG, _LUNG_R, _SPREAD, TEXTBOOK, _lobe_of


def test_every_task_moves_its_fissures_off_the_textbook_and_its_model_carries_them(bench):
    track = get_track("report")
    spreads = {
        "right": (_SPREAD["a"], _SPREAD["b"], _SPREAD["horizontal"]),
        "left": (_SPREAD["a"], _SPREAD["b"]),
    }
    for seed in range(1_000_000, 1_000_010):
        fissures = track.fissures(seed, "heldout")
        weights = bench.draw("report", seed, "heldout").weights
        assert tuple(weights["right_fissures"]) == fissures["right"]
        assert tuple(weights["left_fissure"]) == fissures["left"]
        for side, values in fissures.items():
            for value, book, spread in zip(values, TEXTBOOK[side], spreads[side], strict=True):
                # At least half the spread away: a textbook reader is off on every task.
                assert 0.5 * spread - 1e-3 <= abs(value - book) <= spread + 1e-3, (seed, side)


def test_a_nodules_lobe_follows_the_tasks_fissures_not_the_textbook():
    cx, cy, cz = _LUNG["left"]
    # A point at mid-depth, at zf = 0.45: below the textbook oblique fissure (0.52) ...
    point = np.array([cx, cy, cz - _LUNG_R[2] + 0.45 * 2 * _LUNG_R[2]])
    assert _lobe_of(point, "left")[0] == "left lower lobe"
    # ... and above a task's fissure drawn lower.
    low = {"right": (0.3, -0.8, 0.6), "left": (0.35, -0.8)}
    assert _lobe_of(point, "left", low)[0] == "left upper lobe"
