"""The contract vocabulary a Benchmark speaks.

Rubric contracts (:mod:`~bat_gym.rubrics.contract.model`, with the YAML contracts of
the reference stages beside it), the check registry, what a check sees, and the
frozen workspace.
"""
