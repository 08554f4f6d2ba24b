import random

import pytest

WORDS = (
    "alpha beta gamma delta river mountain city music film history science cell protein gene "
    "patient study result the of and in to a is was for on with as by"
).split()


def _para(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + " ."


@pytest.fixture
def mini_data(tmp_path, monkeypatch):
    """A data folder in the layout of ../shared/data (wiki-vital, wikitext-2, pubmed, mixed-domain), synthetic
    and small, plus a private token cache (``COUPLED_QK_CACHE``)."""
    return build_mini_data(tmp_path, monkeypatch)


def build_mini_data(tmp_path, monkeypatch):
    """See :func:`mini_data`."""
    rng = random.Random(0)
    root = tmp_path / "data"
    for sub in ("wiki-vital", "wikitext-2", "pubmed", "mixed-domain"):
        (root / sub).mkdir(parents=True)
    arts = [f" = Article {i} = \n\n{_para(rng, 80)}\n\n{_para(rng, 60)}\n" for i in range(120)]
    (root / "wiki-vital" / "train.txt").write_text("\n".join(arts))
    for split in ("valid", "test"):
        (root / "wikitext-2" / f"{split}.txt").write_text(
            "\n".join(f" = Other {split} {i} = \n\n {_para(rng, 70)} \n" for i in range(6))
        )
    (root / "pubmed" / "abstracts.txt").write_text("\n\n".join(_para(rng, 90) for _ in range(400)) + "\n")
    for name in ("a", "b"):
        (root / "mixed-domain" / f"{name}.txt").write_text("\n\n".join(_para(rng, 50) for _ in range(200)) + "\n")
    monkeypatch.setenv("COUPLED_QK_CACHE", str(tmp_path / "cache"))
    return root
