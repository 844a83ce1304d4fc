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
#     metrics this server exports must return data;
#   - Grafana dashboard: its JSON type-checked, strictly (unknown fields, wrong types, values
#     outside an enum, missing required fields fail), against Grafana's own schema types
#     (npm @grafana/schema: the dashboard and each panel plugin's options; Prometheus queries:
#     @grafana/grafana-foundation-sdk) by the TypeScript compiler: tools/deploy/grafana-check.mjs.
#     Grafana itself is not installable here. Plus the structure checks (ids, grid, variables);
#   - nginx: `nginx -t` on deploy/nginx/memra.conf (loopback upstreams);
#   - Envoy: envoy.yaml loaded into Envoy's API schema (PyPI xds-protos: the generated
#     envoy.config.bootstrap.v3.Bootstrap and every typed_config's extension type; protobuf's
#     parser, unknown fields refused), protoc-gen-validate's rules, deprecated fields refused:
#     tools/deploy/envoy-check.py. `envoy --mode validate` too when an envoy binary is on PATH
#     (none is installable here).
#   Each schema checker is also run on a deliberately broken copy and must reject it.
#
# Python and npm packages are pinned and installed once into ${MEMRA_CACHE:-~/.cache/memra}/
# deploy-validate (pip --target / a venv / npm --prefix, never the system); when PyPI or npm
# cannot be reached on the first run, the check fails and says so.
#
# Exit 0 when every check that ran passed. Needs: kubectl (or kustomize), python3 with venv and
# pip, node + npm, promtool + prometheus (apt-get install -y prometheus), nginx; MEMRA_BIN_DIR as
# in affinity-test.sh (default: cargo build).
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

# --- Pinned tools from the registries, cached ---------------------------------------------
CACHE="${MEMRA_CACHE:-$HOME/.cache/memra}/deploy-validate"
mkdir -p "$CACHE"
key() { (python3 -c 'import sys, sysconfig; print(sys.version, sysconfig.get_platform())'; printf '%s\n' "$@") | sha256sum | cut -c1-12; }
# pip_target NAME SPEC...: pip installs exactly SPEC... (a complete pinned list: no dependency
# resolution) once into $CACHE/NAME-KEY; prints the directory. Log: $TMP/pip-NAME.log.
pip_target() {
  local name="$1"
  shift
  local dir
  dir="$CACHE/$name-$(key "$@")"
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir" "$dir.tmp"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir.tmp" "$@" \
      >"$TMP/pip-$name.log" 2>&1 || return 1
    touch "$dir.tmp/.complete"
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}
# pip_venv NAME SPEC...: a venv with SPEC... and their dependencies, once, in $CACHE/NAME-KEY.
pip_venv() {
  local name="$1"
  shift
  local dir
  dir="$CACHE/$name-$(key "$@")"
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    { python3 -m venv "$dir" && "$dir/bin/pip" install --quiet --disable-pip-version-check "$@"; } \
      >"$TMP/pip-$name.log" 2>&1 || { rm -rf "$dir"; return 1; }
    touch "$dir/.complete"
  fi
  echo "$dir"
}
# npm_prefix NAME SPEC...: npm installs SPEC... once into $CACHE/NAME-KEY/node_modules.
npm_prefix() {
  local name="$1"
  shift
  local dir
  dir="$CACHE/$name-$(printf '%s\n' "$@" | sha256sum | cut -c1-12)"
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir" "$dir.tmp"
    mkdir -p "$dir.tmp"
    echo '{"private": true}' >"$dir.tmp/package.json"
    npm install --prefix "$dir.tmp" --no-audit --no-fund --ignore-scripts --loglevel=error "$@" \
      >"$TMP/npm-$name.log" 2>&1 || return 1
    touch "$dir.tmp/.complete"
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}
# The first error line of an install log (else its last line), for a failure message.
errline() { grep -m1 -E '(Error|ERROR):' "$1" 2>/dev/null || grep -v '^\s*$' "$1" 2>/dev/null | tail -1; }

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
K8S_PY=(kubernetes-validate==1.37.0)
if KV="$(pip_venv k8s "${K8S_PY[@]}")"; then
  for v in 1.30.0 1.37.0; do
    if "$KV/bin/kubernetes-validate" --strict --quiet -k "$v" "$TMP/k8s.yaml"; then
      pass "kubernetes-validate --strict -k $v ($(grep -c '^kind:' "$TMP/k8s.yaml") objects)"
    else
      fail "kubernetes-validate --strict -k $v"
    fi
  done
else
  fail "kubernetes-validate: pip could not install ${K8S_PY[*]} (is PyPI reachable?): $(errline "$TMP/pip-k8s.log")"
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
# Envoy's API schema from PyPI: xds-protos (the envoy.* protobufs generated from
# envoyproxy/data-plane-api), protobuf, protoc-gen-validate's runtime and its dependencies.
ENVOY_PY=(xds-protos==1.85.0 protobuf==6.33.6 protoc-gen-validate==1.3.3 Jinja2==3.1.6
  MarkupSafe==3.0.4 validate-email==1.3 PyYAML==6.0.4)
