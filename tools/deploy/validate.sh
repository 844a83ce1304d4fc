#!/usr/bin/env bash
# Checks the files under deploy/ with the real tools this machine can install, and says what it
# could not check (docs/DEPLOY.md, "What is validated"):
#
#   - Kubernetes: `kubectl kustomize` renders deploy/k8s, kubernetes-validate (PyPI; it ships
#     the Kubernetes JSON schemas) checks every rendered object, strict (unknown fields refused),
#     against Kubernetes 1.30 and its newest version;
#   - Prometheus: promtool checks the rules and both scrape configs (Debian's promtool is built
#     without Kubernetes service discovery, so prometheus.yml is checked with its
#     kubernetes_sd_configs block swapped for a static target; the rest is as shipped);
#   - Prometheus + Grafana dashboard, live: one memra-server on the CPU with a tiny synthetic
#     model serves a few requests, a real Prometheus (Debian package) scrapes it with
#     prometheus-static.yml and the rules, and every PromQL expression of the dashboard and of
#     the rules is evaluated through Prometheus's API: it must parse, and the ones over
#     metrics this server exports must return data. The dashboard's JSON structure is checked
#     here (Grafana itself is not installable on this machine);
#   - nginx: `nginx -t` on deploy/nginx/memra.conf (loopback upstreams);
#   - Envoy: `envoy --mode validate` when an envoy binary is on PATH, else said to be skipped.
#
# Exit 0 when every check that ran passed. Needs: kubectl (or kustomize), python3 with venv,
# promtool + prometheus (apt-get install -y prometheus), nginx; MEMRA_BIN_DIR as in
# affinity-test.sh (default: cargo build).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
TMP="$(mktemp -d /tmp/memra-validate.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

FAILED=0
SKIPPED=()
pass() { echo "PASS  $*"; }
fail() {
  echo "FAIL  $*"
  FAILED=1
}
skip() {
  echo "SKIP  $*"
  SKIPPED+=("$*")
}

# --- Kubernetes -------------------------------------------------------------------------
if command -v kubectl >/dev/null; then
  kubectl kustomize deploy/k8s >"$TMP/k8s.yaml" && pass "kubectl kustomize deploy/k8s" ||
    fail "kubectl kustomize deploy/k8s"
elif command -v kustomize >/dev/null; then
  kustomize build deploy/k8s >"$TMP/k8s.yaml" && pass "kustomize build deploy/k8s" ||
    fail "kustomize build deploy/k8s"
else
  skip "kustomize render (no kubectl or kustomize on PATH): validating the plain files"
  for f in deploy/k8s/base/*.yaml deploy/k8s/envoy/deployment.yaml deploy/k8s/envoy/service.yaml; do
    case "$f" in */kustomization.yaml) continue ;; esac
    printf -- '---\n' >>"$TMP/k8s.yaml"
    cat "$f" >>"$TMP/k8s.yaml"
  done
fi
if python3 -m venv "$TMP/venv" >/dev/null 2>&1 &&
  "$TMP/venv/bin/pip" install -q "kubernetes-validate==1.37.0" >"$TMP/pip.log" 2>&1; then
  for v in 1.30.0 1.37.0; do
    if "$TMP/venv/bin/kubernetes-validate" --strict --quiet -k "$v" "$TMP/k8s.yaml"; then
      pass "kubernetes-validate --strict -k $v ($(grep -c '^kind:' "$TMP/k8s.yaml") objects)"
    else
      fail "kubernetes-validate --strict -k $v"
    fi
  done
else
  skip "kubernetes-validate (pip install failed: $(tail -1 "$TMP/pip.log" 2>/dev/null))"
fi

