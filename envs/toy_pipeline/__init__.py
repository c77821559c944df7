"""toy_pipeline: a small five-stage benchmark over CSV data, built for learnability.

Each task is a tiny scoring pipeline: read ``data/cases.csv``, apply the model in
``model/model.json``, write predictions and a submission of four-decimal scores. The
stages and their artifacts follow the reference release (plan, setup, validate, infer,
submit, each with a receipt). Tracks:

* ``threshold``: score each case's measurement with a logistic model in centimetres.
  The trap: measurements are recorded in the unit named in ``task.json``, which may
  differ from the model's unit; only a pilot that checks units catches it.
* ``lookup``: map each case's code to a score through the model's table. The trap:
  codes in the data carry stray case and whitespace.

The teacher plays three outcomes (:mod:`~bat_gym.envs.toy_pipeline.teacher`):
``success``, ``recovery`` (the trap missed in S2, caught by the S3 check and fixed) and
``failure`` (missed and carried to the submission), whose later rows are repair
exercises.
"""

from bat_gym.envs.toy_pipeline.suite import ToyPipeline

__all__ = ["ToyPipeline", "benchmark"]


def benchmark() -> ToyPipeline:
    """Entry point for the ``bat_gym.benchmarks`` group."""
    return ToyPipeline()
