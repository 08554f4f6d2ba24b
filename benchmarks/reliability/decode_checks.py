"""Decode speed of ``GPT.generate`` with the once-per-call argument checks against the previous version.

Interleaved in one process: each repeat times the current ``GPT.generate`` and the old one (loaded from
``OLD_GPT`` = a copy of ``src/coupled_qk/models/gpt.py`` before the checks, on the same model instance), in
alternating order; prints medians and the spread (min-max) of tokens/s. Usage:

    git show <commit before>:src/coupled_qk/models/gpt.py > /tmp/gpt_old.py
    OLD_GPT=/tmp/gpt_old.py PYTHONPATH=src python benchmarks/reliability/decode_checks.py
"""

import importlib.util
import os
import statistics
import sys
import time

import torch

from coupled_qk import GPT, GPTConfig
from coupled_qk.checks.tensors import check_generate_args

spec = importlib.util.spec_from_file_location("gpt_old", os.environ["OLD_GPT"])
old = importlib.util.module_from_spec(spec)
sys.modules["gpt_old"] = old
spec.loader.exec_module(old)

torch.set_num_threads(1)
torch.manual_seed(0)
model = GPT(GPTConfig.from_preset("tiny", attention="coupled", vocab_size=512, block_size=256)).eval()
prompt = torch.randint(0, 512, (1, 16))
new_tokens, repeats = int(os.environ.get("NEW_TOKENS", 64)), int(os.environ.get("REPEATS", 15))
rates = {"new": [], "old": []}
with torch.no_grad():
    for fn in (model.generate, lambda *a, **k: old.GPT.generate(model, *a, **k)):
        fn(prompt, 4, temperature=0)  # warm up
    for r in range(repeats):
        order = (("new", model.generate), ("old", lambda *a, **k: old.GPT.generate(model, *a, **k)))
        for name, fn in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            out = fn(prompt, new_tokens, temperature=0)
            rates[name].append(new_tokens / (time.perf_counter() - t0))
    assert torch.equal(out, old.GPT.generate(model, prompt, new_tokens, temperature=0))
    t0 = time.perf_counter()
    for _ in range(1000):
        check_generate_args(prompt, new_tokens, block_size=256, vocab_size=512, temperature=0.0)
    check_us = (time.perf_counter() - t0) * 1e3
for name, v in rates.items():
    print(f"{name}: median {statistics.median(v):.1f} tokens/s (min {min(v):.1f}, max {max(v):.1f}) over {repeats}")
print(f"ratio new/old (medians): {statistics.median(rates['new']) / statistics.median(rates['old']):.3f}")
print(f"check_generate_args alone: {check_us:.1f} us per call (1000 calls)")
