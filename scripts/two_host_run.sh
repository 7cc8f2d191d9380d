#!/usr/bin/env bash
# Tensor parallelism on two "hosts" on one machine: two network namespaces
# joined by a veth pair, one MPI rank in each, OpenMPI over TCP only
# (docs/tensor_parallel.md, "Several machines"). mpirun runs in the first
# namespace; its rsh agent "logs in" to the second with `ip netns exec`.
#
#   scripts/two_host_run.sh --check              2 ranks print what 1 process prints (ctest)
#   scripts/two_host_run.sh --gbit 10,100 --json run.json
#                                                also: ping-pong and all-reduce timings of the
#                                                link, and bench-serve step times, unshaped
#                                                and shaped to each rate (input of
#                                                scripts/tensor_parallel_projection.py)
# Options:
#   --check            correctness only: `serve` on 1 process and on 2 ranks, the same
#                      greedy completion; SIGUSR1 to mpirun stops serve, mpirun must exit 0
#   --model PRESET     synthetic preset (default: tiny with --check, else small)
#   --gbit LIST        comma-separated link rates to shape to (tc tbf), Gbit/s
#   --latency-us N     one-way delay added by tc netem (needs sch_netem in the kernel)
#   --mtu BYTES        the link's MTU (default 9000: jumbo frames, as MPI clusters use)
#   --requests B --prompt-len P --output-len O
#                      the timed workload: B requests of P prompt and O output tokens
#                      at once, so one prefill step of B x P tokens and O - 1 decode
#                      steps of B tokens (default 8, 64, 16)
#   --rounds K         measure K interleaved rounds and keep each figure's best
#                      (least time, most bandwidth) (default 3)
#   --wait-idle S      before each round, wait up to S seconds for the machine to be
#                      idle (at least 90% idle over 2 s) (default 0: no wait)
#   --json FILE        write every measured figure to FILE
#   --pagedattn PATH   the CLI (default build/release/tools/pagedattn)
#   --mpirun PATH      (default mpirun)
# Needs root (CAP_NET_ADMIN) and iproute2; exits 77 with the reason where
# namespaces cannot be made (ctest: skipped). Every namespace, link and
# process it makes is removed on every exit path.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
skip() { echo "two_host_run: SKIPPED: $*" >&2; exit 77; }
fail() { echo "two_host_run: FAILED: $*" >&2; exit 1; }

check_only=0 model="" gbits="" latency_us=0 mtu=9000 rounds=3 wait_idle=0 json="" requests=8 prompt_len=64 output_len=16
repo=$(cd "$(dirname "$0")/.." && pwd)
pagedattn=$repo/build/release/tools/pagedattn mpirun=mpirun
while [ $# -gt 0 ]; do
  case $1 in
    --check) check_only=1 ;;
    --model) model=$2; shift ;;
    --gbit) gbits=${2//,/ }; shift ;;
    --latency-us) latency_us=$2; shift ;;
    --mtu) mtu=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --wait-idle) wait_idle=$2; shift ;;
    --requests) requests=$2; shift ;;
    --prompt-len) prompt_len=$2; shift ;;
    --output-len) output_len=$2; shift ;;
    --json) json=$2; shift ;;
    --pagedattn) pagedattn=$2; shift ;;
    --mpirun) mpirun=$2; shift ;;
    -h|--help) usage ;;
    *) echo "two_host_run: unknown argument '$1'" >&2; usage 2 ;;
  esac
  shift
done
[ -n "$model" ] || model=$([ $check_only = 1 ] && echo tiny || echo small)
need_whole() {  # flag value minimum
  [[ $2 =~ ^[0-9]+$ ]] && (($2 >= $3)) && return
  echo "two_host_run: $1 $2 must be a whole number >= $3" >&2
  exit 2
}
need_whole --requests "$requests" 1
need_whole --prompt-len "$prompt_len" 1
need_whole --output-len "$output_len" 2  # at least one decode step
need_whole --rounds "$rounds" 1
need_whole --wait-idle "$wait_idle" 0
need_whole --mtu "$mtu" 68
need_whole --latency-us "$latency_us" 0
for gbit in $gbits; do need_whole --gbit "$gbit" 1; done
[ -x "$pagedattn" ] || fail "--pagedattn $pagedattn is not an executable (build tools/pagedattn)"
command -v "$mpirun" >/dev/null || skip "no mpirun ($mpirun)"
command -v curl >/dev/null || skip "no curl (the check talks to pagedattn serve)"
command -v python3 >/dev/null || skip "no python3 (reads the server's JSON)"
command -v ip >/dev/null || skip "no 'ip' (iproute2) to make network namespaces"
[ "$(id -u)" = 0 ] || skip "not root: network namespaces need CAP_NET_ADMIN"

