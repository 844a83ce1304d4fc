#!/usr/bin/env bash
# The loopback test of docs/DEPLOY.md: memra-server replicas on the CPU behind a real nginx
# (deploy/nginx/memra.conf, started here on loopback under a temp dir, not the system service),
# driven by `memra-bench load` with multi-turn conversations.
#
#   1. round-robin vs prefix-cache-affine routing (consistent hash on x-memra-cache-key): the
#      share of prompt tokens served from the prefix cache and the TTFT clients see;
#   2. one replica killed mid-load (SIGTERM, then SIGKILL after a grace period): no request
#      lost that had not started streaming (nginx re-sends the 503s of the draining replica,
#      the clients retry 503 + Retry-After), streams that had started finish.
#
# Writes reports/deploy-affinity-cpu.md (OUT=... to write elsewhere); exits 1 when a
# must-reach check fails. Needs nginx (`apt-get install -y nginx`), python3 and the model the
# synthetic one borrows its tokenizer from (tools/fetch-models.sh fetches it).
#
#   tools/deploy/affinity-test.sh                   # builds memra-server and memra-bench first
#   MEMRA_BIN_DIR=/path/to/release tools/deploy/affinity-test.sh   # use these binaries
#
# Knobs (env): REPLICAS (8), CLIENTS (15: keep it coprime with REPLICAS, see the report),
# TURNS (4), CONVS (2 per client), WORDS (30 new words per turn), MAX_TOKENS (12), KV_BLOCKS (160 per replica), LAYERS (4), KILL_AFTER_S (8),
# GRACE_S (10), KILL_MAX_RUNNING (2: --max-running of the kill phase's replicas, so requests
# queue), ROOMY_KV_BLOCKS (unset: skipped; a second round-robin / affinity pair with a KV pool
# this large, reported for comparison), BASE_PORT (18180). About 2 minutes on 2 cores (5-7 with
# REPLICAS=4 ROOMY_KV_BLOCKS=1024, the second run of reports/deploy-affinity-cpu.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"

REPLICAS="${REPLICAS:-8}"
CLIENTS="${CLIENTS:-15}"
TURNS="${TURNS:-4}"
CONVS="${CONVS:-2}"
WORDS="${WORDS:-30}"
MAX_TOKENS="${MAX_TOKENS:-12}"
KV_BLOCKS="${KV_BLOCKS:-160}"
LAYERS="${LAYERS:-4}"
KILL_AFTER_S="${KILL_AFTER_S:-8}"
GRACE_S="${GRACE_S:-10}"
KILL_MAX_RUNNING="${KILL_MAX_RUNNING:-2}"
ROOMY_KV_BLOCKS="${ROOMY_KV_BLOCKS:-}"
BASE_PORT="${BASE_PORT:-18180}"
OUT="${OUT:-$ROOT/reports/deploy-affinity-cpu.md}"
REQUESTS=$((TURNS * CONVS))

die() {
  echo "affinity-test: $*" >&2
  exit 2
}

command -v nginx >/dev/null || die "nginx not found: install it (Debian: apt-get install -y nginx)"
command -v python3 >/dev/null || die "python3 not found"
command -v curl >/dev/null || die "curl not found"

if [ -n "${MEMRA_BIN_DIR:-}" ]; then
  BIN="$MEMRA_BIN_DIR"
else
  cargo build --release --quiet -p memra-server -p memra-bench
  BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
for b in memra-server memra-bench; do
  [ -x "$BIN/$b" ] || die "$BIN/$b is missing (build it, or point MEMRA_BIN_DIR at it)"
done

