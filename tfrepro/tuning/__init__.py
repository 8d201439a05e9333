"""Tuning through seed noise: racing configurations over seeds, and KerasTuner searches run that way.

- ``racing``: ``race`` scores configurations over common seeds, gives further seeds in turn to
  those still in doubt, and drops a configuration while it is worse than the leader beyond seed
  noise; ``TuningResult`` says which configurations are better than which (Welch t-tests,
  Holm-adjusted), and which are not.
- ``keras_tuning``: ``RacingSearch`` runs any KerasTuner tuner with each trial's executions under
  ``tfrepro.patched(seed)`` on recorded seeds, then races its configurations within a budget of
  fits; every (configuration, seed) reruns to the same bits (``RacingSearch.rerun``). KerasTuner is
  the ``tuner`` extra: ``pip install 'tfrepro[tuner]'``.
- ``script_tuning``: ``tfrepro tune``, the race for a script that reads its hyperparameters with
  ``hyperparameters(**defaults)``, each fit a fresh interpreter as ``tfrepro sweep`` runs a seed.

This floor sits on ``sweeps`` (the statistics) and ``determinism`` (``patched``); ``plotting``
draws its results (``plot_tuning``).
"""

from tfrepro.tuning.keras_tuning import RacingSearch
from tfrepro.tuning.racing import Candidate, Claim, TuningResult, race
from tfrepro.tuning.script_tuning import hyperparameters

__all__ = ["Candidate", "Claim", "RacingSearch", "TuningResult", "hyperparameters", "race"]
