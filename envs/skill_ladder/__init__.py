"""skill_ladder: a five-stage benchmark built for learnability by tiny language models.

Every stage is one short bash command of a tool the task ships (``tool/pipe.py``, which
``setup`` installs as ``pipeline/infer.py``); the commands write the artifacts and their
receipts that the reference rubric contracts check. What varies per task is one
discrete flag of the S3 pilot, and where its value comes from is the track's skill:

* ``units``: ``--unit mm|cm``, copied from the task card;
* ``cases``: ``--case ID``, the calibration phantom the card names;
* ``codes``: ``--codes lower|legacy``, the fix that ``python pipeline/infer.py check``
  prints (read from a tool observation).

The pilot records its flags and inference reuses them, so a wrong flag costs the S3
credit (1.0 -> 0: the pilot's rows are not the model's outputs under the right flag)
and the task score (at most 2/3), and the pilot's own check prints ``CHECK FAILED``
with what to change. No stage needs arithmetic or
code writing.
"""

from bat_gym.envs.skill_ladder.suite import SkillLadder

__all__ = ["SkillLadder", "benchmark"]


def benchmark() -> SkillLadder:
    """Entry point for the ``bat_gym.benchmarks`` group."""
    return SkillLadder()