TMP="$(mktemp -d /tmp/memra-affinity.XXXXXX)"
PIDS=()
NGINX_PREFIX=""
cleanup() {
  [ -n "$NGINX_PREFIX" ] && nginx -p "$NGINX_PREFIX" -c nginx.conf -s stop 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

TOKENIZER="$(tools/fetch-models.sh)"
MODEL="$TMP/model.gguf"
"$BIN/memra-bench" synth --shape smollm2-135m --layers "$LAYERS" --dtype q8_0 --seed 1 \
  --tokenizer-from "$TOKENIZER" --out "$MODEL" >/dev/null 2>&1 || die "memra-bench synth failed"

port() { echo $((BASE_PORT + 1 + $1)); }
LB_PORT="$BASE_PORT"

# start_replicas [MAX_RUNNING [KV_BLOCKS]]: fresh processes (empty prefix caches), ready when
# this returns.
start_replicas() {
  local running="${1:-64}" blocks="${2:-$KV_BLOCKS}"
  PIDS=()
  for i in $(seq 0 $((REPLICAS - 1))); do
    MEMRA_MODELS="m=$MODEL" MEMRA_LOG=info "$BIN/memra-server" --device cpu --threads 1 \
      --addr "127.0.0.1:$(port "$i")" --kv-blocks "$blocks" --drain-timeout-s "$GRACE_S" \
      --max-running "$running" --cache-key-header >"$TMP/replica$i.log" 2>&1 &
    PIDS+=($!)
  done
  for i in $(seq 0 $((REPLICAS - 1))); do
    for _ in $(seq 1 100); do
      curl -sf "127.0.0.1:$(port "$i")/ready" >/dev/null && break
      kill -0 "${PIDS[$i]}" 2>/dev/null || die "replica $i exited: $(tail -3 "$TMP/replica$i.log")"
      sleep 0.2
    done
    curl -sf "127.0.0.1:$(port "$i")/ready" >/dev/null || die "replica $i not ready"
  done
}

stop_replicas() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}

# start_nginx MODE (affine | roundrobin): deploy/nginx/memra.conf with the replicas' loopback
# addresses; round-robin drops the hash line.
start_nginx() {
  local mode="$1"
  NGINX_PREFIX="$TMP/nginx-$mode"
  mkdir -p "$NGINX_PREFIX"
  local servers=""
  for i in $(seq 0 $((REPLICAS - 1))); do
    servers+="        server 127.0.0.1:$(port "$i") max_fails=3 fail_timeout=5s;\n"
  done
  python3 - "$ROOT/deploy/nginx/memra.conf" "$NGINX_PREFIX/nginx.conf" "$mode" "$LB_PORT" "$servers" <<'PY'
import re, sys
src, dst, mode, port, servers = sys.argv[1:]
c = open(src).read()
c = re.sub(r"# BEGIN replicas\n.*?# END replicas\n", servers.replace("\\n", "\n"), c, flags=re.S)
c = re.sub(r"# BEGIN listen\n.*?# END listen\n", f"listen 127.0.0.1:{port};\n", c, flags=re.S)
c = c.replace("worker_processes auto;", "worker_processes 1;")
if mode == "roundrobin":
    c = re.sub(r"\n\s*hash \$memra_route_key consistent;", "", c)
open(dst, "w").write(c)
PY
  nginx -t -p "$NGINX_PREFIX" -c nginx.conf >"$TMP/nginx-$mode-test.log" 2>&1 ||
    die "nginx -t failed: $(cat "$TMP/nginx-$mode-test.log")"
  nginx -p "$NGINX_PREFIX" -c nginx.conf 2>"$TMP/nginx-$mode.err" || die "nginx did not start"
  for _ in $(seq 1 50); do
    curl -sf "127.0.0.1:$LB_PORT/health" >/dev/null && return 0
    sleep 0.1
  done
  die "nginx did not answer on 127.0.0.1:$LB_PORT"
}

stop_nginx() {
  nginx -p "$NGINX_PREFIX" -c nginx.conf -s stop 2>/dev/null || true
  sleep 0.5
}

load() { # load OUTFILE [extra flags]
  local out="$1"
  shift
  "$BIN/memra-bench" load --addr "127.0.0.1:$LB_PORT" --model m --clients "$CLIENTS" \
    --requests "$REQUESTS" --turns "$TURNS" --max-tokens "$MAX_TOKENS" \
    --prompt-words "$WORDS" --affinity-header x-memra-cache-key "$@" >"$out" 2>"$out.err" || true
  [ -s "$out" ] || die "memra-bench load printed nothing: $(tail -3 "$out.err")"
}

