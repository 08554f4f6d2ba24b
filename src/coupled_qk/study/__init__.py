"""The study engine: one way to plan, run, read, report and verify experiments made of training runs.

- :mod:`.design`: a :class:`~.design.Study` is stages of cells (:class:`~.design.Cells`, or a learning-rate grid and
  the stages it tunes: :mod:`.grid`), claim tests bound to arms (:mod:`.claims`) and a report layout;
  :meth:`~.design.Study.read` is the one record reader (:mod:`.records`: layout, schema, the "same run?" rule).
- :mod:`.run`: the runner (reuse a record, reuse or resume a run folder, train; locks for several processes,
  ``torchrun``, deferred WikiText-2 evaluation, re-planning after each record); :mod:`.plan`: ``--plan``.
- :mod:`.report` with :mod:`.verdict_report` and :mod:`.stage_report`: the one report builder and its two layouts,
  written through the command's claim of the folder; :mod:`.figures`; :mod:`.verify`: re-train one record's run.
- :mod:`.executor`: train, resume or reuse planned runs (``compare``, ``demo``, ``mqar``, ``glue`` and every study),
  and say what it would do without doing it (dry runs).
- :mod:`.stats`, :mod:`.power`: intervals, tests and power; :mod:`.rescale`: records of another tokenizer.

The engine names no study: the studies themselves are recipes (:mod:`coupled_qk.studies`), which the engine never
imports (``tests/test_layering.py``). Nothing is re-exported here (import from the module that defines a name).
"""