# Names unique to this run; the addresses live inside the namespaces, so
# concurrent runs do not collide.
ns_a=pagedattn$$a ns_b=pagedattn$$b veth_a=pa$$a veth_b=pa$$b
addr_a=10.43.0.1 addr_b=10.43.0.2 subnet=10.43.0.0/24
# Each host gets half of the CPUs this process may run on.
read -r cpus_a cpus_b < <(python3 -c 'import os
cpus = sorted(os.sched_getaffinity(0)); half = len(cpus) // 2
print(",".join(map(str, cpus[:half])) or "-", ",".join(map(str, cpus[half:])))')
[ "$cpus_a" != - ] || skip "one CPU: two hosts need one each"
work=$(mktemp -d -t two_host_run.XXXXXX)
pids=()  # background jobs: each with its process tree
descendants() { local child; for child in $(pgrep -P "$1"); do descendants "$child"; echo "$child"; done; }
cleanup() {
  local pid
  # shellcheck disable=SC2046  # one pid a word
  for pid in "${pids[@]}"; do kill -KILL $(descendants "$pid") "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  ip netns del "$ns_a" 2>/dev/null || true  # takes the veth pair with it
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

make_namespaces() {
  ip netns add "$ns_a" 2>"$work/err" || skip "cannot make a network namespace: $(cat "$work/err")"
  ip netns add "$ns_b"
  ip link add "$veth_a" type veth peer name "$veth_b" 2>"$work/err" ||
    skip "cannot make a veth pair: $(cat "$work/err")"
  ip link set "$veth_a" netns "$ns_a"
  ip link set "$veth_b" netns "$ns_b"
  ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
  ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
  local ns
  for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
  ip -n "$ns_a" link set "$veth_a" mtu "$mtu" up
  ip -n "$ns_b" link set "$veth_b" mtu "$mtu" up
}

# Egress of both ends: netem delay (if asked), then a token bucket at the
# rate. The bucket holds 50 us of traffic (at least 64 KiB, one GSO packet)
# so a burst cannot pass a message much faster than the rate.
shape_link() {  # gbit ("" = unshaped)
  local gbit=$1 ns dev burst parent
  for ns in "$ns_a" "$ns_b"; do
    dev=$([ "$ns" = "$ns_a" ] && echo "$veth_a" || echo "$veth_b")
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    parent=root
    if [ "$latency_us" != 0 ]; then
      ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "${latency_us}us" \
        2>"$work/err" || skip "--latency-us needs tc netem: $(cat "$work/err")"
      parent="parent 1:1"
    fi
    [ -n "$gbit" ] || continue
    burst=$(awk -v g="$gbit" 'BEGIN { b = g * 1e9 / 8 * 50e-6; printf "%d", b < 65536 ? 65536 : b }')
    # shellcheck disable=SC2086  # $parent is two words or one
    ip netns exec "$ns" tc qdisc add dev "$dev" $parent handle 10: tbf rate "${gbit}gbit" \
      burst "$burst" latency 10ms 2>"$work/err" || fail "tc tbf: $(cat "$work/err")"
  done
}

# mpirun's rsh agent: the "host" names a namespace; run the command there,
# on that host's half of this machine's CPUs.
write_agent() {
  cat >"$work/agent.sh" <<EOF
#!/bin/sh
case \$1 in
  $addr_a) ns=$ns_a cpus=$cpus_a ;;
  $addr_b) ns=$ns_b cpus=$cpus_b ;;
  *) echo "two_host_run agent: unknown host \$1" >&2; exit 1 ;;
esac
shift
exec ip netns exec "\$ns" taskset -c "\$cpus" sh -c "\$*"
EOF
  chmod +x "$work/agent.sh"
  printf '%s slots=1\n' "$addr_a" "$addr_b" >"$work/hosts"
}

