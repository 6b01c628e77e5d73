#!/bin/sh
# Run one atheris harness for every format, one after the other (the machine is shared:
# nice). Usage: fuzz/run_all.sh engine|codec RUNS [OUTDIR] [reverse]
# A format whose log already exists in OUTDIR is skipped, so a second chain started with
# "reverse" shares the work from the other end. MAX_TIME=<seconds> also stops each format
# after that long (libFuzzer -max_total_time).
# Each format's log goes to OUTDIR/<harness>-<format>.log; libFuzzer's own corpus grows in
# OUTDIR/<harness>-<format>/ (the committed seeds in fuzz/corpus/<format> are read, not written).
set -u
harness=$1
runs=$2
out=${3:-/tmp/polymux-fuzz}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-$here/../.venv/bin/python}
order=${4:-forward}
formats=$("$py" -c "import sys, polymux; p = list(polymux.PROTOCOLS); print(' '.join(p[::-1] if sys.argv[1] == 'reverse' else p))" "$order")
mkdir -p "$out"
for fmt in $formats; do
    [ -e "$out/$harness-$fmt.log" ] && continue
    mkdir -p "$out/$harness-$fmt"
    start=$(date +%s)
    nice -n 10 "$py" "$here/fuzz_$harness.py" --format "$fmt" --seed-corpus \
        -atheris_runs="$runs" ${MAX_TIME:+-max_total_time=$MAX_TIME} -max_len=512 -timeout=10 -rss_limit_mb=1024 -print_final_stats=1 \
        -artifact_prefix="$out/crash-$harness-$fmt-" "$out/$harness-$fmt" >"$out/$harness-$fmt.log" 2>&1
    rc=$?
    end=$(date +%s)
    echo "$harness $fmt rc=$rc seconds=$((end - start)) $(grep -E '^Done|stat::number_of_executed_units' "$out/$harness-$fmt.log" | tr '\n' ' ')"
done