ENVOY_YAML=deploy/k8s/envoy/envoy.yaml
if EP="$(pip_target envoy "${ENVOY_PY[@]}")"; then
  envoy_check() { PYTHONPATH="$EP" python3 tools/deploy/envoy-check.py "$1" >"$2" 2>&1; }
  if envoy_check "$ENVOY_YAML" "$TMP/envoy-check.log"; then
    pass "Envoy schema (xds-protos 1.85.0, protobuf 6.33.6, protoc-gen-validate 1.3.3): $(tail -1 "$TMP/envoy-check.log")"
  else
    fail "Envoy schema: $ENVOY_YAML:"
    cat "$TMP/envoy-check.log"
  fi
  # The checker must reject: a misspelled field inside a typed_config (an Any), and a value
  # that breaks a protoc-gen-validate rule (connect_timeout must be > 0).
  sed 's/^\( *\)retry_on:/\1retry_onn:/' "$ENVOY_YAML" >"$TMP/envoy-bad1.yaml"
  sed 's/^\( *\)connect_timeout: 2s/\1connect_timeout: 0s/' "$ENVOY_YAML" >"$TMP/envoy-bad2.yaml"
  if ! envoy_check "$TMP/envoy-bad1.yaml" "$TMP/envoy-bad1.log" && grep -q '"retry_onn"' "$TMP/envoy-bad1.log" &&
    ! envoy_check "$TMP/envoy-bad2.yaml" "$TMP/envoy-bad2.log" && grep -q 'connect_timeout is not greater' "$TMP/envoy-bad2.log"; then
    pass "Envoy schema rejects a broken copy (retry_onn in a typed_config; connect_timeout: 0s)"
  else
    fail "Envoy schema accepted a broken copy:"
    cat "$TMP/envoy-bad1.log" "$TMP/envoy-bad2.log"
  fi
else
  fail "Envoy schema: pip could not install ${ENVOY_PY[*]} (is PyPI reachable?): $(errline "$TMP/pip-envoy.log")"
fi
if command -v envoy >/dev/null; then
  envoy --mode validate -c "$ENVOY_YAML" >"$TMP/envoy.log" 2>&1 &&
    pass "envoy --mode validate" || fail "envoy --mode validate: $(tail -3 "$TMP/envoy.log")"
else
  skip "envoy --mode validate (no envoy binary: not packaged for Debian, PyPI or npm here; the schema check above stands in)"
fi

# --- Grafana dashboard: Grafana's schema types ------------------------------------------
GRAFANA_NPM=(typescript@5.9.3 @grafana/schema@13.2.3 @grafana/grafana-foundation-sdk@0.0.21)
DASH=deploy/grafana/memra-dashboard.json
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  fail "Grafana schema: needs node and npm (apt-get install -y nodejs npm)"
elif GN="$(npm_prefix grafana "${GRAFANA_NPM[@]}")"; then
  if node tools/deploy/grafana-check.mjs "$DASH" "$GN/node_modules" >"$TMP/grafana-check.log" 2>&1; then
    pass "Grafana schema: $(tail -1 "$TMP/grafana-check.log")"
  else
    fail "Grafana schema: $DASH:"
    cat "$TMP/grafana-check.log"
  fi
  # The checker must reject a copy with an unknown top-level field, an unknown panel option and
  # a string where a number belongs, naming each.
  python3 - "$DASH" "$TMP/dash-bad.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["titel"] = "typo"
ts = next(p for p in d["panels"] if p["type"] == "timeseries")
ts["options"]["tooltipp"] = {}
ts["gridPos"]["w"] = "12"
json.dump(d, open(sys.argv[2], "w"), indent=2)
PY
  if ! node tools/deploy/grafana-check.mjs "$TMP/dash-bad.json" "$GN/node_modules" >"$TMP/grafana-bad.log" 2>&1 &&
    grep -q "'\"titel\"' does not exist" "$TMP/grafana-bad.log" &&
    grep -q "'\"tooltipp\"' does not exist" "$TMP/grafana-bad.log" &&
    grep -q "\"w\": \"12\".*not assignable to type 'number'" "$TMP/grafana-bad.log"; then
    pass "Grafana schema rejects a broken copy (unknown field titel, unknown option tooltipp, gridPos.w \"12\")"
  else
    fail "Grafana schema did not reject the broken copy as expected:"
    cat "$TMP/grafana-bad.log"
  fi
else
  fail "Grafana schema: npm could not install ${GRAFANA_NPM[*]} (is the npm registry reachable?): $(errline "$TMP/npm-grafana.log")"
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
