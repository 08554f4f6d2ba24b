"""GLUE fine-tuning in the one training loop: classifier pooling and padding, batches, errors, end to end."""

import json
import random
import re

import numpy as np
import pytest
import torch

from coupled_qk.data.tokenizers import train_bpe
from coupled_qk.models.config import GPTConfig
from coupled_qk.models.gpt import GPT
from coupled_qk.training.config import TrainConfig
from coupled_qk.training.loop import train
from coupled_qk.training.run_folder import RunFolder
from coupled_qk.training.tasks.glue import PAD_ID, GlueTask, SequenceClassifier, pad_batch

GOOD = "great fine lovely superb nice".split()
BAD = "awful poor dull boring bad".split()
FILL = "the movie was and it felt a bit like story".split()


def make_pretrained(root, vocab=300, attention="standard", block_size=32):
    """A 'pretrained' run folder: a random-init tiny GPT checkpoint and a small BPE tokenizer."""
    tok = train_bpe(" ".join(GOOD + BAD + FILL) * 40, vocab)
    cfg = GPTConfig.from_preset(
        "tiny", vocab_size=tok.vocab_size, n_layer=1, d_model=32, n_heads=2, block_size=block_size, attention=attention
    )
    torch.manual_seed(0)
    RunFolder(root).save(GPT(cfg).state_dict(), cfg, None, {"step": 0})
    tok.save(root / "tokenizer")
    return root