# --- Prometheus config and rules --------------------------------------------------------
if command -v promtool >/dev/null; then
  cp deploy/prometheus/*.yml "$TMP/"
  (cd "$TMP" && promtool check rules memra-rules.yml >/dev/null) && pass "promtool check rules" ||
    fail "promtool check rules memra-rules.yml"
  (cd "$TMP" && promtool check config prometheus-static.yml >/dev/null) &&
    pass "promtool check config prometheus-static.yml" || fail "promtool check config prometheus-static.yml"
  python3 - "$TMP/prometheus.yml" "$TMP/prometheus-k8s-static.yml" <<'PY'
import re, sys
c = open(sys.argv[1]).read()
c, n = re.subn(r"    kubernetes_sd_configs:\n(?:      .*\n)+",
               "    static_configs:\n      - targets: ['127.0.0.1:8080']\n", c)
assert n == 1, "kubernetes_sd_configs block not found"
open(sys.argv[2], "w").write(c)
PY
  if (cd "$TMP" && promtool check config prometheus.yml >/dev/null 2>&1); then
    pass "promtool check config prometheus.yml"
  elif (cd "$TMP" && promtool check config prometheus-k8s-static.yml >/dev/null); then
    pass "promtool check config prometheus.yml, kubernetes_sd_configs swapped for a static target (this promtool has no Kubernetes SD)"
  else
    fail "promtool check config prometheus.yml"
  fi
else
  skip "promtool (apt-get install -y prometheus)"
fi

# --- nginx ------------------------------------------------------------------------------
if command -v nginx >/dev/null; then
  mkdir -p "$TMP/nginx"
  sed -e 's/server memra-[0-9].*:8080/server 127.0.0.1:18990/' \
    -e 's/^        listen 8080;/        listen 127.0.0.1:18989;/' deploy/nginx/memra.conf >"$TMP/nginx/nginx.conf"
  nginx -t -p "$TMP/nginx" -c nginx.conf >"$TMP/nginx.log" 2>&1 && pass "nginx -t deploy/nginx/memra.conf" ||
    fail "nginx -t: $(cat "$TMP/nginx.log")"
else
  skip "nginx -t (apt-get install -y nginx)"
fi

# --- Envoy ------------------------------------------------------------------------------
if command -v envoy >/dev/null; then
  envoy --mode validate -c deploy/k8s/envoy/envoy.yaml >"$TMP/envoy.log" 2>&1 &&
    pass "envoy --mode validate" || fail "envoy --mode validate: $(tail -3 "$TMP/envoy.log")"
else
  skip "envoy --mode validate (no envoy binary: not packaged for Debian or PyPI here)"
fi

# --- Grafana dashboard structure --------------------------------------------------------
python3 - deploy/grafana/memra-dashboard.json >"$TMP/exprs.txt" <<'PY' && pass "dashboard JSON structure ($(wc -l <"$TMP/exprs.txt") expressions)" || fail "dashboard JSON structure"
import json, sys
d = json.load(open(sys.argv[1]))
for k in ["title", "uid", "panels", "schemaVersion", "templating"]:
    assert k in d, f"missing {k}"
ids, exprs = set(), []
for p in d["panels"]:
    assert p["id"] not in ids, f"duplicate panel id {p['id']}"
    ids.add(p["id"])
    assert p["type"] in ("timeseries", "stat"), p["type"]
    g = p["gridPos"]
    assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, g
    assert p["datasource"]["uid"] == "${datasource}"
    for t in p["targets"]:
        exprs.append(t["expr"])
names = {v["name"] for v in d["templating"]["list"]}
for e in exprs:
    for var in ("instance", "model", "tenant"):
        if "$" + var in e:
            assert var in names, f"undefined variable ${var}"
for e in exprs:
    print(e)
PY

# --- Live: memra-server -> Prometheus -> every expression -------------------------------
if command -v prometheus >/dev/null; then
  if [ -n "${MEMRA_BIN_DIR:-}" ]; then
    BIN="$MEMRA_BIN_DIR"
  else
    cargo build --release --quiet -p memra-server -p memra-bench
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
  fi
  TOKENIZER="$(tools/fetch-models.sh)"
  "$BIN/memra-bench" synth --shape tiny-llama --dtype q8_0 --seed 1 --tokenizer-from "$TOKENIZER" \
    --out "$TMP/tiny.gguf" >/dev/null 2>&1
  MEMRA_MODELS="tiny=$TMP/tiny.gguf" "$BIN/memra-server" --device cpu --threads 1 \
    --addr 127.0.0.1:18991 --kv-blocks 64 >"$TMP/server.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do curl -sf 127.0.0.1:18991/ready >/dev/null && break; sleep 0.2; done
  for i in 1 2 3; do
    curl -sf 127.0.0.1:18991/v1/chat/completions -H 'content-type: application/json' \
      -d '{"model":"tiny","max_tokens":4,"messages":[{"role":"user","content":"hello there, a question"}]}' >/dev/null
  done
  mkdir -p "$TMP/prom"
  sed 's/^          - 127.0.0.1:8080$/          - 127.0.0.1:18991/' deploy/prometheus/prometheus-static.yml |
    sed 's/scrape_interval: 10s/scrape_interval: 1s/; s/evaluation_interval: 15s/evaluation_interval: 1s/' >"$TMP/prom/prometheus.yml"
  cp deploy/prometheus/memra-rules.yml "$TMP/prom/"
  prometheus --config.file="$TMP/prom/prometheus.yml" --storage.tsdb.path="$TMP/prom/data" \
    --web.listen-address=127.0.0.1:18992 >"$TMP/prom.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do curl -sf 127.0.0.1:18992/-/ready >/dev/null && break; sleep 0.2; done
  sleep 4
  for i in 1 2 3; do
    curl -sf 127.0.0.1:18991/v1/chat/completions -H 'content-type: application/json' \
      -d '{"model":"tiny","max_tokens":4,"messages":[{"role":"user","content":"hello there, a question"}]}' >/dev/null
  done
  sleep 4
  if python3 - "$TMP/exprs.txt" deploy/prometheus/memra-rules.yml >"$TMP/live.txt" <<'PY'; then
import json, re, sys, urllib.parse, urllib.request
import yaml
must = [l.rstrip("\n") for l in open(sys.argv[1]) if l.strip()]
parse_only = []
for g in yaml.safe_load(open(sys.argv[2]))["groups"]:
    for r in g["rules"]:
        e = " ".join(r["expr"].split())
        if "record" in r:
            must += [e, r["record"]]
        else:
            parse_only.append(e)  # an alert: empty unless it fires
subst = {"$instance": ".*", "$model": ".*", "$tenant": ".*"}
bad = 0
for e in must + parse_only:
    q = e
    for k, v in subst.items():
        q = q.replace(k, v)
    url = "http://127.0.0.1:18992/api/v1/query?" + urllib.parse.urlencode({"query": q})
    try:
        r = json.load(urllib.request.urlopen(url, timeout=10))
    except Exception as ex:  # a 400 for a bad expression
        print(f"ERROR {e}: {ex}")
        bad += 1
        continue
    n = len(r["data"]["result"])
    if e in parse_only:
        print(f"ok (alert, parsed; {n} firing) {e}")
        continue
    print(f"{'ok' if n else 'EMPTY'} {n} {e}")
    bad += n == 0
sys.exit(1 if bad else 0)
PY
    pass "Prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}') scraped memra-server; $(grep -c '^ok [0-9]' "$TMP/live.txt") dashboard and recording-rule expressions returned data, $(grep -c '^ok (alert' "$TMP/live.txt") alert expressions parsed"
  else
    fail "live Prometheus evaluation:"
    grep -v '^ok' "$TMP/live.txt" || true
  fi
else
  skip "live Prometheus check (apt-get install -y prometheus)"
fi

if [ "${#SKIPPED[@]}" -gt 0 ]; then
  echo "skipped: ${#SKIPPED[@]} (see above)"
fi
exit "$FAILED"
