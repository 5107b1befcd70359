"""The GPU's clocks and power during each benchmark row: joins the rows' time windows
(`bench --json`'s `window_s`) with `nvidia-smi`'s samples taken meanwhile.

`python3 clocks.py BENCH_JSON SAMPLES_CSV`, the samples from
`nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
--format=csv,noheader,nounits -lms 50` on the same machine (its timestamps are local
time, as `datetime.timestamp` reads them). Prints a row per benchmark row: the median
SM clock, power and temperature over its window and the clock-event reasons seen most.
"""

import csv
import json
import statistics
import sys
from collections import Counter
from datetime import datetime


def samples(path):
    """(seconds since the epoch, SM MHz, watts, degrees C, reasons) per sample."""
    with open(path, newline="") as f:
        for fields in csv.reader(f):
            if len(fields) != 5:
                continue
            stamp, mhz, watts, celsius, reasons = (field.strip() for field in fields)
            try:
                at = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
                yield at, float(mhz), float(watts), float(celsius), reasons
            except ValueError:  # a header or a cut line
                continue


def main():
    bench_json, samples_csv = sys.argv[1:3]
    rows = json.loads(open(bench_json).read())["rows"]
    taken = list(samples(samples_csv))
    print(f"{'row':60} {'ms':>9} {'SM MHz':>7} {'W':>6} {'C':>4}  reasons (most seen)")
    for row in rows:
        start, end = row.get("window_s", (0, 0))
        inside = [s for s in taken if start <= s[0] <= end]
        if not inside:
            print(f"{row['key']:60} {row['median_ms']:9.3f}  (no samples)")
            continue
        mhz, watts, celsius = (statistics.median(s[i] for s in inside) for i in (1, 2, 3))
        reasons = Counter(s[4] for s in inside).most_common(1)[0][0]
        print(f"{row['key']:60} {row['median_ms']:9.3f} {mhz:7.0f} {watts:6.0f} {celsius:4.0f}  {reasons}")


if __name__ == "__main__":
    main()
