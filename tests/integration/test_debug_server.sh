#!/usr/bin/env bash
# The debug server (comm.enable_debug_server): in a 2-rank FSDP run, rank 1 is stopped
# (SIGSTOP) mid-training; while the job waits on it, rank 0's server still answers: its
# flight recorder shows the pending collective, its main thread's stack is inside a comm wait,
# its step does not move. Then the config page equals --print-config's, the Prometheus loss
# equals metrics.jsonl's, rank 0's index links both ranks; after SIGCONT the job finishes
# normally with the losses of a run without the server. A port in use and ports past 65535
# are refused with one line.
# run_all: alone (tests/run_all.sh): it times signals and timeouts
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# A base port whose next one is free too (the kernel picks it; another process may still take
# it before titan binds, which the busy-port line below would then say).
PORT=$($PY - <<'PY'
import socket
while True:
    a, b = socket.socket(), socket.socket()
    a.bind(("127.0.0.1", 0))
    port = a.getsockname()[1]
    try:
        b.bind(("127.0.0.1", port + 1))
        print(port)
        break
    except OSError:
        pass
PY
)
URL0=http://127.0.0.1:$PORT URL1=http://127.0.0.1:$((PORT + 1))
get() { curl -sS --max-time 10 "$@"; }
field() { sed -n "s/^$2: //p" <<<"$1"; }  # field STATUS_TEXT NAME

RUN=("${SMALL[@]}" --training.steps 30 --parallelism.data_parallel_shard_degree 2)
mpirun --oversubscribe -np 2 $TITAN "${RUN[@]}" --comm.enable_debug_server \
  --comm.debug_server_port "$PORT" --job.dump_folder "$SCRATCH/on" >"$SCRATCH/on.out" 2>&1 &
launcher=$!
victim=
# A failing check leaves no stopped rank behind.
trap 'kill -9 $launcher $victim 2>/dev/null || true; rm -rf "$SCRATCH"' EXIT
for _ in $(seq 300); do  # until both servers answer and training is under way
  s1=$(get "$URL1/status" 2>/dev/null) && [ "$(field "$s1" step)" -ge 3 ] && break
  sleep 0.2
done
[ "$(field "$s1" step)" -ge 3 ] || fail "rank 1's server never reported step 3: $(tail -5 "$SCRATCH/on.out")"
victim=$(field "$s1" pid)
kill -STOP "$victim"

