#!/usr/bin/env bash
# Reproduces the roofline tables of docs/performance.md: writes the TinyLlama-1.1B-shaped
# random-weight models (speed depends only on shapes and formats) and runs `kvllm bench` with
# its roofline on each, then prints the tables as Markdown. This script is the single source
# of those tables: after a kernel change, re-run it with --update-doc and commit the doc.
#
#   pp512 and tg128 for F16, Q8_0 and Q4_0 weights            (-r $REPS, default 3)
#   decode at depth 1 and $DEPTH (default 4096) with f16 and q8_0 KV and Q4_0 weights, then f16
#     KV with Q8_0 and F16 weights: attention at depth costs the same milliseconds whatever the
#     weights, so its share of a step is largest with the fastest step, Q4_0's
#     ($DEPTH_REPS runs of each, default 3, the four in turn: every run prefills $DEPTH tokens
#     first, minutes on 2 cores;
#     $DEPTH_STEPS timed steps a run, default 32: a second of decode against half a minute of
#     prefill, where 8 steps, a fifth of a second, moved by 20% between runs)
# Every run reads the weights into huge pages (--no-mmap), kvllm's fastest way to run.
#
# Usage: bench/performance.sh [--update-doc]
#   env: BUILD (build), THREADS (2), REPS (3), DEPTH (4096), DEPTH_REPS (3), DEPTH_STEPS (32),
#        MODELS ($BUILD/models)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
threads=${THREADS:-2}
reps=${REPS:-3}
depth=${DEPTH:-4096}
depth_reps=${DEPTH_REPS:-3}
depth_steps=${DEPTH_STEPS:-32}
models=${MODELS:-$build/models}
update_doc=0
[ "${1:-}" = "--update-doc" ] && update_doc=1
py=/usr/bin/python3
kvllm="$build/kvllm"
out="$build/performance"
mkdir -p "$models" "$out"

for t in f16 q8_0 q4_0; do
  m="$models/tinyllama-random-$t.gguf"
  if [ ! -f "$m" ]; then
    $py tools/make_model.py --preset tinyllama --type "$t" --seed 1 --out "$m.tmp"
    mv "$m.tmp" "$m"
  fi
done

for t in f16 q8_0 q4_0; do
  echo "performance: pp512/tg128, $t weights" >&2
  "$kvllm" bench -m "$models/tinyllama-random-$t.gguf" -t "$threads" -p 512 -n 128 -r "$reps" \
    --no-depths --no-mmap --json > "$out/pp-tg-$t.json"