def write_sst2(glue_dir, n_train=400, n_dev=100, seed=0):
    """An easy SST-2-layout task: label 1 iff the sentence holds a 'good' word; 30% / 70% class balance."""
    rng = random.Random(seed)
    (glue_dir / "SST-2").mkdir(parents=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", 0), ("test.tsv", n_dev)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = int(rng.random() < 0.3)
            words = rng.choices(FILL, k=rng.randint(3, 8)) + [rng.choice(GOOD if label else BAD)]
            rng.shuffle(words)
            rows.append(" ".join(words) + f"\t{label}")
        (glue_dir / "SST-2" / name).write_text("\n".join(rows) + "\n")
    return glue_dir


@pytest.fixture
def setup(tmp_path):
    return make_pretrained(tmp_path / "pre"), write_sst2(tmp_path / "glue")


def glue_cfg(pre, glue_dir, out, **kw):
    opts = {"glue_task": "sst2", "pretrained": str(pre), "glue_dir": str(glue_dir), **kw.pop("task_options", {})}
    base = dict(
        task="glue",
        batch_size=16,
        max_steps=60,
        warmup_steps=5,
        lr=3e-3,
        weight_decay=0.01,
        min_lr_ratio=0.0,
        eval_interval=30,
        log_interval=10,
        out_dir=str(out),
        progress=False,
        tensorboard=False,
        task_options=opts,
    )
    return TrainConfig.from_dict({**base, **kw})


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_classifier_ignores_padding_and_pools_as_documented(pooling):
    cfg = GPTConfig.from_preset(
        "tiny", vocab_size=50, n_layer=2, d_model=32, n_heads=2, block_size=16, attention="coupled"
    )
    torch.manual_seed(0)
    gpt = GPT(cfg).double()
    reference = GPT(cfg).double()
    reference.load_state_dict(gpt.state_dict())
    model = SequenceClassifier(gpt, 3, pooling).double().eval()
    rows = [[5, 6, 7], [8, 9, 10, 11, 12, 13]]
    batched = model(pad_batch(rows))
    for i, r in enumerate(rows):  # each row alone (no padding) gives the same logits
        alone = model(torch.tensor([r]))
        torch.testing.assert_close(batched[i : i + 1], alone, rtol=0, atol=1e-12)
        # float64 recomputation from the unmodified GPT: final-LayerNorm hidden states by forward hook
        seen = []
        hook = reference.ln_f.register_forward_hook(lambda m, a, out, store=seen: store.append(out))
        reference(torch.tensor([r]))
        hook.remove()
        h = seen[0][0]
        pooled = h[-1] if pooling == "last" else h.mean(0)
        torch.testing.assert_close(alone[0], model.head(pooled), rtol=0, atol=1e-12)
    assert pad_batch(rows)[0].tolist() == [5, 6, 7, PAD_ID, PAD_ID, PAD_ID]
    with pytest.raises(ValueError, match="right-padded"):
        model(torch.tensor([[PAD_ID, 5, 6]]))
    with pytest.raises(ValueError, match="pooling='max'"):
        SequenceClassifier(GPT(cfg), 2, "max")


def test_batches_are_pure_and_cover_each_epoch(setup, tmp_path):
    pre, glue_dir = setup
    cfg = glue_cfg(
        pre, glue_dir, tmp_path / "run", seed=3, grad_accum=2, batch_size=4, task_options={"max_train_examples": 64}
    )
    task = GlueTask(cfg)
    assert len(task.train_ids) == 64 and task.describe()["train_examples_total"] == 400
    # two ranks of batch 4 with grad_accum 2: steps 0-3 are one epoch's 64 rows, steps 4-7 the next epoch
    seen = []
    for step in range(8):
        for micro in range(2):
            for rank in range(2):
                x, y = task.train_batch(step, micro, rank, 2, 4, "cpu")
                x2, y2 = GlueTask(cfg).train_batch(step, micro, rank, 2, 4, "cpu")
                assert torch.equal(x, x2) and torch.equal(y, y2)
                assert x.shape[0] == 4 and y.dtype == torch.long
                for row, label in zip(x.tolist(), y.tolist(), strict=True):
                    ids = [i for i in row if i != PAD_ID]
                    seen.append(tuple(ids))
                    assert label == task.train_split.labels[task.train_ids.index(ids)]
    every = sorted(tuple(r) for r in task.train_ids)
    assert sorted(seen[:64]) == every and sorted(seen[64:]) == every  # each row once per epoch
    assert task.step_tokens(5, 2) == sum(len(r) for r in seen[80:96])  # real tokens of step 5's 16 rows
    assert seen[:64] != seen[64:]  # a new permutation per epoch


def test_end_to_end_beats_majority_and_reports(setup, tmp_path):
    pre, glue_dir = setup
    res = train(glue_cfg(pre, glue_dir, tmp_path / "run"))
    final, data = res["final"], res["data"]
    assert data["dev_majority"]["accuracy"] == pytest.approx(max(data["dev_label_counts"]) / 100)
    assert final["dev/examples"] == 100
    assert final["dev/accuracy"] >= 0.9 > data["dev_majority"]["accuracy"] + 0.1
    assert data["truncated"] == {"train": 0, "dev": 0}
    saved = json.loads((tmp_path / "run" / "data.json").read_text())
    assert saved["tokenizer_fingerprint"] == data["tokenizer_fingerprint"]
    assert (
        res["params"]
        == sum(p.numel() for p in GPT(GPTConfig.load(pre / "ckpt-00000000" / "model_config.json")).parameters())
        + 2 * 32
        + 2
    )
    # resume: a longer budget continues from the fine-tune's own checkpoint
    more = train(glue_cfg(pre, glue_dir, tmp_path / "run", max_steps=70, resume=True, on_budget_change="keep"))
    assert more["steps"] == 70


def test_resume_refuses_glue_files_that_changed_since_the_run_recorded_them(setup, tmp_path):
    """The kind of the LM check (RunFolder.check_data) for GLUE: a task file replaced after training changes the
    example and label counts recorded in data.json; the resume is refused before anything is written."""
    import shutil

    pre, glue_dir = setup
    train(glue_cfg(pre, glue_dir, tmp_path / "run", max_steps=4, stop_after_steps=2, eval_interval=2))
    recorded = (tmp_path / "run" / "data.json").read_text()
    shutil.rmtree(glue_dir / "SST-2")
    write_sst2(glue_dir, n_train=300, seed=1)
    with pytest.raises(
        ValueError,
        match=r"cannot resume .*: its data is not what it trained on \(.*data.json vs now: "
        r"train_examples_total: 400 recorded, 300 now; train_label_counts: ",
    ):
        train(glue_cfg(pre, glue_dir, tmp_path / "run", max_steps=4, resume=True, eval_interval=2))
    assert (tmp_path / "run" / "data.json").read_text() == recorded


def test_truncation_is_reported(tmp_path):
    pre = make_pretrained(tmp_path / "pre", block_size=8)
    glue_dir = write_sst2(tmp_path / "glue", n_train=40, n_dev=20)
    with pytest.warns(UserWarning) as caught:
        task = GlueTask(glue_cfg(pre, glue_dir, tmp_path / "run"))
    said = [str(w.message) for w in caught]
    assert any(re.match(r"GLUE sst2 train: \d+ of 40 examples truncated to 8 tokens", m) for m in said), said
    assert any(re.match(r"GLUE sst2 dev: \d+ of 20 examples truncated to 8 tokens", m) for m in said), said
    assert task.describe()["truncated"]["train"] > 0
    assert max(len(r) for r in task.train_ids) == 8


def test_clear_errors(setup, tmp_path):
    pre, glue_dir = setup
    with pytest.raises(ValueError, match="GLUE task 'qqp' is unknown"):
        GlueTask(glue_cfg(pre, glue_dir, tmp_path / "r", task_options={"glue_task": "qqp"}))
    with pytest.raises(ValueError, match="needs task_options.pretrained"):
        TrainConfig.from_dict(dict(task="glue", max_steps=1, task_options={"glue_task": "rte"})) and GlueTask(
            TrainConfig.from_dict(dict(task="glue", max_steps=1, task_options={"glue_task": "rte"}))
        )
    with pytest.raises(ValueError, match=r"unknown glue task_options 'lr'"):
        GlueTask(glue_cfg(pre, glue_dir, tmp_path / "r", task_options={"lr": 1}))
    with pytest.raises(FileNotFoundError, match="RTE/train.tsv is missing"):
        GlueTask(glue_cfg(pre, glue_dir, tmp_path / "r", task_options={"glue_task": "rte"}))
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        GlueTask(glue_cfg(tmp_path / "nothing", glue_dir, tmp_path / "r"))
    # a checkpoint whose run folder holds another tokenizer (another vocabulary)
    other = make_pretrained(tmp_path / "other", vocab=400)
    train_bpe(" ".join(GOOD + FILL) * 40, 280).save(other / "tokenizer")
    with pytest.raises(ValueError, match="was made with another tokenizer"):
        GlueTask(glue_cfg(other, glue_dir, tmp_path / "r"))
    (other / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"the run's tokenizer is missing: expected .*tokenizer\.json"):
        GlueTask(glue_cfg(other, glue_dir, tmp_path / "r"))
    assert np.all(GlueTask(glue_cfg(pre, glue_dir, tmp_path / "r")).dev_split.labels >= 0)


def test_evaluate_matches_row_by_row_scoring(setup, tmp_path):
    pre, glue_dir = setup
    task = GlueTask(glue_cfg(pre, glue_dir, tmp_path / "run", task_options={"eval_batch_size": 7}))
    torch.manual_seed(1)
    model = task.build_model(GPTConfig.load(pre / "ckpt-00000000" / "model_config.json"))
    model.eval()
    with torch.no_grad():  # a bias that splits the predictions between both classes
        margin = torch.cat([model(torch.tensor([ids])) for ids in task.dev_ids]).diff(dim=-1)
        model.head.bias[1] -= margin.median() + 1e-6
    out = task.evaluate(model, "cpu", quick=False)
    with torch.no_grad():
        logits = torch.cat([model(torch.tensor([ids])) for ids in task.dev_ids])
    labels = torch.from_numpy(task.dev_split.labels)
    preds = logits.argmax(-1)
    assert 0 < preds.sum() < len(preds)
    assert out["dev/accuracy"] == pytest.approx((preds == labels).double().mean().item(), abs=1e-12)
    assert out["dev/loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item(), rel=1e-5)
    model.train()
    assert task.evaluate(model, "cpu", quick=True)["dev/examples"] == 64
    assert model.training  # the mode is restored
