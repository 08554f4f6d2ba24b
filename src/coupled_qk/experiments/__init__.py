"""Experiments: protocols that train several runs and report on them (see ``docs/METHOD.md`` section 3)."""
