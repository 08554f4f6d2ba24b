"""Load a finished (or checkpointed) training run for one's own scripts: model, tokenizer and configs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from coupled_qk.data.tokenizers import Tokenizer
from coupled_qk.models.gpt import GPT
from coupled_qk.training.run_folder import open_run


@dataclass
class LoadedRun:
    """A trained model with everything needed to use it.

    Attributes:
        model: the :class:`~coupled_qk.GPT` in eval mode, on the requested device.
        tokenizer: the run's own :class:`~coupled_qk.data.tokenizers.Tokenizer` (ids match the model's).
        checkpoint: the checkpoint folder that was loaded (``ckpt-*``).
        step: the optimizer step of that checkpoint.
        train_config: the run's ``config.json`` as a dict (``{}`` if the folder has none).
    """

    model: GPT
    tokenizer: Tokenizer
    checkpoint: Path
    step: int | None
    train_config: dict

    def encode(self, text: str, device: torch.device | str | None = None) -> torch.Tensor:
        """Token ids of ``text`` as a LongTensor ``(1, T)``; an empty text gives the end-of-text token alone.

        Any length: a text longer than the model's ``block_size`` is for :meth:`GPT.generate
        <coupled_qk.models.gpt.GPT.generate>` to handle as its ``context`` says (``"slide"``, the default, reads
        the last ``block_size`` tokens; ``"error"`` refuses), as the ``generate`` command does.
        """
        ids = self.tokenizer.encode(text) or [self.tokenizer.eot_id if self.tokenizer.eot_id is not None else 0]
        device = device if device is not None else next(self.model.parameters()).device
        return torch.tensor([ids], dtype=torch.long, device=device)


def load_run(path: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """Load a run folder (its ``latest`` checkpoint) or one ``ckpt-*`` folder with the run's tokenizer.

    Example::

        run = load_run("runs/demo/coupled/seed0")
        ids = run.model.generate(run.encode("The history of"), max_new_tokens=40, temperature=0)
        print(run.tokenizer.decode(ids[0]))

    Raises:
        FileNotFoundError: no checkpoint, or no tokenizer in the run folder.
        ValueError: a folder of another kind or state (a run still training, a GLUE or MQAR run:
            :func:`~coupled_qk.training.run_folder.open_run`), a damaged checkpoint, a tokenizer whose vocabulary
            does not match the model, a damaged ``config.json``, or a ``device`` that is neither ``"auto"`` nor a
            device of this machine (the error lists those).
    """
    from coupled_qk.devices import resolve_device

    resolve_device("device", device)  # an absent device: one line before anything is read
    run = open_run(path, "load_run", text=True)  # the run's state, checked once
    tokenizer = run.tokenizer()
    model, state = run.load_model(device)
    if model.config.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"{run.checkpoint}: model vocab_size={model.config.vocab_size} differs from the run tokenizer's "
            f"{tokenizer.vocab_size}"
        )
    return LoadedRun(model, tokenizer, run.checkpoint, state.get("step"), run.config)