# One rank on each host; TCP only (the btl and mpirun's own out-of-band
# channel), on the veth subnet. Each host's processes keep to its half of
# the CPUs; OpenMPI's own binding is off, as each "host" would bind its rank
# to its first core, the same core of this machine.
mpirun_two_hosts() {
  timeout -k 10 600 ip netns exec "$ns_a" taskset -c "$cpus_a" "$mpirun" --allow-run-as-root \
    -np 2 --hostfile "$work/hosts" \
    --bind-to none \
    --mca plm_rsh_agent "$work/agent.sh" --mca btl tcp,self \
    --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
    -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=passive "$@"
}

# The greedy completion of `serve` started by "$@" in namespace A, which
# listens on 127.0.0.1:$port there. Then the stop: mpirun gets SIGUSR1,
# which it forwards to every rank (SIGINT / SIGTERM it turns into SIGTERM +
# SIGKILL of every rank and exit 1); rank 0 drains and releases rank 1, and
# the launcher must exit 0. The single process gets SIGINT.
serve_completion() {  # port out_file command...
  local port=$1 out=$2 pid rank0="" i status rank placed=""
  shift 2
  "$@" >"$work/serve.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for i in $(seq 300); do
    ip netns exec "$ns_a" curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >&2; fail "serve exited at start"; }
    sleep 0.1
  done
  ip netns exec "$ns_a" curl -sf "http://127.0.0.1:$port/v1/completions" \
    -H 'Content-Type: application/json' -o "$out" \
    -d '{"model": "'"$model"'", "prompt": "The quick brown fox jumps over", "max_tokens": 12, "temperature": 0}' ||
    { cat "$work/serve.log" >&2; fail "no completion from port $port"; }
  for i in $(descendants "$pid"); do
    rank=$(tr '\0' '\n' <"/proc/$i/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$rank" ] || continue
    [ "$rank" = 0 ] && rank0=$i
    placed+="rank $rank in $(ip netns identify "$i"); "
  done
  local stop=INT target=$pid
  if [ -n "$rank0" ]; then  # each rank on its own "host"
    [ "$placed" = "rank 0 in $ns_a; rank 1 in $ns_b; " ] ||
      [ "$placed" = "rank 1 in $ns_b; rank 0 in $ns_a; " ] || fail "ranks misplaced: $placed"
    echo "two_host_run: $placed" >&2
    stop=USR1
    for i in $(descendants "$pid"); do
      case $(cat "/proc/$i/comm" 2>/dev/null) in mpirun | orterun | mpiexec) target=$i ;; esac
    done
    [ "$target" != "$pid" ] || fail "no mpirun process under the launcher"
  fi
  kill "-$stop" "$target"
  status=0
  timeout 60 tail --pid="$pid" -f /dev/null || fail "serve did not stop within 60 s of SIG$stop"
  wait "$pid" || status=$?
  [ "$status" = 0 ] || { cat "$work/serve.log" >&2; fail "launcher exited $status after SIG$stop"; }
}

check_same_output() {
  serve_completion 8001 "$work/single.json" \
    ip netns exec "$ns_a" env OMP_NUM_THREADS=1 "$pagedattn" serve --model "$model" --port 8001
  serve_completion 8000 "$work/two.json" \
    mpirun_two_hosts "$pagedattn" serve --model "$model" --port 8000 --tensor-parallel 2
  local one two
  one=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' \
    "$work/single.json")
  two=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' \
    "$work/two.json")
  echo "1 process:            $one"
  echo "2 ranks over TCP:     $two"
  if [ -z "$one" ] || [ "$one" != "$two" ]; then fail "2 ranks over TCP differ from 1 process"; fi
  echo "two_host_run: $model: 2 ranks in 2 namespaces over TCP = 1 process"
}