# Requests per replica, from the nginx access log's final upstream.
spread() {
  python3 - "$1" <<'PY'
import collections, re, sys
c = collections.Counter()
for line in open(sys.argv[1]):
    m = re.search(r"upstream=(.*?) upstream_status=", line)
    if m and "/v1/" in line:
        c[m.group(1).split(", ")[-1]] += 1
print(" / ".join(str(c[k]) for k in sorted(c)))
PY
}

# Requests nginx sent to more than one replica: first answered 503 (draining), or not at all
# (a connection error). Prints the two counts.
resends() {
  python3 - "$1" <<'PY'
import re, sys
r503 = other = 0
for line in open(sys.argv[1]):
    m = re.search(r"upstream_status=(.*?) key=", line)
    if m and ", " in m.group(1):
        if m.group(1).startswith("503"):
            r503 += 1
        else:
            other += 1
print(r503, other)
PY
}

# routing_pair TAG KV_BLOCKS: round-robin then affinity, each on fresh replicas.
routing_pair() {
  local tag="$1" blocks="$2"
  echo "round-robin${tag:+ ($tag)}, $blocks KV blocks" >&2
  start_replicas 64 "$blocks"
  start_nginx "roundrobin"
  load "$TMP/rr$tag.json"
  stop_nginx
  spread "$NGINX_PREFIX/access.log" >"$TMP/rr$tag.spread"
  rm -rf "$NGINX_PREFIX"
  stop_replicas
  echo "affinity${tag:+ ($tag)}, $blocks KV blocks" >&2
  start_replicas 64 "$blocks"
  start_nginx affine
  load "$TMP/affine$tag.json"
  stop_nginx
  spread "$NGINX_PREFIX/access.log" >"$TMP/affine$tag.spread"
  rm -rf "$NGINX_PREFIX"
  stop_replicas
}

T0=$(date +%s)
routing_pair "" "$KV_BLOCKS"
if [ -n "$ROOMY_KV_BLOCKS" ]; then
  routing_pair "-roomy" "$ROOMY_KV_BLOCKS"
fi

echo "phase 3: a replica killed mid-load" >&2
# Few sequences at once, so the victim has requests waiting for their first token.
start_replicas "$KILL_MAX_RUNNING"
start_nginx kill
# The kill phase routes with affinity (the config as shipped).
load "$TMP/kill.json" --retries 5 &
LOAD_PID=$!
sleep "$KILL_AFTER_S"
# The victim: the replica with the most requests in flight now (affinity may leave one idle).
VICTIM_I=0
BEST=-1
for i in $(seq 0 $((REPLICAS - 1))); do
  n=$(curl -sf "127.0.0.1:$(port "$i")/metrics" | awk '$1 == "memra_http_in_flight" {print $2}')
  if [ "${n:-0}" -gt "$BEST" ]; then
    BEST="${n:-0}"
    VICTIM_I="$i"
  fi
done
VICTIM="${PIDS[$VICTIM_I]}"
KILL_T0=$(date +%s.%N)
kill -TERM "$VICTIM"
KILLED=no
for _ in $(seq 1 $((GRACE_S * 10))); do
  kill -0 "$VICTIM" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$VICTIM" 2>/dev/null; then
  kill -KILL "$VICTIM"
  KILLED=yes
fi
set +e
wait "$VICTIM"
VICTIM_RC=$?
set -e
KILL_S=$(python3 -c "import time; print(f'{time.time() - $KILL_T0:.1f}')")
wait "$LOAD_PID" || true
stop_nginx
KILL_SPREAD="$(spread "$TMP/nginx-kill/access.log")"
read -r RESENT REFUSED_RESENT <<<"$(resends "$TMP/nginx-kill/access.log")"
VICTIM_LOG="$(grep -E 'draining|drained|drain timeout' "$TMP/replica$VICTIM_I.log" | sed -E 's/^[^ ]+ +//' | tr '\n' ';' || true)"
stop_replicas
WALL=$(($(date +%s) - T0))

