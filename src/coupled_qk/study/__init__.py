"""The study engine: one way to plan, run, read, report and verify experiments made of training runs.

- :mod:`.executor`: train, resume or reuse planned runs (``compare``, ``demo``, ``mqar``, ``glue`` and every study),
  and say what it would do without doing it (dry runs and plans).
- :mod:`.stats`, :mod:`.power`: intervals, tests and power.

The engine names no study: the studies themselves are recipes (:mod:`coupled_qk.studies`), which the engine
never imports. Nothing is re-exported here (import from the module that defines a name).
"""
