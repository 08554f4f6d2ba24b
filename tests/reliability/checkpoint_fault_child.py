"""Child process of ``test_fault_injection.py::test_a_kill_inside_a_checkpoint_write_*``: runs ``coupled-qk train``
with the checkpoint writer instrumented so that, inside save number ``save`` (1-based), at ``phase``, it leaves the
files exactly as a kill at that moment would (a file cut at a byte, a temporary file half written, part of an
old checkpoint deleted), writes the marker file and sleeps until the parent SIGKILLs it.

Usage: ``python checkpoint_fault_child.py MARKER FAULT_JSON -- <train arguments>`` where ``FAULT_JSON`` is
``{"save": k, "phase": ..., "file": name, "fraction": f}``. Phases (the order of a save,
``training.run_folder.RunFolder.save``):

- ``file``: while writing ``file`` into the hidden temporary folder: the file holds its first ``fraction`` of bytes;
- ``checksums``: while writing ``checksums.json`` (the last file of the folder), cut the same way;
- ``rename``: the hidden folder is complete, not yet renamed to ``ckpt-*``;
- ``latest``: the new ``ckpt-*`` folder is in place, ``latest`` is being replaced (its temporary file half written);
- ``prune``: ``latest`` names the new checkpoint; older ones are being deleted (``fraction`` of an old folder's
  files are gone).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from coupled_qk.training import checkpoint_format, run_folder


def pause(marker: str) -> None:
    """Tell the parent where we stopped and wait for its SIGKILL."""
    Path(marker).write_text("paused\n")
    time.sleep(600)
    os._exit(3)  # never reached in the test: the parent kills first


def cut(path: Path, fraction: float) -> None:
    """Keep the first ``fraction`` of ``path``'s bytes (what a kill during its write leaves)."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def instrument(marker: str, fault: dict) -> None:
    """Patch the checkpoint writer so that save ``fault["save"]`` stops at ``fault["phase"]``."""
    count = {"saves": 0}
    real_write_folder, real_write_text = checkpoint_format.write_folder, run_folder.write_text_atomic
    real_prune = run_folder.RunFolder.prune
    fraction = fault["fraction"]

    def target() -> bool:
        return count["saves"] == fault["save"]

    def write_folder(run_dir, files, tmp_prefix, final_name):
        if tmp_prefix.startswith(".ckpt-"):
            count["saves"] += 1
        if not target():
            return real_write_folder(run_dir, files, tmp_prefix, final_name)
        if fault["phase"] == "file":

            def cut_writer(name, write):
                def run(path):
                    write(path)
                    if name == fault["file"]:
                        cut(path, fraction)
                        pause(marker)

                return run

            files = {name: cut_writer(name, write) for name, write in files.items()}

        def named():
            if fault["phase"] in ("checksums", "rename"):
                tmp = next(Path(run_dir).glob(tmp_prefix + "*"))
                if fault["phase"] == "checksums":
                    cut(tmp / checkpoint_format.CHECKSUMS, fraction)
                pause(marker)
            return final_name()

        return real_write_folder(run_dir, files, tmp_prefix, named)

    def write_text_atomic(path, text):
        if target() and fault["phase"] == "latest" and Path(path).name == "latest":
            tmp = Path(path).parent / ".latest.killed.tmp"
            tmp.write_text(text[: int(len(text) * fraction)])
            pause(marker)
        return real_write_text(path, text)

    def prune_checkpoints(run, keep):
        run_dir = run.path
        if target() and fault["phase"] == "prune":
            latest = (Path(run_dir) / "latest").read_text().strip()
            old = sorted(f for f in Path(run_dir).glob("ckpt-*") if f.name != latest)
            if old:
                files = sorted(p for p in old[0].iterdir())
                for p in files[: int(len(files) * fraction)]:
                    p.unlink()
            pause(marker)
        return real_prune(run, keep)

    checkpoint_format.write_folder = write_folder
    run_folder.write_text_atomic = write_text_atomic
    run_folder.RunFolder.prune = prune_checkpoints


def main() -> int:
    """Instrument the writer as the arguments say and run ``coupled-qk train``."""
    marker, fault_json, sep, *train_args = sys.argv[1:]
    assert sep == "--"
    instrument(marker, json.loads(fault_json))
    from coupled_qk.cli import main as cli_main

    return cli_main(train_args)


if __name__ == "__main__":
    sys.exit(main())
