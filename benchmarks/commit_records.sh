#!/usr/bin/env bash
# Commit each study record as it is written (what `coupled-qk claims --commit-records` used to do inside the
# library; the library runs no git). Run it beside the study, from the repository root:
#
#   coupled-qk study run cpu-converged &            # or: coupled-qk claims --protocol cpu-converged
#   bash benchmarks/commit_records.sh cpu-converged  # commits every new record under docs/results/claims/runs/
#
# Arguments: STUDY [OUT_DIR (default docs/results/claims)] [SECONDS between looks (default 60)]. With ONCE=1 it
# commits what is there and exits. A record is committed alone (`git commit --only`), with a message naming the run
# and no result (a pre-registered study reads nothing before its cell is complete, the log included); a commit
# refused because another git process holds the index is retried.
set -euo pipefail
study=${1:?usage: bash benchmarks/commit_records.sh STUDY [OUT_DIR] [SECONDS]}
out=${2:-docs/results/claims}
every=${3:-60}
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "commit_records.sh: $(pwd) is not inside a git work tree; run it from the repository that holds $out" >&2
  exit 2
fi
if [ ! -d "$out" ]; then
  echo "commit_records.sh: $out is not a folder (the study's --out-dir)" >&2
  exit 2
fi
commit_new() {
  local f msg
  while IFS= read -r -d '' f; do
    git ls-files --error-unmatch -- "$f" >/dev/null 2>&1 && continue  # committed already
    msg=$(python3 - "$f" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['protocol']}: {r['cell']} {r['variant']} seed {r['seed']} (record)")
PY
    ) || { echo "commit_records.sh: $f is not a readable record; left uncommitted" >&2; continue; }
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
      if git add -- "$f" && git commit -q --only -m "$msg" -- "$f"; then
        echo "committed $f"
        break
      fi
      sleep $((2 + attempt))
    done
  done < <(find "$out/runs/$study" -name 'seed*.json' -print0 2>/dev/null | sort -z)
}
while true; do
  commit_new
  [ "${ONCE:-0}" = 1 ] && break
  sleep "$every"
done
