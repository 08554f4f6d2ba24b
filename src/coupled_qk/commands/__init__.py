"""Sub-commands of the ``coupled-qk`` command line (see :mod:`coupled_qk.cli`)."""