write_probe() {
  cat >"$work/probe.c" <<'EOF'
/* Ping-pong between ranks 0 and 1 (osu_latency style, blocking, one message
   in flight): one-way time = round trip / 2, at 8 bytes and 4 MiB. Then
   MPI_Allreduce(MPI_SUM) of floats at the byte sizes given as arguments, as
   pagedattn calls it. Every figure is the median of timed repetitions: the
   ranks share their cores with whatever else runs, and a median ignores the
   repetitions in which a rank was descheduled. Rank 0 prints "name value". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { kRepetitions = 101 };

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* seconds) {
  qsort(seconds, kRepetitions, sizeof(double), by_value);
  return seconds[kRepetitions / 2];
}

static double one_way_seconds(char* buffer, int bytes, int rank) {
  double seconds[kRepetitions];
  for (int i = 0; i < kRepetitions; ++i) {
    const double start = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buffer, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buffer, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buffer, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buffer, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
    seconds[i] = (MPI_Wtime() - start) / 2;
  }
  return median(seconds);
}

static double all_reduce_seconds(float* in, float* out, int count) {
  double seconds[kRepetitions];
  for (int i = 0; i < kRepetitions; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    seconds[i] = MPI_Wtime() - start;
  }
  return median(seconds);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int large = 4 << 20;
  char* buffer = calloc(large, 1);
  one_way_seconds(buffer, large, rank); /* warm-up: connections made */
  const double small_s = one_way_seconds(buffer, 8, rank);
  const double large_s = one_way_seconds(buffer, large, rank);
  if (rank == 0) {
    printf("latency_us %.3f\n", small_s * 1e6);
    printf("bandwidth_gbit %.3f\n", large * 8.0 / (large_s - small_s) / 1e9);
  }
  for (int a = 1; a < argc; ++a) {
    const int count = atoi(argv[a]) / 4;
    float* in = calloc(count, sizeof(float));
    float* out = calloc(count, sizeof(float));
    all_reduce_seconds(in, out, count);
    const double s = all_reduce_seconds(in, out, count);
    if (rank == 0) printf("allreduce_us %d %.3f\n", count * 4, s * 1e6);
    free(in);
    free(out);
  }
  free(buffer);
  MPI_Finalize();
  return 0;
}
EOF
  mpicc -O2 -o "$work/probe" "$work/probe.c" || fail "mpicc could not build the link probe"
}

hidden_size() {
  case $model in tiny) echo 256 ;; small) echo 768 ;; 1b) echo 2048 ;; *) fail "--model $model" ;; esac
}

# bench-serve on the fixed workload; prints "prefill_s decode_step_s" (one
# step of B x P tokens; the median step of B tokens).
bench_steps() {  # json_out launcher... (the launcher ends with the CLI's path)
  local out=$1 tensor_parallel=()
  shift
  [ "$1" = mpirun_two_hosts ] && tensor_parallel=(--tensor-parallel 2)
  "$@" bench-serve --model "$model" --workload "$work/trace.jsonl" --json "$out" \
    "${tensor_parallel[@]}" >"$work/bench.log" 2>&1 || { cat "$work/bench.log" >&2; fail "bench-serve: $*"; }
  # The prefill step ends at the first token; a decode step's time is the
  # median of the steps that ran all B sequences (robust to descheduling).
  python3 -c 'import json, statistics, sys
run = json.load(open(sys.argv[1]))
t, tokens = run["timeline"]["time_s"], run["timeline"]["batch_tokens"]
decode = [t[i] - t[i - 1] for i in range(1, len(t)) if tokens[i] == int(sys.argv[2])]
print(run["summary"]["ttft_p50_s"], statistics.median(decode))' "$out" "$requests"
}

# One round on one link: "LINK name value..." records of the probe and of
# bench-serve on 2 ranks, appended to $work/records.
measure_link() {  # gbit ("" = unshaped veth)
  local gbit=$1 link=${1:-veth} hidden
  hidden=$(hidden_size)
  shape_link "$gbit"
  mpirun_two_hosts "$work/probe" "$((4 * hidden * requests))" \
    "$((4 * hidden * requests * prompt_len))" | sed "s/^/$link /" >>"$work/records"
  local steps
  steps=$(bench_steps "$work/two.json" mpirun_two_hosts "$pagedattn")
  echo "$link steps $steps" >>"$work/records"
  awk -v s="$steps" 'BEGIN { split(s, t, " "); printf "prefill %.3f s, decode step %.2f ms; ", t[1], 1e3 * t[2] }' >&2
  sed -n 's/.*tensor parallel 2: \(all-reduce [0-9.]* s\).*= \([0-9.]*%\) of model time.*/\1 = \2 of model time/p' \
    "$work/bench.log" >&2
}

