"""Speed and memory of the attention variants against ``standard`` (``coupled-qk bench``; ``benchmarks/README.md``).

- :mod:`.train`: interleaved train-step timing, paired ratios and result files.
- :mod:`.step`: one model's timed train step and its statistics (shared with ``--fast``).
- :mod:`.machine`: the machine line and the timing helpers every bench module uses.
- :mod:`.decode`: cached greedy decoding speed and peak memory (``--mode decode|memory``).
- :mod:`.cost_curve`: train-step FLOP counts and the measured overhead against sequence length (``--sweep``).

Nothing is re-exported here (import from the module that defines a name).
"""
