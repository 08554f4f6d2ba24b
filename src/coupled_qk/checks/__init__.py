"""Checks of values as they enter the library, by kind: values, declarations and typed parsing
(:mod:`coupled_qk.checks.values`), assignment after construction checked like construction
(:mod:`coupled_qk.checks.assignment`), paths (:mod:`coupled_qk.checks.paths`), the command-line types built
from them (:mod:`coupled_qk.checks.cli`), tensor entry points with sampling arguments
(:mod:`coupled_qk.checks.tensors`) and environment variables (:mod:`coupled_qk.checks.environment`).

Each module is imported by what it names (no re-exports here).
"""
