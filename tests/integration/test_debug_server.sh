#!/usr/bin/env bash
# The debug server (comm.enable_debug_server): in a 2-rank FSDP run, rank 1 is stopped
# (SIGSTOP) mid-training; while the job waits on it, rank 0's server still answers: its
# flight recorder shows the pending collective, its main thread's stack is inside a comm wait,
# its step does not move. Then the config page equals --print-config's, the Prometheus loss
# equals metrics.jsonl's, rank 0's index links both ranks; the server withstands abuse (200
# concurrent /stacks askers answered from shared captures, a slow-loris connection cut at its
# deadline, one client's connections past its limit closed, no libmicrohttpd line on titan's
# output); after SIGCONT the job finishes normally with the losses of a run without the server.
# A port in use, ports past 65535 and another host's address without
# comm.debug_server_allow_remote are refused with one line; with it the startup line says so.
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

# Rank 0's server under abuse while the job waits (clients from addresses of 127.0.0.0/8 of
# their own, each a client to the per-client limit): a /stacks storm, a slow-loris connection,
# one client's connections past its limit, malformed requests. libmicrohttpd's messages stay in
# /status (server_messages), none on titan's output.
lines=$(wc -l <"$SCRATCH/on.out")
timeout 60 $PY - "$PORT" <<'PY' || fail "the debug server under abuse (above)"
# The debug server under abuse; prints one ok line per check and exits 1 on the first failure.
import socket, sys, threading, time
port = int(sys.argv[1])

def connect(source, timeout=20):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))

def exchange(source, request):
    s, data = connect(source), b""
    s.sendall(request)
    try:
        while (b := s.recv(65536)): data += b
    except ConnectionResetError:
        pass
    s.close()
    return data

def fail(what):
    print(f"FAIL: {what}", file=sys.stderr)
    sys.exit(1)

def is_open(s):  # no answer and no end of stream yet
    s.setblocking(False)
    try:
        return s.recv(1) is None
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)

# 200 concurrent /stacks askers, each from an address of its own (127.0.1.x, 127.0.2.x: one
# client each, under the per-client limit), 20 s apiece: all answered, sharing captures.
answers = [None] * 200
def ask(i):
    try:
        answers[i] = exchange(f"127.0.{1 + i // 100}.{2 + i % 100}",
                              b"GET /stacks HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    except OSError as e:
        answers[i] = repr(e).encode()
start = time.time()
threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(answers))]
for t in threads: t.start()
for t in threads: t.join()
took = time.time() - start
bad = [a[:80] for a in answers if not a.startswith(b"HTTP/1.1 200 OK") or b"(main)\n" not in a]
if bad: fail(f"{len(bad)} of 200 concurrent /stacks askers got no stacks, e.g. {bad[0]!r}")
captures = {a.split(b"\r\n\r\n", 1)[1].split(b",")[0] for a in answers}
if len(captures) > 40: fail(f"200 concurrent /stacks askers were served {len(captures)} captures")
print(f"ok: 200 concurrent /stacks askers answered in {took:.1f} s from {len(captures)} captures")

# A slow-loris client: a header line a second, never the blank line that ends the request;
# libmicrohttpd's idle timeout never trips, the request deadline (10 s) does.
def slow_loris(result):
    s, start = connect("127.0.3.1"), time.time()
    s.sendall(b"GET /status HTTP/1.1\r\nHost: t\r\n")
    while time.time() - start < 20:
        time.sleep(1)
        try:
            s.sendall(b"X-Slow: 1\r\n")
        except OSError:
            break
        if not is_open(s): break
    result.append(time.time() - start)
loris = []
loris_thread = threading.Thread(target=slow_loris, args=(loris,))
loris_thread.start()

# One client's connections past its limit (8) are closed at once.
held = [connect("127.0.4.1") for _ in range(10)]
time.sleep(1)
alive = sum(is_open(s) for s in held)
if alive != 8: fail(f"one client holds {alive} connections of 10 opened, not 8")
for s in held: s.close()
print("ok: one client's connections: 8 of 10 held open, the rest closed")

# Malformed requests: each answered (or closed), none of libmicrohttpd's words on stderr (the
# test compares titan's output around this script).
for request in [b"BLAH\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
                b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n"] * 5:
    exchange("127.0.5.1", request)
print("ok: 20 malformed requests answered")

loris_thread.join()
if not 9 <= loris[0] <= 16: fail(f"a slow-loris connection was dropped after {loris[0]:.1f} s, not 10")
print(f"ok: a slow-loris connection dropped after {loris[0]:.1f} s")
PY
tail -n +$((lines + 1)) "$SCRATCH/on.out" | grep -v "^titan: " >"$SCRATCH/said.txt" || true
[ ! -s "$SCRATCH/said.txt" ] || fail "the server wrote on titan's output: $(head -3 "$SCRATCH/said.txt")"
said=$(field "$(get "$URL0/status")" server_messages)
[ "$said" -ge 5 ] || fail "/status counts $said of libmicrohttpd's messages for 20 malformed requests"
echo "ok: libmicrohttpd's $said messages in /status, none on titan's output"

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

# The opt-in on a loopback address does nothing: refused, not ignored.
expect_user_error "^titan: error: --comm.debug_server_allow_remote: comm.debug_server_allow_remote = true does nothing: comm.debug_server_host is a loopback address$" \
  $TITAN "${SMALL[@]}" --comm.enable_debug_server --comm.debug_server_allow_remote
# Another host's address, or every interface, needs the opt-in; the startup line says so.
expect_user_error "^titan: error: --comm.debug_server_host: comm.debug_server_host = '0.0.0.0' lets other hosts read every debug page .* set comm.debug_server_allow_remote" \
  $TITAN "${SMALL[@]}" --comm.enable_debug_server --comm.debug_server_host 0.0.0.0
$TITAN "${SMALL[@]}" --training.steps 1 --comm.enable_debug_server --comm.debug_server_host 0.0.0.0 \
  --comm.debug_server_allow_remote --comm.debug_server_port "$PORT" --job.dump_folder "$SCRATCH/remote" \
  >"$SCRATCH/remote.out" 2>&1 || fail "a run with comm.debug_server_allow_remote failed: $(tail -3 "$SCRATCH/remote.out")"
grep -q "^debug server: .*; other hosts can read it, unauthenticated (comm.debug_server_allow_remote)$" \
  "$SCRATCH/remote.out" || fail "the startup line does not say other hosts can read it: $(head -1 "$SCRATCH/remote.out")"
echo "ok: $(grep "^debug server" "$SCRATCH/remote.out")"
