#!/usr/bin/env bash
# Runs on a GPU machine that has no Rust toolchain: `run.sh [all|tests|bench|python|group]`.
# tests: every GPU test binary; bench: PyTorch's baseline, then the benchmark beside it
# (and the GPU's clocks and power per row);
# python: installs the wheel into this PyTorch environment (offline), runs its tests and
# its benchmark (the seed models against the ModelNews); group (not in all): the
# device group's tests, torch.distributed over every GPU, then the group's benchmark.
# Logs and JSON go to $OUT (default ./results); ONLY=scan,conv limits the benchmark to
# those families. Exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")"
mode=${1:-all}
out=${OUT:-$PWD/results}
mkdir -p "$out"
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$out/gpu.txt"

if [ "$mode" = all ] || [ "$mode" = tests ]; then
  for t in bin/test-*; do
    echo "== $t"
    "$t" --test-threads=1 > "$out/$(basename "$t").log" 2>&1
    rc=$?
    grep -E "test result|SKIPPED|panicked|FAILED|failures:" "$out/$(basename "$t").log"
    if [ $rc -ne 0 ]; then status=1; fi
    if grep -q SKIPPED "$out/$(basename "$t").log"; then
      echo "GPU tests were skipped on a machine that should have a GPU"; status=1
    fi
  done
fi

if [ "$mode" = all ] || [ "$mode" = bench ]; then
  only=()
  if [ -n "${ONLY:-}" ]; then only=(--only "$ONLY"); fi
  python3 torch_baseline.py "${only[@]}" --json "$out/torch.json" || status=1
  # The clocks and power meanwhile, told per row afterwards (clocks.py).
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 50 > "$out/clocks.csv" 2>&1 &
  sampler=$!
  bin/bench "${only[@]}" --baseline "$out/torch.json" --json "$out/bench.json" | tee "$out/bench.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  kill "$sampler" 2> /dev/null
  [ -f "$out/bench.json" ] && python3 clocks.py "$out/bench.json" "$out/clocks.csv" | tee "$out/bench-clocks.txt"
fi
if [ "$mode" = all ] || [ "$mode" = python ]; then
  python3 -m pip install --quiet --no-index --force-reinstall --no-deps python/gpu_kernels-*.whl || status=1
  export SEED_MODELS=$PWD/python/seed_models.py
  (cd "$out" && python3 -m pytest -q -rs -p no:cacheprovider "$OLDPWD/python/tests") 2>&1 | tee "$out/pytest.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  # The per-call cost first in a process of its own, then everything in one process.
  python3 python/bench.py --only per-call --json "$out/python-per-call.json" | tee "$out/python-per-call.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  python3 python/bench.py --json "$out/python-bench.json" | tee "$out/python-bench.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ "$mode" = group ]; then
  bin/test-kernels group:: --test-threads=1 > "$out/group-tests.log" 2>&1 || status=1
  grep -E "test result|SKIPPED|panicked" "$out/group-tests.log"
  gpus=$(nvidia-smi --list-gpus | wc -l)
  python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" torch_distributed.py \
    --json "$out/torch-distributed.json" 2>&1 | tee "$out/torch-distributed.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  bin/bench --only group --reps "${REPS:-20}" --baseline "$out/torch-distributed.json" --json "$out/bench" \
    | tee "$out/bench-group.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit $status
