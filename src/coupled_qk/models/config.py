"""``GPTConfig``: one validated dataclass describing a model (presets in PAPER.md section 4 are our choice)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from coupled_qk.layers.attention import ATTENTION_VARIANTS
from coupled_qk.layers.dynamics import FORCES
from coupled_qk.ops.dynamics import INTEGRATORS

PRESETS: dict[str, dict] = {
    # trains on 2 CPU cores in minutes (with a small trained byte-level BPE vocabulary)
    "tiny": dict(vocab_size=8192, block_size=128, n_layer=4, d_model=128, n_heads=4),
    # paper scale (our choice of shapes, GPT-2 BPE vocabulary, context 512)
    "60m": dict(vocab_size=50257, block_size=512, n_layer=12, d_model=512, n_heads=8),
    "150m": dict(vocab_size=50257, block_size=512, n_layer=16, d_model=768, n_heads=12),
    "350m": dict(vocab_size=50257, block_size=512, n_layer=24, d_model=1024, n_heads=16),
}


class JSONConfig:
    """Dict/JSON round trip for validated config dataclasses; unknown fields fail loudly."""

    def to_dict(self) -> dict:
        """All fields as a JSON-serialisable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict):
        """Build from a dict; unknown keys raise ``ValueError`` listing them and the valid fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; valid fields: {sorted(names)}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        """Write the config as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path):
        """Read a config written by :meth:`save` (``FileNotFoundError`` naming the path if it is missing)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"config file {path} is not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise ValueError(f"config file {path} must hold a JSON object; got {type(data).__name__}")
        return cls.from_dict(data)


@dataclass
class GPTConfig(JSONConfig):
    """Configuration of :class:`coupled_qk.GPT`.

    Fields:
        vocab_size: number of token ids.
        block_size: context length in tokens (longest sequence the model accepts).
        n_layer, d_model, n_heads: depth, width, query heads.
        n_kv_heads: key/value heads for grouped-query attention (default ``n_heads``).
        d_head: head width (default ``d_model // n_heads``).
        d_ff: feed-forward hidden width (default ``4 d_model``); ``use_mlp=False`` drops the feed-forward
            sub-layer (attention-only blocks, as in Zoology's MQAR models).
        attention: one of ``standard, coupled, uncoupled_mlp, differential, coupled_differential``.
        integrator, n_steps, dynamics_hidden, dt_init, shared_across_heads, force: options of
            :class:`coupled_qk.QKDynamics` (``dynamics_hidden`` defaults to ``d_head``).
        position: ``"rope"`` or ``"learned"`` (absolute embeddings, GPT-2 style).
        dynamics_position: ``"pre_rope"`` (default) or ``"post_rope"``.
        rope_base: RoPE frequency base.
        dropout: dropout on attention probabilities and residual branches.
        attn_impl: ``"sdpa"`` or ``"eager"``.

    Raises:
        ValueError: from :meth:`validate` (called on construction) naming the offending field: unknown
            names, non-positive sizes, heads that do not divide, or incompatible combinations; and from
            :meth:`from_dict` for unknown fields.
    """

    vocab_size: int = 8192
    block_size: int = 128
    n_layer: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int | None = None
    d_head: int | None = None
    d_ff: int | None = None
    use_mlp: bool = True
    attention: str = "standard"
    integrator: str = "euler"
    n_steps: int = 1
    dynamics_hidden: int | None = None
    dt_init: float = 0.1
    shared_across_heads: bool = True
    force: str = "mlp"
    position: str = "rope"
    dynamics_position: str = "pre_rope"
    rope_base: float = 10000.0
    dropout: float = 0.0
    attn_impl: str = "sdpa"
    extra: dict = field(default_factory=dict, repr=False)  # free-form notes saved with the config

    def __post_init__(self):
        for name in ("d_model", "n_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name}={value!r} must be a positive integer")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"GPTConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "change one of them or set d_head explicitly"
                )
            self.d_head = self.d_model // self.n_heads
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        self.validate()

    def validate(self) -> None:
        """Check every field; raise ``ValueError`` naming the first offending field."""
        for name in ("vocab_size", "block_size", "n_layer", "d_model", "n_heads", "n_kv_heads", "d_head", "d_ff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name}={value!r} must be a positive integer")
        choices = {
            "attention": ATTENTION_VARIANTS,
            "integrator": INTEGRATORS,
            "force": FORCES,
            "position": ("rope", "learned"),
            "dynamics_position": ("pre_rope", "post_rope"),
            "attn_impl": ("sdpa", "eager"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r} is unknown; expected one of {allowed}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"GPTConfig.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.position == "rope" and self.d_head % 2:
            raise ValueError(f"GPTConfig.d_head={self.d_head} must be even with position='rope'")
        if self.attention in ("differential", "coupled_differential") and (self.n_heads % 2 or self.n_kv_heads % 2):
            raise ValueError(
                f"GPTConfig.attention={self.attention!r} needs even n_heads and n_kv_heads "
                f"(pairs of sub-heads); got n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"
            )
        if isinstance(self.n_steps, bool) or not isinstance(self.n_steps, int) or self.n_steps < 0:
            raise ValueError(f"GPTConfig.n_steps={self.n_steps!r} must be an integer >= 0")
        if self.dynamics_hidden is not None and (not isinstance(self.dynamics_hidden, int) or self.dynamics_hidden < 1):
            raise ValueError(f"GPTConfig.dynamics_hidden={self.dynamics_hidden!r} must be a positive integer or None")
        if not isinstance(self.dt_init, (int, float)) or self.dt_init != self.dt_init or abs(self.dt_init) == float("inf"):
            raise ValueError(f"GPTConfig.dt_init={self.dt_init!r} must be a finite number")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout={self.dropout!r} must be in [0, 1)")
        if self.dynamics_position == "post_rope" and self.position != "rope":
            raise ValueError("GPTConfig.dynamics_position='post_rope' needs position='rope'")

    @property
    def dynamics_kwargs(self) -> dict:
        """Keyword arguments for :class:`coupled_qk.QKDynamics`."""
        return dict(
            integrator=self.integrator,
            n_steps=self.n_steps,
            hidden=self.dynamics_hidden,
            dt_init=float(self.dt_init),
            shared_across_heads=self.shared_across_heads,
            force=self.force,
        )

    @classmethod
    def from_preset(cls, name: str, **overrides) -> GPTConfig:
        """A preset (``tiny``, ``60m``, ``150m``, ``350m``) with field overrides.

        Raises:
            ValueError: unknown preset name or unknown override field.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})
