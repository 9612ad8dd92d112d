#!/usr/bin/env bash
# Collective autotuning on a GPU, as users run it: test/inductor/test_collective_cuda.py
# (gloo with CUDA tensors at 2-4 ranks on cuda:0, NCCL and a bare init_process_group() at 1 rank,
# V1 and V2), then the demo with --device cuda at 1 rank (NCCL) and 2 ranks (gloo, one GPU).
# Prints one table: configuration x ranks x path, the winner, whether every rank agreed and the
# result was exact, the seconds, the timer and each candidate's agreed time.  Exits non-zero when
# anything failed.
#
#   ./scripts/gpu_check.sh                      with .venv/bin/python, else python3
#   PYTHON=python ./scripts/gpu_check.sh        on the lent GPU machine, after
#                                               ../shared/tools/gpu/prepare.sh's install.sh
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
out=${GPU_CHECK_DIR:-$(mktemp -d)}
mkdir -p "$out"
report=$out/decisions.jsonl
: > "$report"
failed=()

echo "== test/inductor/test_collective_cuda.py (logs: $out/tests.log)"
if ! COLLECTIVE_GPU_REPORT=$report OMP_NUM_THREADS=1 \
  "$python" -m pytest -q -rA test/inductor/test_collective_cuda.py > "$out/tests.log" 2>&1; then
  failed+=("test_collective_cuda.py")
fi
tail -n 3 "$out/tests.log"

for nproc in 1 2; do
  echo "== the demo, --device cuda, $nproc rank(s) (log: $out/demo$nproc.log)"
  if ! OMP_NUM_THREADS=1 timeout 900 "$python" -m torch.distributed.run --standalone \
    --nproc-per-node "$nproc" scripts/demo_collective_autotuning.py --device cuda \
    --numel 65536 --nruns 10 > "$out/demo$nproc.log" 2>&1; then
    failed+=("demo at $nproc rank(s)")
  fi
done

"$python" - "$out" <<'PY'
import json, re, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
for nproc in (1, 2):
    log = (out / f"demo{nproc}.log").read_text(errors="replace")
    for kind, winner, rule, agreed, total, timer in re.findall(
        r"^(\w+): winner: (\S+), by the (.+?) rule \(agreed by (\d+)/(\d+) ranks; timed with (.+)\)$",
        log, re.M,
    ):
        rows.append({"configuration": "demo " + ("nccl" if nproc == 1 else "gloo"), "ranks": nproc,
                     "path": "V2", "test": "demo", "op": kind, "winner": winner,
                     "agreed": agreed == total, "exact": True, "seconds": None,
                     "timer": timer, "candidates": {}})
print("\n| configuration | ranks | path | test | op | winner | agreed | exact | s | timer | candidates (ms) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    times = ", ".join(f"{name.split(':', 1)[-1][-24:]} {ms:.3f}" if ms is not None else f"{name} -"
                      for name, ms in sorted(r["candidates"].items(), key=lambda i: i[1] or 1e9))
    print(f"| {r['configuration']} | {r['ranks']} | {r['path']} | {r['test']} | {r['op'][:40]} "
          f"| {str(r['winner']).split(':', 1)[-1][-32:]} | {'yes' if r['agreed'] else 'NO'} "
          f"| {'yes' if r['exact'] else 'NO'} | {r['seconds'] or ''} | {r['timer']} | {times} |")
PY

if [ ${#failed[@]} -gt 0 ]; then
  printf 'gpu_check: FAILED: %s\n' "${failed[*]}" >&2
  exit 1
fi
echo "gpu_check: every check passed"
