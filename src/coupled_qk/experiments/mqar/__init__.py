"""MQAR sweeps (``coupled-qk mqar``; Zoology arXiv:2312.04927, ``docs/METHOD.md`` section 6).

- :mod:`.presets`: the sweep presets (Zoology, Based, a CPU-sized sweep) and their difficulties.
- :mod:`.sweep`: plan a preset's points and run them with the shared runner.
- :mod:`.report`: best accuracy over learning rates, the summary JSON, table and figure.

Nothing is re-exported here (import from the module that defines a name).
"""
