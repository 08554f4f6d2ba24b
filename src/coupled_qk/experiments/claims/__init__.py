"""The claims study (``coupled-qk claims``): paper claims C1-C13 measured with seeds, intervals and fixed rules.

- :mod:`.protocols`: the named protocols (cells of base configuration x variants x seeds, budget ladders).
- :mod:`.runs`: execute a protocol's runs through the shared runner, one committed JSON record per run.
- :mod:`.records`: index a protocol's records for the rules (pairing by seed, what a claim still waits for).
- :mod:`.rules`: the claim rules and their verdicts (``docs/METHOD.md`` section 3).
- :mod:`.build`, :mod:`.markdown`, :mod:`.report`, :mod:`.plots`: the report (built from the records, as markdown
  and the README section, written as JSON and markdown) and its figures.
- :mod:`.power`: how to read a null verdict (is the paper's effect excluded, or was the study too small?).
- :mod:`.glue`: the GLUE scores of claim C11, read from ``coupled-qk glue``'s results.
- :mod:`.heldout`: the wiki-vital article split and the WikiText-2 evaluation.
- :mod:`.converged`, :mod:`.converged_study`, :mod:`.converged_report`: designs trained to their plateau (issue 25)
  and their report.

Nothing is re-exported here (import from the module that defines a name).
"""
