// The validator must fail on broken manifests, each for its own reason.
//
//   node deploy/k8s/validate/breakage_test.mjs --k8s-dir deploy/k8s --bin-dir build/bin
//
// Copies deploy/k8s (node_modules linked, not copied) once per breakage,
// with deploy/grafana beside it (the Grafana component renders its files),
// makes one edit a person could plausibly make, runs validate.mjs on the
// copy and asserts that it exits 1 naming the problem. The unbroken copy
// must pass first, so that each failure below is the edit's doing.

import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
let k8sDir = path.join(here, "..");
let binDir = process.env.SLUICE_BIN_DIR;
let compose;
for (let i = 2; i < process.argv.length; i++) {
  if (process.argv[i] === "--k8s-dir") k8sDir = process.argv[++i];
  else if (process.argv[i] === "--bin-dir") binDir = process.argv[++i];
  else if (process.argv[i] === "--compose") compose = process.argv[++i];
}
k8sDir = path.resolve(k8sDir);
compose ??= path.resolve(k8sDir, "..", "..", "docker-compose.yml");

// [what, file, text to replace, replacement, expected message]
const BREAKAGES = [
  ["an unknown config key", "base/config/controller.yaml", "metrics_port: 9091",
   "metrics_port: 9091\nmax_runs: 4", "--max-runs (controller.yaml key max_runs) is not a flag"],
  ["an unknown flag in args", "base/rollout-worker.yaml", "- --worker-id=$(POD_NAME)",
   "- --worker-name=$(POD_NAME)", "--worker-name (args) is not a flag of sluice-rollout-worker"],
  ["a misspelt field", "base/rollout-worker.yaml", "readinessProbe:", "readinesProbe:",
   "unknown field spec.template.spec.containers[0].readinesProbe"],
  ["a wrong type", "base/controller.yaml", "replicas: 1", "replicas: one",
   "must be integer"],
  ["a port not the binary's default", "base/trainer.yaml", "containerPort: 50055",
   "containerPort: 50056", "containerPort grpc must be sluice-trainer's default 50055"],
  ["a config port not the container's", "base/config/replay-buffer.yaml", "metrics_port: 9094",
   "metrics_port: 9194", "metrics port 9194 must be 9094"],
  ["a probe on the wrong port", "base/reward-server.yaml", "livenessProbe:\n            grpc: {port: 50053}",
   "livenessProbe:\n            grpc: {port: 9093}", "livenessProbe must be a grpc probe on port 50053"],
  ["no readiness probe", "base/replay-buffer.yaml",
   "          readinessProbe:\n            grpc: {port: 50054}\n            periodSeconds: 5\n            timeoutSeconds: 3\n",
   "", "no readinessProbe"],
  ["no memory limit", "base/controller.yaml", "limits: {cpu: \"1\", memory: 1Gi}",
   "limits: {cpu: \"1\"}", "no resources.limits.memory"],
  ["root", "base/trainer.yaml", "runAsNonRoot: true", "runAsNonRoot: false",
   "runAsNonRoot must be true"],
  ["a writable root filesystem", "base/controller.yaml", "readOnlyRootFilesystem: true",
   "readOnlyRootFilesystem: false", "readOnlyRootFilesystem must be true"],
  ["the sandbox exception elsewhere", "base/trainer.yaml", "automountServiceAccountToken: false",
   "automountServiceAccountToken: false\n      hostUsers: false",
   "sandbox exception outside the reward server"],
  ["half the sandbox exception", "components/code-sandbox/reward-server-sandbox.yaml",
   "- op: add\n  path: /spec/template/spec/hostUsers\n  value: false\n", "",
   "procMount Unmasked needs hostUsers: false"],
  ["the GPU overlay without the sandbox", "overlays/gpu/kustomization.yaml",
   "  - ../../components/code-sandbox", "",
   "GPU overlay: the reward server's sandbox needs its exception"],
  ["a memory budget the limit cannot hold", "base/config/trainer.yaml", "memory_budget: 80%",
   "memory_budget: 100%", "--memory-budget 100%"],
  ["a Service selecting nothing", "base/replay-buffer.yaml",
   "  selector:\n    app.kubernetes.io/name: sluice-replay-buffer\n  ports:",
   "  selector:\n    app.kubernetes.io/name: sluice-replay-bufer\n  ports:", "selects no pod template"],
  ["a NetworkPolicy naming no pods", "base/networkpolicies.yaml",
   "  name: sluice-trainer\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: sluice-trainer",
   "  name: sluice-trainer\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: sluice-trainr",
   "NetworkPolicy/sluice-trainer: selects no pod"],
  ["a caller shut out", "base/networkpolicies.yaml",
   "  name: sluice-rollout-worker\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: sluice-rollout-worker\n  policyTypes: [Ingress]\n  ingress:\n    - from:\n        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: sluice-rollout-worker",
   "  name: sluice-rollout-worker\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: sluice-rollout-worker\n  policyTypes: [Ingress]\n  ingress:\n    - from:\n        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: sluice-trainer",
   "NetworkPolicy: sluice-rollout-worker may not call sluice-rollout-worker"],
  ["a worker advertising a wildcard", "base/rollout-worker.yaml",
   "--advertise-address=$(POD_IP):50052", "--advertise-address=0.0.0.0:50052",
   "--advertise-address must be $(POD_IP):50052"],
  ["a controller address off its Service", "base/config/controller.yaml",
   "trainer_address: sluice-trainer:50055", "trainer_address: trainer:50055",
   "controller --trainer-address is trainer:50055"],
  ["a PodMonitor without its job", "components/prometheus-operator/monitoring.yaml",
   "  jobLabel: app.kubernetes.io/name\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: sluice-rollout-worker",
   "  selector:\n    matchLabels:\n      app.kubernetes.io/name: sluice-rollout-worker",
   "needs jobLabel"],
  ["a trainer without its GPU", "overlays/gpu/gpu-resources.yaml",
   "limits: {cpu: \"16\", memory: 160Gi, nvidia.com/gpu: \"1\"}",
   "limits: {cpu: \"16\", memory: 160Gi}", "GPU overlay: no nvidia.com/gpu limit"],
  ["a PDB that blocks drains", "overlays/cpu-demo/kustomization.yaml",
   "  - name: sluice-reward-server\n    count: 2", "  - name: sluice-reward-server\n    count: 1",
   "minAvailable 1 with 1 replicas blocks drains"],
  ["a missing resource", "base/kustomization.yaml", "  - trainer.yaml", "  - trainr.yaml",
   "kubectl kustomize failed"],
  // The Grafana component (rendered with each overlay) and deploy/grafana.
  ["a dashboard left out of Kubernetes", "../grafana/kustomization.yaml",
   "      - dashboards/sluice-grpc.json\n", "",
   "dashboard sluice-grpc.json is not in ConfigMap"],
  ["Grafana's datasource outside Prometheus's namespace",
   "components/grafana/datasources/prometheus.yml", "prometheus-operated.monitoring.svc",
   "prometheus-operated.observability.svc", "is in namespace observability"],
  ["Grafana as root", "components/grafana/grafana.yaml", "runAsNonRoot: true", "runAsNonRoot: false",
   "sluice-grafana: runAsNonRoot must be true"],
  // docker-compose.yml (a copy), when the repository has one.
  ["compose on another metrics port", "compose:", "--metrics-port=9093", "--metrics-port=9193",
   "sluice-reward-server ports 50053/9093, docker-compose reward-server 50053/9193"],
  ["compose dialing another port", "compose:", "--trainer-address=trainer:50055",
   "--trainer-address=trainer:50056", "--trainer-address port 50055, docker-compose 50056"],
];

