"""``coupled-qk describe``: exact parameter counts and the coupling overhead of a model configuration."""

from __future__ import annotations

import json

from coupled_qk.commands.options import add_model_options, gpt_config_from_args
from coupled_qk.models.gpt import coupling_parameter_overhead

HELP = "parameter counts and coupling overhead of a model"


def add_arguments(parser) -> None:
    """Register the model options (:func:`~coupled_qk.commands.options.add_model_options`) and ``--json``."""
    add_model_options(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args) -> int:
    """Print the exact parameter count of the configured model, that of the same model with standard attention and
    the difference in percent (:func:`~coupled_qk.models.gpt.coupling_parameter_overhead`; builds on the meta
    device, no weights), as text or, with ``--json``, with the resolved config. Returns 0.

    Raises:
        ValueError: an invalid model option (naming it; exit 2 from the CLI).
    """
    config = gpt_config_from_args(args)
    info = coupling_parameter_overhead(config)
    info["config"] = config.to_dict()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    c = config
    print(
        f"preset={args.preset} attention={c.attention} qk_map={c.qk_map}\n"
        f"  n_layer={c.n_layer} d_model={c.d_model} n_heads={c.n_heads} n_kv_heads={c.n_kv_heads} "
        f"d_head={c.d_head} vocab_size={c.vocab_size} block_size={c.block_size} position={c.position}\n"
        f"  parameters:          {info['params']:,}\n"
        f"  standard attention:  {info['standard_params']:,}\n"
        f"  extra vs standard:   {info['extra']:,} ({info['overhead_percent']:+.4f}%)"
    )
    return 0
