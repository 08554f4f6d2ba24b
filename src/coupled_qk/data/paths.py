"""Where the real-text data and the token cache live.

Data: the project's offline corpora are kept outside the repository, at ``../shared/data`` relative to
the repository root (see that folder's ``README.md``). Users with the data elsewhere point
``COUPLED_QK_DATA`` (or a ``--data-dir`` command-line option) at it.
"""

from __future__ import annotations

from pathlib import Path

from coupled_qk.checks.environment import env_value

DATA_ENV = "COUPLED_QK_DATA"
CACHE_ENV = "COUPLED_QK_CACHE"


def _repo_root() -> Path:
    # this file is <repo>/src/coupled_qk/data/paths.py
    return Path(__file__).resolve().parents[3]


def data_dir_candidates() -> list[Path]:
    """Folders tried, in order, when ``COUPLED_QK_DATA`` is unset.

    Returns:
        ``[<cwd>/../shared/data, <repo root>/../shared/data]`` (absolute paths, not checked for existence).
    """
    return [Path.cwd() / ".." / "shared" / "data", _repo_root() / ".." / "shared" / "data"]


def default_data_dir() -> Path:
    """The folder holding the real-text data (``wiki-vital/``, ``pubmed/``, ``tokenizer/gpt2/`` ...).

    Order: the environment variable ``COUPLED_QK_DATA`` if set and non-empty; otherwise the first existing
    folder of :func:`data_dir_candidates` (``./../shared/data`` relative to the current directory, then
    ``<repo root>/../shared/data``).

    Returns:
        An absolute, resolved :class:`pathlib.Path` to an existing directory.

    Raises:
        FileNotFoundError: ``COUPLED_QK_DATA`` names something that is not a directory, or it is unset and
            none of the candidate folders exists; the message names the variable and every path tried.
    """
    env = env_value(DATA_ENV)  # declared in checks.environment.ENVIRONMENT; None when unset or blank
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"{DATA_ENV}={env!r} is not an existing directory; point it at the folder "
                "holding the data (e.g. .../shared/data) or unset it"
            )
        return path.resolve()
    tried = data_dir_candidates()
    for path in tried:
        if path.is_dir():
            return path.resolve()
    raise FileNotFoundError(
        f"no data directory found: {DATA_ENV} is not set and none of these exists: "
        + ", ".join(str(p.resolve()) for p in tried)
        + f". Set {DATA_ENV} or pass --data-dir / data_dir= explicitly."
    )


def default_cache_dir() -> Path:
    """The folder for token caches: ``COUPLED_QK_CACHE`` if set and non-empty, else ``~/.cache/coupled_qk``.

    Returns:
        An absolute :class:`pathlib.Path`; it is not created here (the writer creates it on first use).

    Raises:
        ValueError: ``COUPLED_QK_CACHE`` names a file, a path under a file, or a place that cannot be created or
            written (:func:`coupled_qk.checks.paths.output_location`), naming the variable and its value.
    """
    from coupled_qk.checks.paths import output_location

    env = env_value(CACHE_ENV)
    if env:
        return output_location(CACHE_ENV, env).absolute()
    return (Path.home() / ".cache" / "coupled_qk").absolute()
