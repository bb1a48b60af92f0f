#!/usr/bin/env bash
# The docker-compose deployment, for real: builds the images from this tree
# (deploy/docker/build-images.sh: a debootstrap base, the host build's
# binaries), brings up docker-compose.yml on the host network (all traffic on
# loopback) with the code sandbox overlay, waits for every container to be
# healthy, scores code through the containerised sandbox, submits
# configs/smoke.yaml from outside the containers with `sluice submit` and
# watches it to SUCCEEDED, checks that Prometheus scraped every service and
# loaded the rules, checks a killed service is restarted by its restart
# policy, and `docker-compose down -v` leaves nothing of the project behind.
# Then the same run under `sluice quickstart` (sluice up) for the figures,
# written to $SLUICE_DEPLOY_FIGURES (default <build>/deploy-figures/compose.json).
# SLUICE_COMPOSE_SPEC runs another spec (default configs/smoke.yaml), e.g.
# configs/quickstart.yaml for a comparison over minutes.
#
# Starts dockerd when no engine answers (and stops it again). Exits 77
# (skipped) only where Docker cannot run here: not root and no access to an
# engine, or dockerd fails to start; SLUICE_REQUIRE_DOCKER=1 makes that a
# failure.
set -euo pipefail

src=${SLUICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${SLUICE_BIN_DIR:-$src/build/bin}
bin=$(cd "$bin" && pwd)
figures=${SLUICE_DEPLOY_FIGURES:-$bin/../deploy-figures/compose.json}
work=$(mktemp -d /tmp/sluice-compose-test.XXXXXX)
project=sluice-test-$$
python=/usr/bin/python3
spec=${SLUICE_COMPOSE_SPEC:-$src/configs/smoke.yaml}

log() { echo "compose_test: $*"; }
fail() { echo "compose_test: FAIL: $*" >&2; exit 1; }
skip() {
  if [[ ${SLUICE_REQUIRE_DOCKER:-0} == 1 ]]; then fail "SLUICE_REQUIRE_DOCKER=1 but: $*"; fi
  echo "compose_test: SKIPPED: $*"
  exit 77
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

compose=(docker-compose -p "$project" -f "$src/docker-compose.yml"
         -f "$src/deploy/docker/compose.host-network.yml" -f "$src/docker-compose.sandbox.yml")
export SLUICE_BIND=127.0.0.1

started_dockerd=
cleanup() {
  local status=$?
  if docker info >/dev/null 2>&1; then
    if ((status != 0)) && [[ -n $("${compose[@]}" ps -q 2>/dev/null) ]]; then
      echo "compose_test: last logs of the stack:" >&2
      "${compose[@]}" logs --no-color --tail 25 >&2 2>/dev/null || true
    fi
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  if [[ -n $started_dockerd ]]; then
    kill "$started_dockerd" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 0.5; done
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT

for tool in docker docker-compose debootstrap curl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (scripts/install-deps.sh installs it)"
done

# An engine: the running one, or one started here.
if ! docker info >/dev/null 2>&1; then
  if ((EUID != 0)); then skip "no Docker engine answers and only root can start dockerd"; fi
  command -v dockerd >/dev/null || fail "dockerd is not installed (scripts/install-deps.sh installs docker.io)"
  log "starting dockerd"
  setsid dockerd >"$work/dockerd.log" 2>&1 </dev/null &
  started_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  if ! docker info >/dev/null 2>&1; then
    tail -5 "$work/dockerd.log" >&2
    skip "dockerd did not start here (its log above)"
  fi
fi

# The stack takes the services' default ports on the host's loopback.
for port in 50051 50052 50053 50054 50055 9090 9091 9092 9093 9094 9095; do
  if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
    fail "port $port is taken on this host; the host-network stack needs the default ports"
  fi
done

log "building the images from this tree"
start=$(now)
"$src/deploy/docker/build-images.sh" --offline-base --from-tree "$bin" --json "$work/images.json" \
  >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; fail "build-images.sh failed"; }
build_seconds=$(since "$start")
tail -1 "$work/build.log"

# Every library the binaries link is in the image.
missing=$(docker run --rm --network none --entrypoint bash "sluice:latest" -c \
  'for b in /usr/local/bin/sluice*; do ldd "$b" | grep "not found" | sed "s|^|$b: |"; done' || true)
[[ -z $missing ]] || fail "libraries missing in the image: $missing"
[[ $(docker run --rm --network none sluice:latest id -u) == 10001 ]] || fail "the image does not run as uid 10001"

log "docker-compose up"
start=$(now)
"${compose[@]}" up -d --no-build >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "docker-compose up failed"; }
containers=$("${compose[@]}" ps -q)
(($(wc -w <<<"$containers") == 6)) || fail "expected 6 containers, got: $("${compose[@]}" ps)"
healthy=0
for _ in $(seq 240); do
  healthy=0
  for c in $containers; do
    [[ $(docker inspect -f '{{.State.Health.Status}}' "$c") == healthy ]] && healthy=$((healthy + 1))
  done
  ((healthy == 6)) && break
  sleep 0.5
done
((healthy == 6)) || fail "only $healthy of 6 containers became healthy: $("${compose[@]}" ps)"
healthy_seconds=$(since "$start")
log "all 6 containers healthy ${healthy_seconds}s after up"

# The code sandbox works inside the container (the overlay starts the reward
# server with --require-sandbox, so healthy already says so): score a right
# and a wrong program through it.
cat >"$work/code.jsonl" <<'EOF'
{"verifier": "code", "prompt": "def add(a, b):\n", "response": "    return a + b\n", "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}
{"verifier": "code", "prompt": "def add(a, b):\n", "response": "    return a - b\n", "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}
EOF
"$bin/sluice" score --input "$work/code.jsonl" --output "$work/code.out.jsonl" --target 127.0.0.1:50053 --quiet
$python - "$work/code.out.jsonl" <<'EOF' || fail "code scored in the container's sandbox gave wrong rewards"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("compose_test: sandboxed code rewards", [r["reward"] for r in rows], [r.get("error_kind") for r in rows])
assert [r["reward"] for r in rows] == [1, 0], rows
EOF

log "submitting $(basename "$spec") from outside the containers"
start=$(now)
"$bin/sluice" submit "$spec" --target 127.0.0.1:50051 --watch >"$work/submit.log" 2>&1 ||
  { cat "$work/submit.log" >&2; fail "sluice submit --watch did not end in SUCCEEDED"; }
submit_seconds=$(since "$start")
grep -q "^run run-.* SUCCEEDED" "$work/submit.log" || { cat "$work/submit.log" >&2; fail "the run did not end SUCCEEDED"; }
run_id=$(grep -o 'run-[0-9]\{8\}-[0-9]\{6\}-[0-9a-f]*' "$work/submit.log" | head -1)
[[ -n $run_id ]] || fail "no run id in: $(cat "$work/submit.log")"
# The run's files are on the controller's volume.
"${compose[@]}" exec -T controller cat "/var/lib/sluice/runs/$run_id/summary.json" >"$work/summary.json" ||
  fail "no summary.json of $run_id on the controller's runs volume"
"${compose[@]}" exec -T controller cat "/var/lib/sluice/runs/$run_id/spec.json" >"$work/spec.json"
total_steps=$($python -c 'import json,sys; print(json.load(open(sys.argv[1]))["algorithm"]["total_steps"])' "$work/spec.json")
compose_run_seconds=$($python -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["steps"] == int(sys.argv[2]), s["steps"]; print(round(s["wall_seconds"], 1))' "$work/summary.json" "$total_steps")
log "run $run_id SUCCEEDED: ${compose_run_seconds}s of run, ${submit_seconds}s submit to end"

# Prometheus scraped every service, has the run's metrics and the rules.
query() { curl -sf --get --data-urlencode "query=$1" http://127.0.0.1:9090/api/v1/query; }
scraped=
for _ in $(seq 60); do
  scraped=$(query 'up{job=~"sluice-.*"} == 1' | $python -c '
import json, sys
print(" ".join(sorted(r["metric"]["job"] for r in json.load(sys.stdin)["data"]["result"])))' 2>/dev/null || true)
  [[ $scraped == "sluice-controller sluice-replay-buffer sluice-reward-server sluice-rollout-worker sluice-trainer" ]] && break
  sleep 1
done
[[ $scraped == "sluice-controller sluice-replay-buffer sluice-reward-server sluice-rollout-worker sluice-trainer" ]] ||
  fail "Prometheus does not scrape every service (up == 1 for: '$scraped')"
steps=-1
for _ in $(seq 60); do  # the next scrape after the run's end
  steps=$(query 'max(sluice_trainer_step)' | $python -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else -1)')
  ((steps == total_steps)) && break
  sleep 1
done
((steps == total_steps)) || fail "Prometheus has sluice_trainer_step $steps, not $total_steps"
rules=$(curl -sf http://127.0.0.1:9090/api/v1/rules | $python -c 'import json,sys; print(sum(len(g["rules"]) for g in json.load(sys.stdin)["data"]["groups"]))')
((rules > 0)) || fail "Prometheus loaded no rules from deploy/prometheus/rules"
log "Prometheus scrapes all 5 services, saw step $steps, loaded $rules rules"

# The restart policy brings back a service that dies (kill -9 of the
# process, as a crash; `docker kill` would count as stopped by hand).
trainer=$("${compose[@]}" ps -q trainer)
docker exec "$trainer" bash -c 'for p in /proc/[0-9]*; do
  [[ $(cat "$p/comm" 2>/dev/null) == sluice-trainer ]] && kill -9 "${p#/proc/}"; done; true'
for _ in $(seq 120); do
  [[ $(docker inspect -f '{{.RestartCount}} {{.State.Health.Status}}' "$trainer") == "1 healthy" ]] && break
  sleep 0.5
done
[[ $(docker inspect -f '{{.RestartCount}} {{.State.Health.Status}}' "$trainer") == "1 healthy" ]] ||
  fail "the killed trainer was not restarted to healthy: $(docker inspect -f '{{.RestartCount}} {{.State.Status}}' "$trainer")"
log "killed trainer restarted by its policy and healthy again"

log "docker-compose down -v"
"${compose[@]}" down -v --remove-orphans >"$work/down.log" 2>&1 || { cat "$work/down.log" >&2; fail "down failed"; }
left=$(docker ps -aq --filter "label=com.docker.compose.project=$project")
vols=$(docker volume ls -q --filter "label=com.docker.compose.project=$project")
nets=$(docker network ls -q --filter "label=com.docker.compose.project=$project")
[[ -z $left$vols$nets ]] || fail "down -v left containers '$left' volumes '$vols' networks '$nets'"
for port in 50051 50052 50053 50054 50055 9090; do
  ss -Hltn "sport = :$port" | grep -q . && fail "port $port still listened on after down"
done

log "the same run under sluice quickstart (sluice up), for comparison"
start=$(now)
"$bin/sluice" quickstart --runs-dir "$work/qs" --spec "$spec" >"$work/qs.log" 2>&1 ||
  { tail -20 "$work/qs.log" >&2; fail "sluice quickstart failed"; }
quickstart_seconds=$(since "$start")
local_run_seconds=$($python -c 'import glob,json,sys; print(round(json.load(open(glob.glob(sys.argv[1]+"/run-*/summary.json")[0]))["wall_seconds"], 1))' "$work/qs")

mkdir -p "$(dirname "$figures")"
$python - "$work/images.json" "$figures" <<EOF
import json, sys
images = json.load(open(sys.argv[1]))
figures = {
    "spec": "$(basename "$spec")",
    "images": images,
    "image_build_seconds_total": $build_seconds,
    "compose_up_to_healthy_seconds": $healthy_seconds,
    "compose_run_wall_seconds": $compose_run_seconds,
    "compose_submit_to_succeeded_seconds": $submit_seconds,
    "sluice_up_run_wall_seconds": $local_run_seconds,
    "sluice_quickstart_total_seconds": $quickstart_seconds,
    "run_wall_ratio_compose_over_sluice_up": round($compose_run_seconds / max($local_run_seconds, 0.1), 2),
}
json.dump(figures, open(sys.argv[2], "w"), indent=1)
print("compose_test: figures", json.dumps(figures))
EOF
log "PASS"
