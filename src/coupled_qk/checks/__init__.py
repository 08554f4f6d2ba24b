"""Checks of values as they enter the library: paths (:mod:`coupled_qk.checks.paths`).

Each module is imported by what it names (no re-exports here).
"""