done
depth_runs="q4_0:f16 q4_0:q8_0 q8_0:f16 f16:f16"  # weights:KV
# One run of each in turn, $depth_reps times: f16 and q8_0 KV are compared at the same minutes
# of the shared machine's bandwidth, not one's runs all before the other's.
rm -f "$out"/depth-*.json
for rep in $(seq "$depth_reps"); do
  for run in $depth_runs; do
    t=${run%:*} kv=${run#*:}
    echo "performance: decode at depth 1 and $depth, $t weights, $kv KV ($rep/$depth_reps)" >&2
    # -p 1 -n 1: the pp/tg rows of these runs are not part of the table.
    "$kvllm" bench -m "$models/tinyllama-random-$t.gguf" -t "$threads" -p 1 -n 1 \
      -r 1 --depths "1,$depth" --depth-steps "$depth_steps" --cache-only \
      -ctk "$kv" -ctv "$kv" \
      --no-mmap --json > "$out/depth-$t-$kv-$rep.json"
  done
done

$py - "$out" "$update_doc" "$depth_runs" "$depth_reps" <<'PY'
import datetime, json, os, re, statistics, sys

out, update_doc = sys.argv[1], sys.argv[2] == "1"
depth_runs = [run.split(":") for run in sys.argv[3].split()]
depth_reps = int(sys.argv[4])
load = lambda name: json.load(open(os.path.join(out, name)))
lines = []
p = lines.append

first = load("pp-tg-f16.json")
roof = first["roofline"]
p(f"Measured {datetime.date.today()} with {first['threads']} threads ({roof['simd']} kernels); "
  f"the roofline as measured by the first run: read bandwidth "
  f"{roof['read_bytes_per_s'] / 1e9:.1f} GB/s, FMA peak {roof['fma_flops_per_s'] / 1e9:.1f} "
  f"GFLOP/s, 8-bit dot peak {roof['int8_ops_per_s'] / 1e9:.0f} GOP/s, "
  f"kvllm f32 matmul (L2-resident) {roof['matmul_f32_flops_per_s'] / 1e9:.1f} GFLOP/s. "
  "Each run measures its own roofline, and its prefill limits use it; each decode step is "
  "judged against one pass of the read loop just before it (the ceiling column: the median "
  "over a row's runs of each run's bytes over seconds of those passes), and a row's limit and "
  "% of limit are the medians of each run's own.")
p("")
p("### Prefill and generation")
p("")
p("| weights | test | tokens/s (median) | min | max | limit tokens/s | % of limit | per token | ceiling |")
p("|---|---|--:|--:|--:|--:|--:|--:|--:|")
commands = []
for t in ("f16", "q8_0", "q4_0"):
    j = load(f"pp-tg-{t}.json")
    commands.append(j["command"])
    bw, peak = j["roofline"]["read_bytes_per_s"], j["roofline"]["fma_flops_per_s"]
    int8_peak = j["roofline"]["int8_ops_per_s"]
    for r in j["rows"]:
        pp = "flops_per_token" in r
        int8 = r.get("int8_ops_per_token", 0)
        cost = (f"{r['flops_per_token'] / 1e9:.2f} GFLOP" if pp
                else f"{r['bytes_per_token'] / 2**30:.3f} GiB")
        if pp and int8:
            cost = (f"{(r['flops_per_token'] - int8) / 1e9:.2f} GFLOP + "
                    f"{int8 / 1e9:.2f} G 8-bit ops")
        ceiling = (f"{peak / 1e9:.1f} GFLOP/s" if pp
                   else f"{r.get('read_bytes_per_s', bw) / 1e9:.2f} GB/s")
        if pp and int8:
            ceiling += f", {int8_peak / 1e9:.0f} GOP/s"
        p(f"| {j['weight_type']} | {r['test']} | {r['tokens_per_s']:.2f} | {r['min']:.2f} | "
          f"{r['max']:.2f} | {r['limit_tokens_per_s']:.2f} | "
          f"{100 * r['fraction_of_limit']:.1f}% | {cost} | {ceiling} |")
p("")
p("```sh")
lines.extend(commands)
p("```")
p("")
p("### Decode at depth")
p("")
p("| weights | KV | depth | ms/token (median) | ms added by depth | tokens/s | vs depth 1 (paired runs) | limit tokens/s | % of limit | bytes/token | KV share | ceiling |")
p("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
commands = [f"# each of these {depth_reps} times, one run of each in turn (bench/performance.sh); "
            "each figure is the median over the runs"]
for t, kv in depth_runs:
    runs = []
    for rep in range(1, depth_reps + 1):
        path = os.path.join(out, f"depth-{t}-{kv}-{rep}.json")
        if os.path.exists(path) and os.path.getsize(path):
            runs.append(json.load(open(path)))  # a run that failed or was stopped is left out
    if not runs:
        continue
    j = runs[0]
    commands.append(j["command"])
    weights = j["weight_bytes_per_token"]
    for i in range(len(j["depth"])):
        # Every numeric field the median over the runs; the ratios are each run's own (its
        # depth rows against its own depth-1 row), as kvllm bench does within one run.
        r = {key: statistics.median(run["depth"][i][key] for run in runs)
             for key, value in j["depth"][i].items() if isinstance(value, (int, float))}
        added = statistics.median(run["depth"][i]["cached_ms_per_token"] -
                                  run["depth"][0]["cached_ms_per_token"] for run in runs)
        bw = r["read_bytes_per_s"]
        b = r["bytes_per_token"]
        p(f"| {j['weight_type']} | {kv} | {int(r['depth'])} | {r['cached_ms_per_token']:.2f} | "
          f"{added:+.2f} | {r['cached_tokens_per_s']:.2f} | {100 * (r['cached_vs_first_depth'] - 1):+.1f}% | "
          f"{r['cached_limit_tokens_per_s']:.2f} | "
          f"{100 * r['cached_fraction_of_limit']:.1f}% | {b / 2**20:.1f} MiB | "
          f"{100 * (b - weights) / b:.1f}% | {bw / 1e9:.2f} GB/s |")
p("")
p("```sh")
lines.extend(commands)
p("```")
table = "\n".join(lines)
print(table)
if update_doc:
    doc = "docs/performance.md"
    text = open(doc).read()
    begin, end = "<!-- begin bench/performance.sh -->", "<!-- end bench/performance.sh -->"
    new, n = re.subn(re.escape(begin) + ".*?" + re.escape(end),
                     lambda _: f"{begin}\n{table}\n{end}", text, flags=re.S)
    if n != 1:
        sys.exit(f"{doc}: no {begin} ... {end} block to replace")
    open(doc, "w").write(new)
    print(f"updated {doc}", file=sys.stderr)
PY
