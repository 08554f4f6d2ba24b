"""Checks of values as they enter the library, by kind: paths (:mod:`coupled_qk.checks.paths`) and tensor entry
points with sampling arguments (:mod:`coupled_qk.checks.tensors`).

Each module is imported by what it names (no re-exports here).
"""
