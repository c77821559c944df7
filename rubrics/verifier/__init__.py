"""The verifier and the rubric reward.

It scores an episode against its rubric contract with the built-in checks
(:mod:`bat_gym.rubrics.verifier.checks`); the rubric reward wraps a StageEnv with it.
"""
