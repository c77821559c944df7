"""Audits of a benchmark's reward.

The leakage audit (:mod:`bat_gym.audits.leakage`), the hackability audit
(:mod:`bat_gym.audits.reward`) and the exploit policies it plays
(:mod:`bat_gym.audits.exploits`).
"""
