"""A study from outside the package: two toy language models on PubMed abstracts, two seeds, one claim (coupled
against standard, paired by seed), reported as one verdict row. Data only: the engine does the rest."""

from coupled_qk.study.claims import Arm, Claim, PairedChange
from coupled_qk.study.design import Cell, Cells, Study
from coupled_qk.study.verdict_report import VerdictReport

TOY = dict(
    task="lm",
    corpus="pubmed",
    tokenizer="bpe-300",
    preset="tiny",
    model={"n_layer": 1, "d_model": 16, "n_heads": 2, "block_size": 32},
    batch_size=4,
    lr=3e-3,
    warmup_steps=1,
    max_steps=3,
    eval_interval=3,
    eval_batches=2,
    log_interval=1,
)

CELL = Cell("abstracts", TOY, ("standard", "coupled"), (0, 1), ("M1",), est_cpu_minutes=0.05)

STUDY = Study(
    "mini",
    "two toy models on PubMed abstracts (a study declared by a plugin)",
    (Cells((CELL,)),),
    (
        Claim(
            "M1",
            "coupled beats standard on abstracts",
            "-",
            PairedChange(Arm("abstracts", "standard"), Arm("abstracts", "coupled"), "test ppl, coupled vs standard, %"),
        ),
    ),
    VerdictReport(),
    notes=("A plugin's study: its notes live with it.",),
    default_out_dir="runs/mini",
    min_seeds=2,
)