// deploy/k8s at DIR/k8s, and deploy/grafana at DIR/grafana when there is one.
function copyDeploy(dir) {
  copyTree(k8sDir, path.join(dir, "k8s"));
  const grafana = path.join(k8sDir, "..", "grafana");
  if (fs.existsSync(grafana)) copyTree(grafana, path.join(dir, "grafana"));
  return path.join(dir, "k8s");
}

function copyTree(from, to) {
  fs.mkdirSync(to, { recursive: true });
  for (const entry of fs.readdirSync(from, { withFileTypes: true })) {
    const source = path.join(from, entry.name);
    const target = path.join(to, entry.name);
    if (entry.name === "node_modules") fs.symlinkSync(source, target);
    else if (entry.isDirectory()) copyTree(source, target);
    else fs.copyFileSync(source, target);
  }
}

const work = fs.mkdtempSync(path.join(os.tmpdir(), "sluice-k8s-breakage-"));
// Written by the first (unbroken) run, read by the others.
const helpCache = path.join(work, "help.json");

function validate(dir, composeFile) {
  const argv = [path.join(here, "validate.mjs"), "--k8s-dir", dir, "--bin-dir", binDir,
                "--help-cache", helpCache];
  if (composeFile) argv.push("--compose", composeFile);
  return new Promise((resolve) => {
    const child = spawn(process.execPath, argv, { stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    child.stdout.on("data", (d) => (output += d));
    child.stderr.on("data", (d) => (output += d));
    child.on("exit", (status) => resolve({ status, output }));
  });
}

let failures = 0;
const hasCompose = fs.existsSync(compose);
try {
  const clean = copyDeploy(path.join(work, "clean"));
  const baseline = await validate(clean, hasCompose ? compose : undefined);
  if (baseline.status !== 0) {
    console.error(`the unbroken manifests fail:\n${baseline.output}`);
    process.exit(1);
  }
  // Three at a time: each run is mostly waiting on kubectl and node's start.
  const queue = BREAKAGES.map((breakage, i) => [breakage, i]);
  const lines = new Array(BREAKAGES.length);
  const one = async ([[what, file, from, to, expected], i]) => {
    const dir = copyDeploy(path.join(work, `broken-${i}`));
    let composeFile;
    let target = path.join(dir, file);
    if (file === "compose:") {
      if (!hasCompose) {
        lines[i] = `skip ${what}: no ${compose}`;
        return;
      }
      composeFile = target = path.join(dir, "docker-compose.yml");
      fs.copyFileSync(compose, composeFile);
    }
    const text = fs.readFileSync(target, "utf8");
    if (!text.includes(from)) {
      lines[i] = `FAIL ${what}: ${file} no longer contains the text to break; update this test`;
      failures++;
      return;
    }
    fs.writeFileSync(target, text.replace(from, to));
    const result = await validate(dir, composeFile);
    if (result.status === 1 && result.output.includes(expected)) {
      lines[i] = `ok   ${what}: ${expected}`;
    } else {
      lines[i] = `FAIL ${what}: exit ${result.status}, expected a problem containing ` +
                 `'${expected}'. Output:\n${result.output}`;
      failures++;
    }
  };
  await Promise.all([1, 2, 3].map(async () => {
    while (queue.length > 0) await one(queue.shift());
  }));
  for (const line of lines) console.log(line);
} finally {
  fs.rmSync(work, { recursive: true, force: true });
}
if (failures > 0) {
  console.error(`${failures} of ${BREAKAGES.length} breakages not caught`);
  process.exit(1);
}
console.log(`all ${BREAKAGES.filter(([, f]) => f !== "compose:" || hasCompose).length} ` +
            "breakages caught");