mkdir -p "$(dirname "$OUT")"
NGINX_VERSION="$(nginx -v 2>&1 | sed 's/.*nginx\///')"
export REPLICAS CLIENTS TURNS CONVS WORDS MAX_TOKENS KV_BLOCKS LAYERS KILL_AFTER_S GRACE_S \
  ROOMY_KV_BLOCKS KILL_MAX_RUNNING VICTIM_I BEST KILL_SPREAD RESENT REFUSED_RESENT VICTIM_LOG VICTIM_RC KILLED KILL_S WALL \
  NGINX_VERSION
python3 - "$TMP" "$OUT" <<'PY'
import json, os, sys
tmp, out = sys.argv[1], sys.argv[2]
E = os.environ
rr = json.load(open(f"{tmp}/rr.json"))
af = json.load(open(f"{tmp}/affine.json"))
spread = lambda name: open(f"{tmp}/{name}.spread").read().strip()
roomy = None
if E["ROOMY_KV_BLOCKS"]:
    roomy = (json.load(open(f"{tmp}/rr-roomy.json")), json.load(open(f"{tmp}/affine-roomy.json")))
kl = json.load(open(f"{tmp}/kill.json"))
p50 = lambda r: (r.get("ttft_ms") or {}).get("p50", float("nan"))
p95 = lambda r: (r.get("ttft_ms") or {}).get("p95", float("nan"))
ratio = af["cached_share"] / rr["cached_share"] if rr["cached_share"] > 0 else float("inf")
lost = kl["errors"] - kl["cut_streams"] + kl["shed"] + kl["malformed"]
checks = [
    ("cached_tokens share, affinity >= 3x round-robin", ratio >= 3.0,
     f"{af['cached_share']:.3f} vs {rr['cached_share']:.3f} ({ratio:.2f}x)"),
    ("TTFT p50, affinity < round-robin", p50(af) < p50(rr),
     f"{p50(af):.0f} ms vs {p50(rr):.0f} ms"),
    ("no error in the two routing runs",
     rr["errors"] + rr["malformed"] + af["errors"] + af["malformed"] == 0,
     f"{rr['errors'] + rr['malformed']} + {af['errors'] + af['malformed']}"),
    ("kill: no request lost that had not started streaming", lost == 0,
     f"{lost} lost (errors before the first token, sheds after 5 retries, malformed)"),
    ("kill: streams that had started finished", kl["cut_streams"] == 0,
     f"{kl['cut_streams']} cut"),
]
ok = all(c[1] for c in checks)
def row(name, r, spread):
    return (f"| {name} | {r['requests']} | {r['prompt_tokens']:,} | {r['cached_tokens']:,} | "
            f"{r['cached_share']:.3f} | {p50(r):.0f} | {p95(r):.0f} | "
            f"{r['aggregate_tok_s']:.1f} | {r['wall_s']:.1f} | {r['errors'] + r['malformed']} | {spread} |")
