"""Experiments built on the study engine's executor (:mod:`coupled_qk.study.executor`): each is a list of planned
runs plus an analysis step.

- :mod:`.compare`: attention variants x seeds on a language-modelling corpus (``coupled-qk compare``/``demo``).
- :mod:`.mqar` (``presets``, ``sweep``, ``report``): MQAR sweeps (``coupled-qk mqar``).
- :mod:`.bench` (``train``, ``step``, ``machine``, ``decode``, ``fast``, ``cost_curve``): interleaved timing and
  memory of the variants (``coupled-qk bench``).
- :mod:`.glue` (``finetune``): GLUE fine-tuning of pretrained checkpoints x tasks x seeds (``coupled-qk glue``).

The studies of the paper's claims are recipes (:mod:`coupled_qk.studies`) of the study engine
(:mod:`coupled_qk.study`). Submodules are imported on use (plotting and timing code stays out of
``import coupled_qk``); a sub-package's ``__init__`` re-exports nothing (that would be an import cycle): import a
name from the module that defines it.
"""