# The records of every round as JSON: per figure its rounds, and the best
# round (least time, most bandwidth): the rounds least disturbed by the
# machine's other work.
records_json() {
  python3 - "$work/records" <<'PY'
import json, sys
links = {}
for line in open(sys.argv[1]):
    link, name, *values = line.split()
    fig = links.setdefault(link, {"rounds": {}})["rounds"]
    if name == "steps":
        fig.setdefault("prefill_step_s", []).append(float(values[0]))
        fig.setdefault("decode_step_s", []).append(float(values[1]))
    elif name == "allreduce_us":
        fig.setdefault(f"allreduce_us {values[0]}", []).append(float(values[1]))
    else:
        fig.setdefault(name, []).append(float(values[0]))
out = {}
for link, data in links.items():
    entry = {"gbit": None if link == "veth" else (None if link == "single" else float(link))}
    entry["allreduce_us"] = {}
    for name, rounds in data["rounds"].items():
        best = max(rounds) if name == "bandwidth_gbit" else min(rounds)
        if name.startswith("allreduce_us "):
            entry["allreduce_us"][name.split()[1]] = best
        else:
            entry[name] = best
    entry["rounds"] = data["rounds"]
    out[link] = entry
print(json.dumps(out))
PY
}

# Waits up to --wait-idle seconds for 2 s in which the CPUs are >= 90% idle
# (/proc/stat); prints how long it waited.
wait_for_idle() {
  local start=$SECONDS before after
  while [ $((SECONDS - start)) -lt "$wait_idle" ]; do
    before=$(head -1 /proc/stat)
    sleep 2
    after=$(head -1 /proc/stat)
    awk -v a="$before" -v b="$after" 'BEGIN { n = split(a, x); split(b, y)
      for (i = 2; i <= n; ++i) { total += y[i] - x[i]; if (i == 5 || i == 6) idle += y[i] - x[i] }
      exit !(idle >= 0.9 * total) }' && break
  done
  echo "waited $((SECONDS - start)) s for an idle machine"
}

measure() {
  command -v mpicc >/dev/null || skip "no mpicc to build the link probe"
  write_probe
  local i round gbit load_before
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  for i in $(seq "$requests"); do
    echo "{\"prompt_len\": $prompt_len, \"output_len\": $output_len, \"n\": 1, \"arrival\": 0}"
  done >"$work/trace.jsonl"
  echo "$model, $requests requests x ($prompt_len prompt + $output_len output) tokens," \
    "1 thread per rank, $rounds rounds" >&2
  for round in $(seq "$rounds"); do  # interleaved, so that a disturbance hits one round
    [ "$wait_idle" = 0 ] || echo "round $round: $(wait_for_idle)" >&2
    echo "single steps $(bench_steps "$work/one.json" env OMP_NUM_THREADS=1 \
      OMP_WAIT_POLICY=passive timeout 600 taskset -c "$cpus_a" "$pagedattn")" >>"$work/records"
    for gbit in "" $gbits; do
      printf 'round %s, %-8s ' "$round" "${gbit:-veth}${gbit:+ Gb/s}" >&2
      measure_link "$gbit"
    done
  done
  python3 - "$(records_json)" "$model" "$requests" "$prompt_len" "$output_len" "$mtu" "$rounds" \
    "$latency_us" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc --all)" \
    "$load_before / $(cut -d' ' -f1-3 /proc/loadavg)" >"$work/result.json" <<'PY'
import datetime, json, sys
links, model, b, p, o, mtu, rounds, netem_us, machine, cpus, load = sys.argv[1:]
links = json.loads(links)
single = links.pop("single")
for link in links.values():
    link["latency_us_added"] = float(netem_us)
result = {"model": model, "requests": int(b), "prompt_len": int(p), "output_len": int(o),
          "machine": machine, "cpus": int(cpus), "mtu": int(mtu), "rounds": int(rounds),
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
          "load_average": load,
          "single": {k: single[k] for k in ("prefill_step_s", "decode_step_s", "rounds")},
          "links": list(links.values())}
print(json.dumps(result, indent=1))
def label(link):
    return "veth" if link["gbit"] is None else f"{link['gbit']:g} Gb/s"
for name, link in [("1 process", single)] + [(label(l), l) for l in links.values()]:
    extra = "" if "latency_us" not in link else (
        f"; ping-pong {link['latency_us']:.1f} us, {link['bandwidth_gbit']:.1f} Gb/s")
    print(f"best round, {name:<10}: prefill {link['prefill_step_s']:.3f} s, decode step "
          f"{link['decode_step_s'] * 1e3:.2f} ms{extra}", file=sys.stderr)
PY
  if [ -n "$json" ]; then cp "$work/result.json" "$json"; else cat "$work/result.json"; fi
}

make_namespaces
write_agent
shape_link "${gbits%% *}"
check_same_output
[ $check_only = 1 ] || measure
