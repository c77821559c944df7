"""The curriculum: what BaT trains on next, and when a candidate is promoted.

* :mod:`~bat_gym.curriculum.rounds`: an RL round of a Stage Bank, built from a seed
  (:class:`RoundSpec`, :class:`RLRow`, :func:`build_round`).
* :mod:`~bat_gym.curriculum.sampler`: :class:`CurriculumSampler`, the next state ids of
  round after round, from the states' metadata alone (no env, no sandbox); resumable.
* :mod:`~bat_gym.curriculum.wrapper`: :class:`StageCurriculum`, the Gymnasium wrapper
  whose ``reset()`` restores what the sampler draws.
* :mod:`~bat_gym.curriculum.selection`: target selectors (which stage a BiCuRL round
  trains), plugged in through the ``bat_gym.selectors`` entry points.
* :mod:`~bat_gym.curriculum.gate`: the promotion gate (is the candidate better?).

The modules are imported one by one, so reading the gate skips gymnasium and the env.
"""
