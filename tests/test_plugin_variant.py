"""The one extension point, proved from outside the package: a toy attention variant (``tests/plugins/drift``,
``q' = q + gain * dt * k``) registered only through the ``coupled_qk.variants`` entry point, with no edit to
``src/``, works in the model, the options (``--set gain=2``, ``drift+gain=2``), every default list, ``train``,
``analyze``, cached decoding, ``compare``, ``bench``, ``mqar``, ``claims --variants`` and the Hugging Face
round trip."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.cli import main
from coupled_qk.layers.qk_maps import QKMap
from coupled_qk.models import registry
from coupled_qk.models.config import parse_overrides
from coupled_qk.models.options import MapOptions
from coupled_qk.models.specs import parse_variants, variant_overrides

PLUGIN = Path(__file__).parent / "plugins" / "drift"
SMALL = dict(vocab_size=50, block_size=16, n_layer=2, d_model=32, n_heads=4)
MICRO = [
    "--set",
    "vocab_size=64",
    "--set",
    "block_size=16",
    "--set",
    "n_layer=1",
    "--set",
    "d_model=16",
    "--set",
    "n_heads=2",
]


@pytest.fixture
def drift(monkeypatch):
    """The plugin's folder on ``sys.path`` (its dist-info makes it an installed distribution); every registration
    is undone after the test."""
    monkeypatch.syspath_prepend(str(PLUGIN))
    with registry.isolated():
        yield
    sys.modules.pop("coupled_qk_drift", None)


def test_entry_point_is_read_lazily_and_fills_every_list(drift):
    assert "drift" not in registry.ATTENTIONS  # nothing is loaded before the registry is queried
    import coupled_qk

    assert {"drift", "drift_differential"} <= set(coupled_qk.ATTENTION_VARIANTS)
    assert registry.get_attention("drift").qk_map.name == "drift"
    assert registry.default_variants()[-2:] == ["drift", "drift_differential"]  # joined the defaults
    assert "drift_strong" in registry.variant_names() and "drift_strong" not in registry.default_variants()
    assert parse_variants("all")[-2:] == ["drift", "drift_differential"]
    assert {"gain": "gain", "dt_init": "dt_init"}.items() <= registry.flat_option_names().items()
    from coupled_qk.experiments.bench.train import with_baseline
    from coupled_qk.experiments.mqar.presets import mqar_variants

    assert "drift" in with_baseline(None) and mqar_variants()["drift_differential"] == {
        "attention": "drift_differential"
    }


def test_options_are_generated_from_the_dataclass(drift):
    assert parse_overrides(["gain=2"]) == {"gain": 2.0}
    assert variant_overrides("drift+gain=2") == {"attention": "drift", "gain": 2.0}
    assert variant_overrides("drift-strong") == {"attention": "drift", "gain": 4.0}
    cfg = GPTConfig(**SMALL, attention="drift", gain="2", dt_init=0.05)
    assert (cfg.qk_map.gain, cfg.qk_map.dt_init) == (2.0, 0.05) and isinstance(cfg.qk_map.gain, float)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(gain=3.0).qk_map.gain == 3.0
    with pytest.raises(ValueError, match=r"--set gain='abc' is not a number; expected float"):
        parse_overrides(["gain=abc"])
    with pytest.raises(ValueError, match=r"GPTConfig.qk_map.gain=nan must be a finite number"):
        GPTConfig(**SMALL, **variant_overrides("drift+gain=nan"))
    with pytest.raises(ValueError, match=r"\['gain'\] do not apply to attention='coupled'"):
        GPTConfig(**SMALL, attention="coupled", gain=2.0)
    with pytest.raises(ValueError, match=r"\['n_steps'\] do not apply to attention='drift'.*\['gain', 'dt_init'\]"):
        GPTConfig(**SMALL, **variant_overrides("drift+n_steps=2"))


def test_drift_equals_standard_attention_with_shifted_query_weights(drift):
    """Independent identity: the map acts on projected (pre-RoPE) queries, so ``q + g dt_h k = (W_q + g dt_h W_k) x``
    per head: the drift model equals a standard model whose query weights are shifted (float64)."""
    torch.manual_seed(0)
    cfg = dict(SMALL, n_kv_heads=4)
    drift_model = GPT(GPTConfig(**cfg, attention="drift", gain=1.5)).double().eval()
    with torch.no_grad():
        for block in drift_model.blocks:
            block.attn.qk_map.dt.copy_(torch.tensor([0.3, -0.2, 0.5, 0.1]))
    std = GPT(GPTConfig(**cfg)).double().eval()
    std.load_state_dict(drift_model.state_dict(), strict=False)
    d = 8
    with torch.no_grad():
        for block, ref in zip(drift_model.blocks, std.blocks, strict=True):
            w = block.attn.qkv.weight
            dt = block.attn.qk_map.dt
            for h in range(4):
                ref.attn.qkv.weight[h * d : (h + 1) * d] = (
                    w[h * d : (h + 1) * d] + 1.5 * dt[h] * w[(4 + h) * d : (5 + h) * d]
                )
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(drift_model(idx), std(idx), rtol=1e-10, atol=1e-10)
        assert not torch.allclose(drift_model(idx), GPT(GPTConfig(**cfg)).double().eval()(idx))


def _train_args(tiny_corpus, tmp_path) -> list[str]:
    """Command-line options of a 2-step micro run on the tiny corpus (shared by the slow tests)."""
    return [
        "--corpus",
        str(tiny_corpus),
        "--tokenizer",
        "bpe-300",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--set",
        "n_layer=1",
        "--set",
        "d_model=32",
        "--set",
        "n_heads=2",
        "--set",
        "block_size=16",
        "--batch-size",
        "4",
        "--eval-interval",
        "2",
        "--eval-batches",
        "1",
        "--warmup-steps",
        "1",
        "--no-progress",
        "--no-tensorboard",
    ]


def _check_decoding_and_hf_round_trip(model, tmp_path) -> None:
    """Cached decoding equals decoding without the cache; the Hugging Face classes save the model, load it
    through the Auto classes and give the same logits and the same cached generation."""
    model, idx = model.eval(), torch.randint(0, model.config.vocab_size, (2, 4))
    cached = model.generate(idx, 8, temperature=0)
    assert torch.equal(cached, model.generate(idx, 8, temperature=0, use_cache=False))

    pytest.importorskip("transformers")
    from transformers import AutoConfig, AutoModelForCausalLM

    from coupled_qk.hf import CoupledQKForCausalLM

    CoupledQKForCausalLM.from_gpt(model).save_pretrained(tmp_path / "hf")
    assert AutoConfig.from_pretrained(tmp_path / "hf").to_gpt_config() == model.config
    lm = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        assert torch.equal(lm(input_ids=idx).logits, model(idx))
    assert torch.equal(lm.generate(idx, max_new_tokens=8, do_sample=False), cached)


@pytest.mark.slow
def test_train_analyze_generate_and_hf_round_trip(drift, tiny_corpus, tmp_path, capsys):
    common = _train_args(tiny_corpus, tmp_path)
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                *common,
                "--max-steps",
                "2",
                "--out-dir",
                str(run),
                "--attention",
                "drift",
                "--set",
                "gain=2",
                "--set",
                "dt_init=0.05",
            ]
        )
        == 0
    )
    from coupled_qk import load_run

    loaded = load_run(run)
    assert loaded.model.config.qk_map.gain == 2.0 and loaded.model.config.attention == "drift"
    assert (
        main(
            [
                "analyze",
                str(run),
                "--corpus",
                str(tiny_corpus),
                "--n-sequences",
                "1",
                "--seq-len",
                "8",
                "--out-dir",
                str(tmp_path / "analysis"),
                "--no-plots",
            ]
        )
        == 0
    )
    analysis = json.loads((tmp_path / "analysis" / "analysis.json").read_text())["checkpoints"][0]["analysis"]
    assert analysis["attention"] == "drift"
    dt = loaded.model.blocks[0].attn.qk_map.dt.detach().tolist()
    assert analysis["layers"][0]["qk_heads"]["dt"] == pytest.approx(dt)

    _check_decoding_and_hf_round_trip(loaded.model, tmp_path)


@pytest.mark.slow
def test_compare_bench_and_mqar_see_the_plugin(drift, tiny_corpus, tmp_path, capsys):
    common = _train_args(tiny_corpus, tmp_path)
    assert (
        main(
            [
                "compare",
                *common,
                "--max-steps",
                "2",
                "--out-dir",
                str(tmp_path / "cmp"),
                "--variants",
                "standard,drift+gain=2",
                "--seeds",
                "0",
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert summary["variants"]["drift+gain=2"]["overrides"] == {"attention": "drift", "gain": 2.0}

    # bench's default set ("all") is computed from the registry: the plugin's variants are in it
    assert (
        main(
            [
                "bench",
                *MICRO,
                "--batch-size",
                "2",
                "--seq-len",
                "8",
                "--repeats",
                "1",
                "--warmup",
                "1",
                "--device",
                "cpu",
                "--out-dir",
                str(tmp_path / "bench"),
            ]
        )
        == 0
    )
    bench = json.loads((tmp_path / "bench" / "bench-tiny-cpu.json").read_text())
    assert {"drift", "drift_differential"} <= set(bench["variants"])
    assert bench["variants"]["drift"]["params"] == bench["variants"]["standard"]["params"] + 2  # one dt per head

    # mqar: the default sweep plans the plugin's variants; a micro sweep trains one
    capsys.readouterr()
    assert (
        main(["mqar", "--preset", "cpu", "--d-models", "16", "--lrs", "1e-3", "--difficulties", "easy", "--dry-run"])
        == 0
    )
    planned = capsys.readouterr().out
    assert " drift " in planned and " drift_differential " in planned
    from coupled_qk.experiments.mqar.presets import Difficulty, SweepPreset
    from coupled_qk.experiments.mqar.sweep import run_sweep

    preset = SweepPreset(
        name="micro",
        description="test",
        vocab_size=32,
        difficulties=(Difficulty("easy", ((8, 2, 64),), ((8, 2, 32),), 32),),
        d_models=(16,),
        lrs=(3e-3,),
        variants=("drift+gain=2",),
        epochs=1.0,
        max_steps=2,
        eval_interval=2,
    )
    result = run_sweep(preset, tmp_path / "mqar", device="cpu", log=lambda line: None)
    assert [r["variant"] for r in result["runs"]] == ["drift+gain=2"] and result["counts"] == {"ran": 1}


def test_claims_variants_adds_the_plugin_to_every_cell(drift, tmp_path, capsys):
    from coupled_qk.studies import get_study

    smoke = get_study("smoke")
    extended = smoke.with_variants(["drift+gain=2", "standard"])
    assert extended.extra_variants == ("drift+gain=2", "standard")
    for old, new in zip(smoke.cells, extended.cells, strict=True):
        added = tuple(v for v in ("drift+gain=2", "standard") if v not in old.variants)
        assert new.variants == old.variants + added and new.seeds == old.seeds
    with pytest.raises(ValueError, match="unknown variant 'mamba'"):
        smoke.with_variants(["mamba"])
    out = tmp_path / "claims"
    (out / "runs" / "smoke").mkdir(parents=True)  # the study's record folder, no record yet
    assert (
        main(
            [
                "claims",
                "--protocol",
                "smoke",
                "--variants",
                "drift+gain=2",
                "--report-only",
                "--no-figures",
                "--out-dir",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "smoke.json").read_text())
    rows = report["extra_variants"]
    assert (
        rows
        and {r["variant"] for r in rows} == {"drift+gain=2"}
        and all(r["status"].startswith("not run") for r in rows)
    )
    assert "wv-tiny" in {r["cell"] for r in rows}
    assert "## Added variants (claims --variants)" in (out / "smoke.md").read_text()
    assert main(["claims", "--protocol", "smoke", "--variants", "mamba", "--report-only", "--out-dir", str(out)]) == 2
    assert "unknown variant 'mamba'" in capsys.readouterr().err


TOY_DROP_IN = """
import dataclasses