# Rank 0 soon waits on a collective that rank 1 never joins.
for _ in $(seq 100); do
  s0=$(get "$URL0/status")
  pending=$(field "$s0" "oldest pending")
  [[ $pending =~ PENDING\ for\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 2 ] && break
  sleep 0.2
done
[[ $pending =~ PENDING\ for\ [2-9] ]] || fail "rank 0 is not waiting on a collective: $s0"
echo "ok: rank 0's status while rank 1 is stopped: step $(field "$s0" step), phase $(field "$s0" phase), oldest pending: $pending"
get "$URL0/flight_recorder" >"$SCRATCH/fr.txt"
grep -q "flight recorder (debug server)" "$SCRATCH/fr.txt" || fail "no flight recorder: $(head -3 "$SCRATCH/fr.txt")"
grep "PENDING" "$SCRATCH/fr.txt" | grep -qF "${pending%%,*}" ||
  fail "the flight recorder does not show the pending ${pending%%,*}: $(tail -3 "$SCRATCH/fr.txt")"
echo "ok: flight recorder: $(grep PENDING "$SCRATCH/fr.txt" | tail -1)"
get "$URL0/stacks" >"$SCRATCH/stacks.txt"
awk '/\(main\)$/ {on = 1} on && /^$/ {exit} on' "$SCRATCH/stacks.txt" >"$SCRATCH/main.txt"
grep -Eq " (wait_until|comm_wait)\+" "$SCRATCH/main.txt" ||
  fail "the main thread's stack names no comm wait: $(cat "$SCRATCH/stacks.txt")"
grep -q "^thread .*\"MHD" "$SCRATCH/stacks.txt" || fail "the server's own thread is not listed"
echo "ok: $(grep -c '^thread' "$SCRATCH/stacks.txt") threads' stacks; the main thread's:"
head -8 "$SCRATCH/main.txt"
still=$(field "$(get "$URL0/status")" step)
[ "$still" = "$(field "$s0" step)" ] || fail "rank 0 moved from step $(field "$s0" step) to $still"
if get --max-time 2 "$URL1/status" >/dev/null 2>&1; then fail "the stopped rank answered"; fi

# The rest of the pages, while the job still waits.
get "$URL0/config" >"$SCRATCH/config.yaml"
$TITAN "${RUN[@]}" --comm.enable_debug_server --comm.debug_server_port "$PORT" \
  --job.dump_folder "$SCRATCH/on" --print-config >"$SCRATCH/printed.yaml"
diff <(grep -v "print_config:" "$SCRATCH/config.yaml") \
     <(grep -v "print_config:" "$SCRATCH/printed.yaml") || fail "/config differs from --print-config"
grep -q "^  debug_server_port: $PORT " "$SCRATCH/config.yaml" || fail "/config lacks the port"
echo "ok: /config is the resolved config ($(wc -l <"$SCRATCH/config.yaml") lines)"
get "$URL0/metrics" >"$SCRATCH/metrics.txt"
$PY - "$SCRATCH/metrics.txt" "$SCRATCH/on/metrics.jsonl" <<'PY'
import json, re, sys
samples = {}
for line in open(sys.argv[1]):
    if line.startswith("#"):
        assert re.match(r"# (HELP|TYPE) titan_\w+ ", line), line
        continue
    m = re.fullmatch(r'(titan_\w+)\{rank="0"\} (\S+)\n', line)
    assert m, f"not a Prometheus sample: {line!r}"
    samples[m[1]] = float(m[2])
rows = {r["step"]: r for r in map(json.loads, open(sys.argv[2])) if "loss" in r}
step = int(samples["titan_logged_step"])
for name, key in [("titan_loss", "loss"), ("titan_grad_norm", "grad_norm"), ("titan_learning_rate", "lr")]:
    assert samples[name] == rows[step][key], f"{name} {samples[name]} != {rows[step][key]} at step {step}"
assert samples["titan_tokens_per_second"] > 0 and samples["titan_step"] in (step, step + 1), samples
print(f"ok: /metrics at step {step}: loss {samples['titan_loss']}, equal to metrics.jsonl's")
PY
get "$URL0/" >"$SCRATCH/index.html"
for url in "$URL0" "$URL1"; do
  grep -q "href=\"$url/stacks\"" "$SCRATCH/index.html" || fail "rank 0's index lacks $url: $(cat "$SCRATCH/index.html")"
done
echo "ok: rank 0's index links $URL0 and $URL1"

kill -CONT "$victim"
rc=0; wait "$launcher" || rc=$?
launcher= victim=  # both gone: their pids may be reused
[ "$rc" -eq 0 ] || fail "the job exited $rc after SIGCONT: $(tail -5 "$SCRATCH/on.out")"
train_ranks off 2 "${RUN[@]}"
same_metrics "resumed after SIGSTOP, server on vs off" "$SCRATCH/off/metrics.jsonl" \
  "$SCRATCH/on/metrics.jsonl" 1 0

# A port another process listens on; ports past 65535; an address that is no number.
$PY -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); open(sys.argv[2], "w")
time.sleep(60)' "$PORT" "$SCRATCH/listening" &
holder=$!
for _ in $(seq 50); do [ -f "$SCRATCH/listening" ] && break; sleep 0.1; done
expect_user_error "^titan: error: comm.debug_server_port: rank 0: cannot listen on 127.0.0.1 port $PORT: Address already in use$" \
  $TITAN "${SMALL[@]}" --training.steps 1 --comm.enable_debug_server --comm.debug_server_port "$PORT" \
  --job.dump_folder "$SCRATCH/busy"
kill "$holder"
expect_job_error "comm.debug_server_port: 65535 \+ 2 ranks runs past port 65535" \
  mpirun --oversubscribe -np 2 $TITAN "${SMALL[@]}" --training.steps 1 --comm.enable_debug_server \
  --comm.debug_server_port 65535 --job.dump_folder "$SCRATCH/past"
expect_user_error "^titan: error: --comm.debug_server_port: expects an integer in \[1, 65535\], got '65536'$" \
  $TITAN "${SMALL[@]}" --comm.debug_server_port 65536
expect_user_error "^titan: error: --comm.debug_server_host: expects a numeric IPv4 or IPv6 address, got 'localhost'$" \
  $TITAN "${SMALL[@]}" --comm.debug_server_host localhost
