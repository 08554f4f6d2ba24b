"""Experiments built on the training loop: each is a list of planned runs plus an analysis step.

- :mod:`.runner`: the shared runner (plan, reuse finished runs, resume unfinished ones, train, record,
  write JSON/markdown/PNG reports) and the one list of result-neutral settings.
- :mod:`.stats`: the statistics every study uses (t intervals, paired differences, variance ratios,
  correlations, bootstrap, Holm).
- :mod:`.compare`: attention variants x seeds on a language-modelling corpus (``coupled-qk compare``/``demo``).
- :mod:`.mqar` (``presets``, ``sweep``, ``report``): MQAR sweeps (``coupled-qk mqar``).
- :mod:`.bench` (``train``, ``step``, ``machine``, ``decode``, ``fast``, ``cost_curve``): interleaved timing and
  memory of the variants (``coupled-qk bench``).
- :mod:`.glue` (``finetune``): GLUE fine-tuning of pretrained checkpoints x tasks x seeds (``coupled-qk glue``).
- :mod:`.claims` (``protocols``, ``runs``, ``records``, ``rules``, ``build``, ``markdown``, ``report``, ``plots``,
  ``power``, ``glue``, ``heldout``, ``converged``, ``converged_study``, ``converged_report``): the claims report
  C1-C13 with seeds and intervals (``coupled-qk claims``).

Submodules are imported on use (plotting and timing code stays out of ``import coupled_qk``); a sub-package's
``__init__`` re-exports nothing (that would be an import cycle): import a name from the module that defines it.
"""
