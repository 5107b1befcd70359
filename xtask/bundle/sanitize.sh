#!/usr/bin/env bash
# Runs every GPU test binary, on few small cases, under each compute-sanitizer tool;
# fails on any report. Logs go to $OUT (default ./results).
set -uo pipefail
cd "$(dirname "$0")"
out=${OUT:-$PWD/results}
mkdir -p "$out"
export PROPTEST_CASES=${PROPTEST_CASES:-4}
status=0
for tool in memcheck racecheck synccheck initcheck; do
  for t in bin/test-*; do
    log="$out/sanitize-$tool-$(basename "$t").log"
    # The tests provoke API errors on purpose (out of memory); the library checks them.
    compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 99 \
      "$t" --test-threads=1 > "$log" 2>&1
    rc=$?
    printf '%-10s %-24s exit %-3s %s\n' "$tool" "$(basename "$t")" "$rc" \
      "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
    if [ $rc -ne 0 ]; then status=1; tail -30 "$log"; fi
  done
done
exit $status
