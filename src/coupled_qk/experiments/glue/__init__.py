"""GLUE fine-tuning of pretrained checkpoints (``coupled-qk glue``; ``docs/METHOD.md`` claim C11).

- :mod:`.finetune`: fine-tune checkpoints x tasks x seeds with the shared runner and summarise them.

Nothing is re-exported here (import from the module that defines a name).
"""