killed = "was killed (SIGKILL)" if E["KILLED"] == "yes" else "exited on its own"
completed = kl["requests"] - kl["errors"] - kl["shed"] - kl["malformed"]
lines = [
    "# Replicas behind nginx: cache-affine vs round-robin routing, and a replica killed (CPU)",
    "",
    "Generated by `tools/deploy/affinity-test.sh` (docs/DEPLOY.md); do not edit by hand.",
    "",
    f"Setup: {E['REPLICAS']} memra-server replicas on this machine's CPU (`--device cpu --threads 1"
    f" --kv-blocks {E['KV_BLOCKS']}` of 16 positions each, `--drain-timeout-s {E['GRACE_S']}"
    f" --cache-key-header`), a synthetic SmolLM2-135M-shaped model cut to {E['LAYERS']} layers"
    " (Q8_0, random weights, the real SmolLM2 tokenizer and chat template), behind nginx"
    f" {E['NGINX_VERSION']} on loopback with deploy/nginx/memra.conf. Load: `memra-bench load`,"
    f" {E['CLIENTS']} clients, each {E['CONVS']} conversations of {E['TURNS']} turns one after"
    f" another (each turn adds ~{E['WORDS']} words of new user text and resends the history with"
    f" the replies; {E['MAX_TOKENS']} tokens per reply), the conversation id in"
    " `x-memra-cache-key`. Each routing run starts from fresh replicas (empty caches). Machine:"
    f" {os.cpu_count()} cores, shared with other work while this ran.",
    "",
    "Why the KV pool is small: with affinity each replica holds the conversations hashed to it;"
    " with round-robin every replica sees every conversation, so its prefix cache would have to"
    f" hold {E['REPLICAS']}x as much. {E['KV_BLOCKS']} blocks per replica hold about one"
    " replica's share of the live conversations, not all of them: the regime affinity exists"
    " for; a roomier pool (below, when ROOMY_KV_BLOCKS is set) shows the smaller gap without"
    " that pressure.",
    "",
    f"Clients and replicas: {E['CLIENTS']} clients on {E['REPLICAS']} replicas. When the client"
    " count is a multiple of the replica count and the clients run in step, nginx's round-robin"
    " sends each client's next request back to the same replica: affinity by accident, which"
    " flatters round-robin (measured: 16 clients on 4 replicas gave round-robin half of"
    " affinity's share). Real arrivals are not in step, so the counts are kept coprime.",
    "",
    "| routing | requests | prompt tokens | cached tokens | cached share | TTFT p50 ms | TTFT p95 ms | tok/s | wall s | errors | requests per replica |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
    row(f"round-robin, {E['KV_BLOCKS']} KV blocks", rr, spread("rr")),
    row(f"affinity (hash on x-memra-cache-key), {E['KV_BLOCKS']} KV blocks", af, spread("affine")),
]
if roomy:
    rrr, rar = roomy
    lines += [
        row(f"round-robin, {E['ROOMY_KV_BLOCKS']} KV blocks (comparison)", rrr, spread("rr-roomy")),
        row(f"affinity, {E['ROOMY_KV_BLOCKS']} KV blocks (comparison)", rar, spread("affine-roomy")),
    ]
    r2 = rar["cached_share"] / rrr["cached_share"] if rrr["cached_share"] > 0 else float("inf")
    lines += ["", f"With the roomier pool ({E['ROOMY_KV_BLOCKS']} blocks) the cached share is"
              f" {rar['cached_share']:.3f} vs {rrr['cached_share']:.3f} ({r2:.2f}x): round-robin"
              " still finds the turns that happened to land on the same replica; the pressure of"
              " every conversation on every replica is what makes it lose most of them."]
lines += [
    "",
    "Kill: the same affinity load (clients retry 429/503 after Retry-After, up to 5 times) on"
    f" fresh replicas with `--max-running {E['KILL_MAX_RUNNING']}` (so requests wait in a queue);"
    f" replica {E['VICTIM_I']} (the busiest: {E['BEST']} requests in flight) got SIGTERM after"
    f" {E['KILL_AFTER_S']} s of load, then SIGKILL if still alive"
    f" after {E['GRACE_S']} s. It {killed} {E['KILL_S']} s after the SIGTERM, exit status"
    f" {E['VICTIM_RC']}. Requests: {kl['requests']}, completed {completed}, errors"
    f" {kl['errors']} (streams cut after their first token: {kl['cut_streams']}), shed after"
    f" the retries {kl['shed']}, client retries after a 503/429: {kl['retried']}; nginx re-sent"
    f" {E['RESENT']} requests the draining replica answered 503 and {E['REFUSED_RESENT']} after"
    f" a connection error; requests per replica (final upstream) {E['KILL_SPREAD']}.",
    "",
    f"Replica {E['VICTIM_I']}'s log: {E['VICTIM_LOG']}",
    "",
    "| must reach | result | measured |",
    "|---|---|---|",
]
lines += [f"| {n} | {'PASS' if p else 'FAIL'} | {m} |" for n, p, m in checks]
lines += ["", f"Wall time of the whole test: {E['WALL']} s.", ""]
open(out, "w").write("\n".join(lines))
print("\n".join(lines))
sys.exit(0 if ok else 1)
PY
