"""lm-evaluation-harness through the documented command, offline, on local tasks, against our own recomputation."""

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

from coupled_qk import GPT, GPTConfig  # noqa: E402
from coupled_qk.data.tokenizers import train_bpe  # noqa: E402
from coupled_qk.hf import CoupledQKForCausalLM  # noqa: E402
from coupled_qk.hf.export import hf_tokenizer  # noqa: E402
from coupled_qk.hf.harness import make_task, text_documents  # noqa: E402

WORDS = "the cat sat on the mat while a dog ran in the park and birds sang over green hills".split()


def make_text(n_docs: int, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    return (
        "\n\n".join(" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (30,), generator=g)) for _ in range(n_docs))
        + "\n"
    )


SST2 = [
    "a gripping , funny film\t1",
    "dull and lifeless\t0",
    "the best thing this year\t1",
    "a mess from start to end\t0",
    "warm and wise\t1",
]


def test_text_documents_split_wikitext_articles_and_paragraphs(tmp_path):
    wiki = tmp_path / "w.txt"
    wiki.write_text(" = A = \n\n one two \n\n = = Sub = = \n\n three \n = B = \n\n four \n")
    assert text_documents(wiki) == [" = A = \n\n one two \n\n = = Sub = = \n\n three ", " = B = \n\n four "]
    plain = tmp_path / "p.txt"
    plain.write_text("first para\nline\n\n\nsecond\n")
    assert text_documents(plain) == ["first para\nline", "second"]
    with pytest.raises(ValueError, match="max_docs=0"):
        make_task("perplexity", plain, tmp_path, max_docs=0)
    bad = tmp_path / "bad.tsv"
    bad.write_text("fine\t1\nno label here\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected 'sentence<TAB>0\|1'"):
        make_task("sst2", bad, tmp_path)


@pytest.mark.parametrize("kind", ["perplexity", "sst2"])
@pytest.mark.parametrize(
    "source,message",
    [
        ("folder", "is a folder; expected a file"),
        ("missing.txt", "does not exist"),
        ("latin1.txt", "is not UTF-8 text (byte 9"),
    ],
)
def test_make_task_source_errors_are_one_line_naming_the_file(tmp_path, capsys, kind, source, message):
    from coupled_qk.hf.harness import main

    (tmp_path / "folder").mkdir()
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 ok\n".encode("utf-8") + b"\xff\xfe")
    assert main(["make-task", kind, str(tmp_path / source), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("make-task: error: ") and message in err and source in err and "\n" not in err


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_text_documents_split_headings_without_wikitext_spaces(tmp_path, newline):
    # the heading pattern needed WikiText's trailing space (" = Title = "): a file whose headings lack it was read as
    # blank-line paragraphs (every paragraph its own document), and a section heading must still not split
    wiki = tmp_path / "w.txt"
    lines = ["= A =", "", "one two", "", " = = Sub = =", "", "three", " = B =", "", "four", "= C =", "five", ""]
    wiki.write_bytes(newline.join(lines).encode())
    assert text_documents(wiki) == ["= A =\n\none two\n\n = = Sub = =\n\nthree", " = B =\n\nfour", "= C =\nfive"]


def test_a_bad_model_argument_of_a_run_is_one_line(monkeypatch, capsys):
    """``run ... --model_args pretrained=...,max_gen_toks=0`` printed lm-eval's traceback; a ValueError from a
    model argument is one line and exit code 2."""
    import lm_eval.__main__

    from coupled_qk.hf.harness import main

    def refuse():
        raise ValueError("max_gen_toks=0 must be a positive integer smaller than the model's context")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", refuse)
    assert main(["run", "--model", "hf", "--model_args", "pretrained=x,max_gen_toks=0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lm-eval: error: max_gen_toks=0 must be a positive integer smaller than the model's context"
    )


def test_a_missing_model_folder_is_one_line(tmp_path, capsys):
    """``pretrained=`` a folder without weights (or no folder at all) printed transformers' OSError traceback."""
    from coupled_qk.hf.harness import main

    folder = tmp_path / "weightless"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"model_type": "gpt2", "vocab_size": 300, "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 64}'
    )
    hf_tokenizer(train_bpe(make_text(50, 0), 300), 64).save_pretrained(folder)  # the tokenizer is read first
    sst = tmp_path / "sst.tsv"
    sst.write_text("\n".join(SST2) + "\n")
    make_task("sst2", sst, tmp_path / "tasks", name="local_sst2")
    code = main(
        [
            "run",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={folder},dtype=float32",
            "--tasks",
            "local_sst2",
            "--include_path",
            str(tmp_path / "tasks"),
            "--device",
            "cpu",
            "--limit",
            "1",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("lm-eval: error: ") and "model.safetensors" in err[-1], err[-3:]
    assert str(folder) in err[-1] and "Traceback" not in "\n".join(err)


def _loglik(model: GPT, context: list[int], continuation: list[int]) -> float:
    ids = torch.tensor([context + continuation])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1]).double(), -1)[0]
    n = len(context)
    return sum(logp[n - 1 + i, t].item() for i, t in enumerate(continuation))


@pytest.mark.slow
def test_lm_eval_command_on_local_tasks_matches_our_recomputation(tmp_path):
    tok = train_bpe(make_text(200, 0), 300)
    torch.manual_seed(0)
    gpt = GPT(
        GPTConfig(
            vocab_size=tok.vocab_size,
            block_size=128,
            n_layer=1,
            d_model=32,
            n_heads=2,
            attention="coupled",
            dt_init=0.5,
        )
    ).eval()
    hf_dir = tmp_path / "model"
    eot = tok.eot_id
    CoupledQKForCausalLM.from_gpt(gpt, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot).save_pretrained(hf_dir)
    hf_tokenizer(tok, 128).save_pretrained(hf_dir)
    text = tmp_path / "docs.txt"
    text.write_text("\n\n".join(" ".join(make_text(1, s).split()[:12]) for s in range(4)) + "\n")
    sst = tmp_path / "sst.tsv"
    sst.write_text("sentence\tlabel\n" + "\n".join(SST2) + "\n")
    tasks = tmp_path / "tasks"
    make_task("perplexity", text, tasks, name="local_ppl")
    make_task("sst2", sst, tasks, name="local_sst2")
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "coupled_qk.hf.harness",
        "run",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={hf_dir},backend=causal,dtype=float32",
        "--tasks",
        "local_ppl,local_sst2",
        "--include_path",
        str(tasks),
        "--device",
        "cpu",
        "--batch_size",
        "2",
        "--output_path",
        str(out),
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "ds_cache"),
    }
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    files = list(out.rglob("results_*.json"))
    assert len(files) == 1, res.stdout[-2000:]
    results = json.loads(files[0].read_text())["results"]

    # word perplexity: every document fits one window, predicted after the <|endoftext|> prefix token
    total_ll, total_words = 0.0, 0
    for doc in text_documents(text):
        total_ll += _loglik(gpt, [eot], tok.encode(doc))
        total_words += len(re.split(r"\s+", doc))
    ppl = results["local_ppl"]["word_perplexity,none"]
    assert ppl == pytest.approx(math.exp(-total_ll / total_words), rel=1e-4)

    # accuracy: the choice whose " negative" / " positive" continuation is more likely
    correct = 0
    for line in SST2:
        sentence, label = line.rsplit("\t", 1)
        ctx = tok.encode(f"{sentence}\nQuestion: Is this sentence positive or negative?\nAnswer:")
        scores = [_loglik(gpt, ctx, tok.encode(" " + c)) for c in ("negative", "positive")]
        correct += int(max(range(2), key=scores.__getitem__) == int(label))
    assert results["local_sst2"]["acc,none"] == pytest.approx(correct / len(SST2))


def test_fitting_max_gen_toks():
    from coupled_qk.hf.harness import fitting_max_gen_toks

    assert [fitting_max_gen_toks(n) for n in (2, 3, 128, 511, 512, 513, 2048)] == [1, 1, 64, 255, 256, 256, 256]
    with pytest.raises(ValueError, match="max_length=1 must be an integer >= 2"):
        fitting_max_gen_toks(1)


GEN_YAML = """task: local_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  do_sample: false
metric_list:
  - metric: exact_match
metadata:
  version: 1.0
"""


def _run_harness(args, tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "ds_cache"),
    }
    return subprocess.run(
        [sys.executable, "-m", "coupled_qk.hf.harness", "run", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.mark.slow
def test_generate_until_on_a_tiny_model_fits_the_context(tmp_path):
    """A generate_until task that sets no length, on a `tiny` model (context 128 <= lm-eval's 256): the entry point
    picks max_gen_toks = 64 with a notice, and lm-eval's answers are our own greedy continuations."""
    from transformers import AutoTokenizer

    tok = train_bpe(make_text(200, 0), 300)
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size, attention="coupled", dt_init=0.5)).eval()
    assert gpt.config.block_size == 128
    hf_dir = tmp_path / "model"
    eot = tok.eot_id
    CoupledQKForCausalLM.from_gpt(gpt, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot).save_pretrained(hf_dir)
    hf_tokenizer(tok, 128).save_pretrained(hf_dir)
    docs = [{"question": " ".join(make_text(1, s).split()[:n]), "answer": "the"} for s, n in ((1, 5), (2, 9), (3, 3))]
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tasks / "local_gen.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tasks / "local_gen.yaml").write_text(GEN_YAML.format(data=json.dumps(str(data))))
    out = tmp_path / "out"
    args = [
        "--model",
        "hf",
        "--model_args",
        f"pretrained={hf_dir},backend=causal,dtype=float32",
        "--tasks",
        "local_gen",
        "--include_path",
        str(tasks),
        "--device",
        "cpu",
        "--batch_size",
        "3",
        "--output_path",
        str(out),
        "--log_samples",
    ]
    res = _run_harness(args, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "coupled-qk: max_gen_toks=64 (half the model's context of 128 tokens" in res.stderr
    samples = [json.loads(line) for f in out.rglob("samples_local_gen_*.jsonl") for line in f.read_text().splitlines()]
    assert len(samples) == 3
    hf_tok = AutoTokenizer.from_pretrained(hf_dir)
    for s in samples:
        prompt = torch.tensor([tok.encode(s["doc"]["question"])])
        new = gpt.generate(prompt, 64, temperature=0)[0, prompt.shape[1] :].tolist()
        new = new[: new.index(eot)] if eot in new else new
        assert s["resps"][0][0] == hf_tok.decode(new).split("\n")[0]

    # an explicit length is used as given; one that does not fit is refused naming it (in process: no lm-eval run)
    from coupled_qk.hf.harness import lm_class

    def lm(**kw):
        return lm_class()(pretrained=str(hf_dir), backend="causal", dtype="float32", device="cpu", **kw)

    assert lm(max_gen_toks=8).max_gen_toks == 8
    with pytest.raises(
        ValueError, match="max_gen_toks=128 must be a positive integer smaller than the model's context of 128 tokens"
    ):
        lm(max_gen_toks=128)


def test_a_retrofitted_folder_is_scored_with_its_coupling(tmp_path):
    """lm-eval's ``from_pretrained`` of a retrofitted GPT-2 folder dropped the coupling weights (only a load report
    said so) and scored the base model; ``--model hf`` now restores the saved dynamics."""
    import transformers

    from coupled_qk.hf import load_retrofitted, retrofit
    from coupled_qk.hf.harness import lm_class

    tok = train_bpe(make_text(50, 0), 300)
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=tok.vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    ).eval()
    retrofit(gpt2, dt_init=0.7, integrator="leapfrog")
    folder = tmp_path / "retro"
    gpt2.save_pretrained(folder)
    hf_tokenizer(tok, 64).save_pretrained(folder)
    lm = lm_class()(pretrained=str(folder), backend="causal", dtype="float32", device="cpu", batch_size=1)
    x = torch.tensor([tok.encode("the cat sat on the mat")])
    with torch.no_grad():
        expected = gpt2(x).logits
        assert torch.equal(lm.model(x).logits, expected)
        assert torch.equal(load_retrofitted(folder)(x).logits, expected)
        plain = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        assert not torch.allclose(plain(x).logits, expected)  # what a plain load scores: not the saved model


def test_a_model_folder_without_tokenizer_files_is_refused(tmp_path):
    """``transformers`` builds an empty tokenizer for a GPT-2 folder without tokenizer files; lm-eval then scored
    every document as certain (word perplexity 1.0) and exited 0. Now a one-line ValueError names the folder."""
    import transformers

    from coupled_qk.hf.harness import lm_class

    torch.manual_seed(0)
    folder = tmp_path / "no_tokenizer"
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    ).save_pretrained(folder)
    with pytest.raises(
        ValueError,
        match=r"tokenizer of '.*no_tokenizer' encodes text to no tokens "
        r"\(vocabulary of \d+\).*tokenizer=PATH",
    ):
        lm_class()(pretrained=str(folder), backend="causal", dtype="float32", device="cpu", batch_size=1)
    hf_tokenizer(train_bpe(make_text(50, 0), 300), 64).save_pretrained(folder)
    lm = lm_class()(pretrained=str(folder), backend="causal", dtype="float32", device="cpu", batch_size=1)
    assert lm.tok_encode("the cat sat")
