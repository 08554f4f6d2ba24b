"""Drop-in query-key maps: each module of this package is one attention variant, in one file.

A module here holds a map (a :class:`~coupled_qk.layers.qk_maps.QKMap` subclass), its options (a
:class:`~coupled_qk.models.options.MapOptions` dataclass whose fields are declared with
:func:`~coupled_qk.models.options.option`) and a function ``register()`` that calls
:func:`~coupled_qk.models.registry.register_qk_map` (and, if wanted, ``register_variant``). The registry imports
every module of this package and calls its ``register()`` the first time it is queried
(:func:`~coupled_qk.models.registry.load_plugins`), exactly as it does for a third-party package's
``coupled_qk.variants`` entry point; nothing else needs an edit (docs/DESIGN.md, "Adding an attention variant").

The paper's maps are drop-ins like any other: :mod:`~coupled_qk.models.maps.dynamics` (the coupled dynamics,
v1), :mod:`~coupled_qk.models.maps.query_mlp` (the uncoupled baseline) and
:mod:`~coupled_qk.models.maps.invertible` (the invertible coupling, v2).
"""
