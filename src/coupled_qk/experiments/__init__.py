"""Experiments built on the training loop: each is a list of planned runs plus an analysis step.

- :mod:`.runner`: the shared runner (plan, reuse finished runs, resume unfinished ones, train, record,
  write JSON/markdown/PNG reports) and the one list of result-neutral settings.
- :mod:`.compare`: attention variants x seeds on a language-modelling corpus (``coupled-qk compare``/``demo``).
- :mod:`.mqar_presets`, :mod:`.mqar_sweep`, :mod:`.mqar_report`: MQAR sweeps (``coupled-qk mqar``).
- :mod:`.bench`: interleaved train-step timing of the variants (``coupled-qk bench``).
- :mod:`.glue`: GLUE fine-tuning of pretrained checkpoints x tasks x seeds (``coupled-qk glue``).
- :mod:`.protocols`, :mod:`.claims_runs`, :mod:`.claims`, :mod:`.claims_report`, :mod:`.claims_plots`,
  :mod:`.stats`, :mod:`.heldout`: the claims report C1-C13 with seeds and intervals (``coupled-qk claims``).

Submodules are imported on use (plotting and timing code stays out of ``import coupled_qk``).
"""