from coupled_qk import MapOptions, QKMap, option, register_qk_map


class ScaledQueries(QKMap):
    keys_per_query_head = False

    def __init__(self, d_head, n_heads, scale=2.0):
        super().__init__()
        self.scale, self.dt = scale, None

    def forward(self, q, k):
        return self.scale * q, k


@dataclasses.dataclass
class ScaledQueriesOptions(MapOptions):
    scale: float = option(2.0)


def register():
    register_qk_map("scaled_queries", "scaled_q", ScaledQueries, ScaledQueriesOptions, in_defaults=("standard",))
"""


def test_a_drop_in_module_in_models_maps_is_one_file(tmp_path, monkeypatch):
    """Inside the package, a variant is one file in ``coupled_qk/models/maps/`` (here a folder added to that
    package's path): found at the first registry query, options generated, in the defaults it asked for."""
    from coupled_qk.models import maps

    (tmp_path / "toy_scaled_queries.py").write_text(TOY_DROP_IN)
    monkeypatch.setattr(maps, "__path__", [*maps.__path__, str(tmp_path)])
    with registry.isolated():
        assert "scaled_q" not in registry.ATTENTIONS
        assert variant_overrides("scaled_q+scale=3") == {"attention": "scaled_q", "scale": 3.0}
        assert "scaled_q" in registry.default_variants() and "scaled_q_differential" not in registry.default_variants()
        torch.manual_seed(0)
        std = GPT(GPTConfig(**SMALL)).eval()
        toy = GPT(GPTConfig(**SMALL, attention="scaled_q", scale=1.0)).eval()
        toy.load_state_dict(std.state_dict())
        idx = torch.randint(0, 50, (2, 8))
        with torch.no_grad():
            assert torch.equal(toy(idx), std(idx))  # scale 1 is the identity map
    assert "scaled_q" not in registry.ATTENTIONS  # undone on exit
    sys.modules.pop("coupled_qk.models.maps.toy_scaled_queries", None)


# ------------------------------------------------------------------------------------------------------
# a scoring rule is the same kind of extension point: tests/plugins/tempered (softmax at temperature 0.5)
# ------------------------------------------------------------------------------------------------------

TEMPERED = Path(__file__).parent / "plugins" / "tempered"


@pytest.fixture
def tempered(monkeypatch):
    """The scoring-rule plugin's folder on ``sys.path``; every registration is undone after the test."""
    monkeypatch.syspath_prepend(str(TEMPERED))
    with registry.isolated():
        yield
    sys.modules.pop("coupled_qk_tempered", None)


def test_a_scoring_rule_from_an_entry_point_combines_with_every_map(tempered):
    assert "tempered" not in registry.ATTENTIONS  # read lazily
    import coupled_qk

    names = set(coupled_qk.ATTENTION_VARIANTS)
    assert {"tempered", "coupled_tempered", "uncoupled_mlp_tempered", "invertible_tempered"} <= names
    assert registry.get_attention("coupled_tempered").qk_map.name == "dynamics"
    assert registry.get_attention("tempered").head_group == 1
    assert "tempered" in registry.default_variants() and "coupled_tempered" not in registry.default_variants()
    assert variant_overrides("coupled_tempered+n_steps=2") == {"attention": "coupled_tempered", "n_steps": 2}
    cfg = GPTConfig(**SMALL, attention="coupled_tempered", integrator="leapfrog")
    assert cfg.qk_map.integrator == "leapfrog"
    with pytest.raises(ValueError, match=r"\['n_steps'\] do not apply to attention='tempered'"):
        GPTConfig(**SMALL, attention="tempered", n_steps=2)
    # a map registered after the rule combines with it too
    registry.register_qk_map("toy_identity", "toy_id", TinyIdentity, NoOptions)
    assert registry.get_attention("toy_id_tempered").scoring == "tempered"
    assert "toy_id_tempered" not in registry.default_variants()
    plugin = sys.modules["coupled_qk_tempered"]
    registry.register_scoring("tempered", plugin.Tempered)  # the same registration again (a re-run) replaces it
    with pytest.raises(ValueError, match="already registered"):  # another class under the name does not
        registry.register_scoring("tempered", type("Tempered", (plugin.Tempered,), {}))
    with pytest.raises(ValueError, match="ScoringRule subclass"):
        registry.register_scoring("plain", torch.nn.Linear)


@dataclasses.dataclass
class NoOptions(MapOptions):
    """The options of :class:`TinyIdentity`: none."""


class TinyIdentity(QKMap):
    """The identity query-key map (no options), for registration tests."""

    keys_per_query_head = True

    def __init__(self, d_head, n_heads):
        super().__init__()
        self.dt = None

    def forward(self, q, k):
        return q, k


def test_tempered_scoring_equals_standard_attention_with_doubled_query_weights(tempered):
    """Independent identity: ``softmax(q k^T / (0.5 sqrt d))`` is standard scoring of ``2 q``, and RoPE is linear,
    so the tempered model equals a standard model whose query weights are doubled (float64)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, attention="tempered")).double().eval()
    std = GPT(GPTConfig(**SMALL)).double().eval()
    std.load_state_dict(model.state_dict())  # a rule without parameters: the same state dict
    with torch.no_grad():
        for block in std.blocks:
            block.attn.qkv.weight[: 4 * 8] *= 2.0
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), std(idx), rtol=1e-10, atol=1e-10)
        attn = next(model.trace(idx)).record.attn
    assert attn.shape == (2, 4, 12, 12)  # the diagnostics see the rule's probabilities
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, 12, dtype=attn.dtype))


@pytest.mark.slow
def test_tempered_trains_decodes_and_round_trips_through_hugging_face(tempered, tiny_corpus, tmp_path):
    common = _train_args(tiny_corpus, tmp_path)
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                *common,
                "--max-steps",
                "2",
                "--out-dir",
                str(run),
                "--attention",
                "coupled_tempered",
                "--set",
                "n_steps=2",
            ]
        )
        == 0
    )
    from coupled_qk import load_run

    loaded = load_run(run)
    assert loaded.model.config.attention == "coupled_tempered" and loaded.model.config.qk_map.n_steps == 2
    _check_decoding_and_hf_round_trip(loaded.model, tmp_path)


def test_a_broken_plugin_is_a_one_line_error_of_every_command(tmp_path, monkeypatch, capsys):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[coupled_qk.variants]\nbroken = no_such_module_xyz:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with registry.isolated():
        assert main(["describe", "--preset", "tiny"]) == 2  # was a traceback from building the parser
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("coupled-qk describe: error: the 'coupled_qk.variants' entry point")
    assert "No module named 'no_such_module_xyz'" in err and "distribution 'broken-plugin'" in err
    with registry.isolated(), pytest.raises(registry.PluginError, match="broken = 'no_such_module_xyz:register'"):
        registry.attention_names()  # Python callers get the exception (a RuntimeError)


def test_a_config_saved_with_a_plugin_attention_names_the_plugin_where_it_is_missing(tmp_path, monkeypatch):
    """``eval``/``export`` of a run trained with a plugin after the plugin was uninstalled said only "unknown
    attention": the saved configs (``model_config.json``, an export's ``config.json``) record the registering
    module and distribution, and the error names them; an unknown ``--set`` option says where options come from."""
    from coupled_qk.hf.configuration import CoupledQKConfig

    with monkeypatch.context() as m:
        m.syspath_prepend(str(PLUGIN))
        with registry.isolated():
            cfg = GPTConfig(attention="drift", gain=2.0, **SMALL)
            cfg.save(tmp_path / "model_config.json")
            CoupledQKConfig.from_gpt_config(cfg).save_pretrained(tmp_path / "hf")
            assert GPTConfig.load(tmp_path / "model_config.json") == cfg  # loads where the plugin is installed
            GPTConfig(**SMALL).save(tmp_path / "builtin.json")
        sys.modules.pop("coupled_qk_drift", None)
    recorded = [{"attention": "drift", "module": "coupled_qk_drift", "distribution": "coupled-qk-drift"}]
    assert json.loads((tmp_path / "model_config.json").read_text())["registered_by"] == recorded
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["registered_by"] == recorded
    assert "registered_by" not in json.loads((tmp_path / "builtin.json").read_text())
    said = r"attention 'drift' as registered by module 'coupled_qk_drift' \(distribution 'coupled-qk-drift'\)"
    with pytest.raises(ValueError, match=rf"model_config.json: GPTConfig.attention='drift' is unknown.*{said}"):
        GPTConfig.load(tmp_path / "model_config.json")
    with pytest.raises(ValueError, match=said):
        CoupledQKConfig.from_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match=r"--set gain=2: unknown GPTConfig field.*another package's attention"):
        parse_overrides(["gain=2"])
