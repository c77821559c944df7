"""The teacher's pipeline, which its Setup stage writes to ``pipeline/score.py``.

``python pipeline/score.py OUT [ID ...]`` scores the cases of ``data/cases.csv`` (all of
them, or the ids given) with the model in ``model/model.json`` and writes ``OUT`` with
the columns ``id,score``. It runs inside the sandbox, so it uses the standard library
only (the benchmark declares no sandbox requirements). The naive baseline's pipeline is
this one without the unit conversion (``bench.NAIVE_PIPELINE``).
"""

import csv
import json
import sys

TO_CM = {"mm": 0.1, "cm": 1.0, "m": 100.0}


def main(out: str, wanted: list[str]) -> None:
    """Write the model's score of each wanted case (every case when none) to ``out``."""
    with open("model/model.json") as f:
        model = json.load(f)
    with open("task.json") as f:
        unit = json.load(f)["value_unit"]
    with open("data/cases.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if not wanted or r["id"] in wanted]
    with open(out, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["id", "score"])
        for row in rows:
            score = model["slope"] * float(row["value"]) * TO_CM[unit] + model["offset"]
            writer.writerow([row["id"], f"{score:.4f}"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
