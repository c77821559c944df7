"""The Stage Bank: replayable stage states on disk, and how they are built.

A bank is a directory of rows (one :class:`~bat_gym.core.spec.StageState` per line), a
manifest and a blob store of workspace snapshots (:mod:`bat_gym.bank.store`).

Building runs a teacher (the benchmark's scripted one, or any
:class:`~bat_gym.policies.Policy`) through a real env episode (E2E focus) for each
training task, and at every stage boundary stores the workspace snapshot and the
conversation so far: the start state of that stage's envs. Every row then passes the
admission gates (:class:`Admission`: sandbox init, rollout limits, contracts, leakage)
and is kept only if a demonstration played from it wins it
(:mod:`~bat_gym.bank.demonstrate`): a row no honest play wins teaches nothing.
Only training seeds are used; held-out seeds never enter a bank
(:mod:`bat_gym.audits.leakage` measures this afterwards). :meth:`StageBank.verify` re-checks a
bank's bytes and replays its boundaries.

Modules:

* :mod:`~bat_gym.bank.store`: :class:`StageBank`, loading, digests, :data:`BANK_FORMAT`.
* :mod:`~bat_gym.bank.verify`: :class:`BankReport` and the checks of ``verify``.
* :mod:`~bat_gym.bank.states`: :class:`StateSource`, :func:`task_states`, the E2E
  start state of a task, :func:`fit_history`.
* :mod:`~bat_gym.bank.replay`: :class:`RecordedTurn` trajectories, stepped through a
  real env.
* :mod:`~bat_gym.bank.policy_teacher`: any policy as teacher, :func:`load_trajectory`.
* :mod:`~bat_gym.bank.gates`: :data:`GATES` and :class:`Admission`.
* :mod:`~bat_gym.bank.demonstrate`: :data:`ADMIT_MIN_SHARE`, each row's demonstration,
  played, stored and replayed.
* :mod:`~bat_gym.bank.tasks`: one task's rows, in this process or forked workers.
* :mod:`~bat_gym.bank.build`: :func:`build_bank`, its plan, journal and manifest.
* :mod:`~bat_gym.bank.explain`: each task's record and verdict, and a bank's gaps.
* :mod:`~bat_gym.bank.default`: :class:`DefaultStates`, a benchmark's default grid
  built one teacher trajectory at a time on first use, and :func:`default_bank`, the
  whole grid; both cached under :func:`cache_dir`.
"""

from bat_gym.bank.build import OUTCOMES, build_bank
from bat_gym.bank.default import (
    DefaultStates,
    cache_dir,
    default_bank,
    default_states,
    state_source,
)
from bat_gym.bank.demonstrate import ADMIT_MIN_SHARE
from bat_gym.bank.gates import GATES, Admission
from bat_gym.bank.policy_teacher import POLICY_OUTCOMES, load_trajectory
from bat_gym.bank.replay import RecordedTurn, verdict_summary
from bat_gym.bank.states import SURROGATE, StateSource, fit_history, task_states
from bat_gym.bank.store import BANK_FORMAT, StageBank
from bat_gym.bank.tasks import SUCCESS_MIN_REWARD
from bat_gym.bank.verify import BankReport

__all__ = [
    # A bank on disk, and what envs read states from
    "BANK_FORMAT",
    "BankReport",
    "StageBank",
    "StateSource",
    "task_states",
    "fit_history",
    # Building
    "build_bank",
    "OUTCOMES",
    "SUCCESS_MIN_REWARD",
    "ADMIT_MIN_SHARE",
    "SURROGATE",
    "GATES",
    "Admission",
    # Policies as teachers
    "POLICY_OUTCOMES",
    "RecordedTurn",
    "load_trajectory",
    "verdict_summary",
    # The default states
    "DefaultStates",
    "cache_dir",
    "default_bank",
    "default_states",
    "state_source",
]
