// Offline validation of Sluice's Kubernetes manifests (deploy/k8s).
//
//   node deploy/k8s/validate/validate.mjs --k8s-dir deploy/k8s --bin-dir build/bin \
//       [--compose docker-compose.yml] [--start]
//
// For the base and every overlay: `kubectl kustomize` renders it; every
// object validates against the Kubernetes OpenAPI schemas (kubernetes-models,
// and @kubernetes-models/prometheus-operator for ServiceMonitor/PodMonitor),
// with no field the schema does not declare (strict_fields.mjs); then
// Sluice's own rules (below, `check*`), which read the binaries' --help for
// their flags and default ports. With --start, every distinct container of
// every rendering is started as the binary it names, with its args and its
// ConfigMap's YAML (an unknown key makes a binary exit 2), on loopback ports,
// and must report SERVING through gRPC health and exit 0 on SIGTERM.
// With a docker-compose.yml, the ports and addresses of each service must
// agree with it. Optional components that no overlay includes (Grafana) are
// rendered with each overlay too, and checked with their own rules. Exits 1
// listing every problem found.

import { execFileSync, spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";
import { Declarations, unknownFields } from "./strict_fields.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));

// --- Arguments.
const args = { start: false, kubectl: "kubectl" };
for (let i = 2; i < process.argv.length; i++) {
  const arg = process.argv[i];
  const value = () => process.argv[++i];
  if (arg === "--k8s-dir") args.k8sDir = value();
  else if (arg === "--bin-dir") args.binDir = value();
  else if (arg === "--compose") args.compose = value();
  else if (arg === "--kubectl") args.kubectl = value();
  else if (arg === "--start") args.start = true;
  else if (arg === "--help-cache") args.helpCache = value();
  else {
    console.error(`unknown argument ${arg}`);
    process.exit(2);
  }
}
args.k8sDir = path.resolve(args.k8sDir ?? path.join(here, ".."));
args.binDir = args.binDir ?? process.env.SLUICE_BIN_DIR;
if (!args.binDir) {
  console.error("give --bin-dir (or SLUICE_BIN_DIR): the binaries' --help is the reference");
  process.exit(2);
}
if (args.compose === undefined) {
  const candidate = path.resolve(args.k8sDir, "..", "..", "docker-compose.yml");
  if (fs.existsSync(candidate)) args.compose = candidate;
}

const problems = [];
const problem = (where, message) => problems.push(`${where}: ${message}`);

// --- The services: Kubernetes name (= Prometheus job), binary, compose name.
const SERVICES = {
  "sluice-controller": { binary: "sluice-controller", compose: "controller" },
  "sluice-rollout-worker": { binary: "sluice-rollout-worker", compose: "rollout-worker" },
  "sluice-reward-server": { binary: "sluice-reward-server", compose: "reward-server" },
  "sluice-replay-buffer": { binary: "sluice-replay-buffer", compose: "replay-buffer" },
  "sluice-trainer": { binary: "sluice-trainer", compose: "trainer" },
};
const BINARY_TO_SERVICE = Object.fromEntries(
    Object.entries(SERVICES).map(([name, s]) => [s.binary, name]));
const STATE_ROOT = "/var/lib/sluice";
const UID = 10001;

// --- The binaries' flags and defaults, from --help.
function runHelp(binary) {
  const file = path.join(args.binDir, binary);
  for (let attempt = 0; attempt < 2; attempt++) {
    // The lead may relink a binary while this runs: one retry.
    const result = spawnSync(file, ["--help"], { encoding: "utf8" });
    if (result.status === 0) return result.stdout;
    if (attempt === 0) spawnSync("sleep", ["3"]);
    else throw new Error(`${file} --help failed: ${result.error ?? result.stderr}`);
  }
}
function parseHelp(text) {
  const flags = new Map(); // name -> {takesValue, default}
  for (const line of text.split("\n")) {
    const m = /^ {2}(-\S+)(?: ([A-Z][^\n]*?))?(?: {2,}.*)?$/.exec(line);
    if (!m) continue;
    const spec = m[2] ?? "";
    const eq = spec.lastIndexOf("=");
    const takesValue = spec !== "";
    const defaultValue = eq >= 0 ? spec.slice(eq + 1) : undefined;
    // --listen,--listen-address: one flag, known by its last (long) name.
    const names = m[1].split(",").filter((n) => n.startsWith("--")).map((n) => n.slice(2));
    const canonical = names[names.length - 1];
    for (const name of names) flags.set(name, { takesValue, default: defaultValue, canonical });
  }
  return flags;
}
// --help-cache FILE: the texts, read once by breakage_test.mjs for its many
// runs (the LibTorch binaries take half a second each to print their help).
let helpTexts = {};
if (args.helpCache && fs.existsSync(args.helpCache)) {
  helpTexts = JSON.parse(fs.readFileSync(args.helpCache, "utf8"));
}
const HELP = {};
for (const binary of Object.keys(BINARY_TO_SERVICE)) {
  helpTexts[binary] ??= runHelp(binary);
  const flags = parseHelp(helpTexts[binary]);
  const listen = flags.get("listen-address")?.default;
  const metrics = flags.get("metrics-port")?.default;
  if (!listen || !metrics) throw new Error(`${binary} --help: no listen/metrics defaults`);
  HELP[binary] = { flags, grpcPort: Number(listen.split(":").pop()), metricsPort: Number(metrics) };
}

if (args.helpCache && !fs.existsSync(args.helpCache)) {
  fs.writeFileSync(args.helpCache, JSON.stringify(helpTexts));
}

// --- Rendering and schema validation.
// Components an overlay may add that neither shipped overlay includes: each
// is rendered on top of each overlay ("overlays/cpu-demo+components/grafana")
// through a kustomization written to a temporary directory, in the overlay's
// namespace.
const OPTIONAL_COMPONENTS = ["components/grafana"];
const wrapperRoot = fs.mkdtempSync(path.join(os.tmpdir(), "sluice-k8s-optional-"));
process.on("exit", () => fs.rmSync(wrapperRoot, { recursive: true, force: true }));
const renderPaths = new Map();

function kustomizations() {
  const dirs = ["base"];
  const overlays = path.join(args.k8sDir, "overlays");
  for (const entry of fs.readdirSync(overlays).sort()) {
    if (fs.existsSync(path.join(overlays, entry, "kustomization.yaml"))) {
      dirs.push(`overlays/${entry}`);
    }
  }
  for (const overlay of dirs.filter((d) => d.startsWith("overlays/"))) {
    const kustomization = YAML.parse(
        fs.readFileSync(path.join(args.k8sDir, overlay, "kustomization.yaml"), "utf8")) ?? {};
    for (const component of OPTIONAL_COMPONENTS) {
      if (!fs.existsSync(path.join(args.k8sDir, component))) continue;
      const included = (kustomization.components ?? []).some(
          (c) => path.resolve(args.k8sDir, overlay, c) === path.resolve(args.k8sDir, component));
      if (included) continue;
      const label = `${overlay}+${component}`;
      const wrapper = path.join(wrapperRoot, label.replace(/[/+]/g, "_"));
      fs.mkdirSync(wrapper);
      const relative = (target) => path.relative(wrapper, path.join(args.k8sDir, target));
      fs.writeFileSync(path.join(wrapper, "kustomization.yaml"), YAML.stringify({
        apiVersion: "kustomize.config.k8s.io/v1beta1",
        kind: "Kustomization",
        ...(kustomization.namespace ? { namespace: kustomization.namespace } : {}),
        resources: [relative(overlay)],
        components: [relative(component)],
      }));
      renderPaths.set(label, wrapper);
      dirs.push(label);
    }
  }
  return dirs;
}

function render(dir) {
  const where = renderPaths.get(dir) ?? path.join(args.k8sDir, dir);
  const text = execFileSync(args.kubectl, ["kustomize", where],
                            { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  const docs = YAML.parseAllDocuments(text);
  for (const doc of docs) {
    if (doc.errors.length) throw new Error(`${dir}: YAML: ${doc.errors[0].message}`);
  }
  return docs.map((doc) => doc.toJS()).filter((o) => o !== null);
}

const nodeModules = path.join(args.k8sDir, "node_modules");
const declarations = new Declarations(nodeModules);
const modelCache = new Map();

function modelModule(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "monitoring.coreos.com") {
    return `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`;
  }
  return group === "" ? `kubernetes-models/${version}/${kind}`
                      : `kubernetes-models/${group}/${version}/${kind}`;
}

async function validateSchema(where, object) {
  const module = modelModule(object.apiVersion, object.kind);
  let Model;
  try {
    if (!modelCache.has(module)) modelCache.set(module, (await import(module))[object.kind]);
    Model = modelCache.get(module);
  } catch (e) {
    problem(where, `no schema for ${object.apiVersion} ${object.kind} (${module}): ${e.message}`);
    return;
  }
  try {
    new Model(object).validate();
  } catch (e) {
    problem(where, `schema: ${e.message}`);
  }
  for (const field of unknownFields(declarations, path.join(nodeModules, `${module}.d.ts`), object)) {
    problem(where, `schema: unknown field ${field}`);
  }
}

// --- Helpers over rendered objects.
const WORKLOAD_KINDS = new Set(["Deployment", "StatefulSet", "DaemonSet", "Job", "Pod"]);
const podSpec = (o) => (o.kind === "Pod" ? o.spec : o.spec?.template?.spec);
const podLabels = (o) => (o.kind === "Pod" ? o.metadata.labels : o.spec?.template?.metadata?.labels) ?? {};
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const id = (dir, o) => `${dir}: ${o.kind}/${o.metadata?.name}`;

function parseQuantity(q) {
  if (q === undefined) return undefined;
  const m = /^([0-9.]+)([a-zA-Z]*)$/.exec(String(q));
  if (!m) return NaN;
  const units = { "": 1, m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 1024, Mi: 1024 ** 2,
                  Gi: 1024 ** 3, Ti: 1024 ** 4 };
  return Number(m[1]) * (units[m[2]] ?? NaN);
}

// Flags of a container: its args (--name=value or --name value) and the keys
// of the config file it names (--config), with the rendered file's text.
function containerFlags(where, container, configMaps, spec) {
  const flags = new Map();
  const list = [...(container.command ?? []).slice(1), ...(container.args ?? [])];
  for (let i = 0; i < list.length; i++) {
    const arg = String(list[i]);
    if (!arg.startsWith("--")) {
      problem(where, `argument '${arg}' is not a --flag`);
      continue;
    }
    const eq = arg.indexOf("=");
    let name = eq >= 0 ? arg.slice(2, eq) : arg.slice(2);
    let value = eq >= 0 ? arg.slice(eq + 1) : true;
    if (eq < 0 && i + 1 < list.length && !String(list[i + 1]).startsWith("--")) value = list[++i];
    flags.set(canonicalName(binaryOf(container), name), { value, from: "args" });
  }
  let config;
  if (flags.has("config")) {
    const file = flags.get("config").value;
    const mount = (container.volumeMounts ?? []).find(
        (m) => file.startsWith(m.mountPath.replace(/\/?$/, "/")));
    const volume = mount && (spec.volumes ?? []).find((v) => v.name === mount.name);
    const key = mount && (mount.subPath ?? file.slice(mount.mountPath.replace(/\/?$/, "/").length));
    const cm = volume?.configMap && configMaps.get(volume.configMap.name);
    if (!cm) {
      problem(where, `--config ${file} is not in a mounted ConfigMap of this rendering`);
    } else if (!(key in (cm.data ?? {}))) {
      problem(where, `--config ${file}: ConfigMap ${cm.metadata.name} has no key ${key}`);
    } else {
      const text = cm.data[key];
      let parsed;
      try {
        parsed = YAML.parse(text) ?? {};
      } catch (e) {
        problem(where, `--config ${file}: not YAML: ${e.message}`);
        parsed = {};
      }
      config = { file, text, parsed };
      for (const [k, v] of Object.entries(parsed)) {
        const name = canonicalName(binaryOf(container), k.replace(/_/g, "-"));
        if (!flags.has(name)) flags.set(name, { value: v, from: `${key} key ${k}` });
      }
    }
  }
  return { flags, config };
}

const binaryOf = (container) => container.command?.[0];
// An alias (--listen) as the flag's long name (--listen-address); unknown
// names are kept as they are, to be reported.
function canonicalName(binary, name) {
  return HELP[binary]?.flags.get(name)?.canonical ?? name;
}

function effective(flags, binary, name) {
  if (flags.has(name)) return String(flags.get(name).value);
  return HELP[binary].flags.get(name)?.default;
}
const portOf = (address) => Number(String(address).split(":").pop());

// --- Sluice's own rules for one rendering.
function checkRendering(dir, objects) {
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  const configMaps = new Map(byKind("ConfigMap").map((o) => [o.metadata.name, o]));
  const services = byKind("Service");
  const workloads = objects.filter((o) => WORKLOAD_KINDS.has(o.kind));
  const pvcs = new Set(byKind("PersistentVolumeClaim").map((o) => o.metadata.name));
  const overlay = dir.split("+")[0];
  const isGpu = overlay.endsWith("/gpu");
  const isCpuDemo = overlay.endsWith("/cpu-demo");
  const namespaces = byKind("Namespace");
  const enforcesRestricted = namespaces.some(
      (n) => n.metadata.labels?.["pod-security.kubernetes.io/enforce"] === "restricted");
  const containersByService = new Map();

  // Every Sluice service is here, once, as a workload with its Service.
  for (const name of Object.keys(SERVICES)) {
    const found = workloads.filter((w) => w.metadata.name === name);
    if (found.length !== 1) problem(dir, `expected one workload ${name}, found ${found.length}`);
    if (!services.some((s) => s.metadata.name === name)) problem(dir, `no Service ${name}`);
  }

  for (const workload of workloads) {
    const where = id(dir, workload);
    const spec = podSpec(workload);
    const labels = podLabels(workload);
    const name = workload.metadata.name;
    if (name === GRAFANA) continue; // checkGrafana's
    if (workload.spec?.selector?.matchLabels &&
        !matches(workload.spec.selector.matchLabels, labels)) {
      problem(where, "selector does not match its pod template's labels");
    }
    if (labels["app.kubernetes.io/name"] !== name) {
      problem(where, `pod label app.kubernetes.io/name must be ${name}`);
    }
    const podSecurity = spec.securityContext ?? {};
    const isRewardServer = name === "sluice-reward-server";
    if (spec.hostNetwork || spec.hostPID || spec.hostIPC) problem(where, "host namespaces");
    if (spec.automountServiceAccountToken !== false) {
      problem(where, "automountServiceAccountToken must be false (no service calls the API)");
    }
    // Persistent state: a claim the rendering has, or a claim template.
    for (const volume of spec.volumes ?? []) {
      if (volume.persistentVolumeClaim && !pvcs.has(volume.persistentVolumeClaim.claimName)) {
        problem(where, `volume ${volume.name}: no PersistentVolumeClaim ` +
                       `${volume.persistentVolumeClaim.claimName} in the rendering`);
      }
      if (volume.hostPath) problem(where, `volume ${volume.name}: hostPath`);
    }
    const writableClaims = (spec.volumes ?? []).filter(
        (v) => v.persistentVolumeClaim && !v.persistentVolumeClaim.readOnly);
    if (workload.kind === "Deployment" && writableClaims.length > 0) {
      if (workload.spec.replicas !== 1 || workload.spec.strategy?.type !== "Recreate") {
        problem(where, "a Deployment writing a PersistentVolumeClaim must be 1 replica, Recreate");
      }
    }
    const claimTemplates = new Set(
        (workload.spec?.volumeClaimTemplates ?? []).map((t) => t.metadata.name));

    for (const container of [...(spec.initContainers ?? []), ...spec.containers]) {
      const cwhere = `${where} container ${container.name}`;
      const binary = container.command?.[0];
      if (!binary || !HELP[binary]) {
        problem(cwhere, `command must start with a Sluice binary, got ${container.command}`);
        continue;
      }
      if (BINARY_TO_SERVICE[binary] !== name) {
        problem(cwhere, `${binary} runs in ${name}, expected ${BINARY_TO_SERVICE[binary]}`);
      }
      const image = String(container.image ?? "");
      if (!/(^|\/)sluice(:[\w.-]+)?(@sha256:[0-9a-f]+)?$/.test(image)) {
        problem(cwhere, `image ${image} is not the sluice image`);
      }
      const help = HELP[binary];
      const { flags, config } = containerFlags(cwhere, container, configMaps, spec);
      containersByService.set(name, { workload, container, flags, config, binary });
      for (const [flag, { from }] of flags) {
        if (flag === "config") continue;
        if (!help.flags.has(flag)) problem(cwhere, `--${flag} (${from}) is not a flag of ${binary}`);
      }
      // $(VAR) in args must be defined by env (else the kubelet passes it
      // through literally).
      const env = new Map((container.env ?? []).map((e) => [e.name, e]));
      for (const arg of container.args ?? []) {
        for (const m of String(arg).matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
          if (!env.has(m[1])) problem(cwhere, `args use $(${m[1]}) but env does not define it`);
        }
      }

      // Ports: the binary's defaults, named grpc and metrics, and the
      // effective listen address and metrics port agree with them.
      const ports = new Map((container.ports ?? []).map((p) => [p.name, p.containerPort]));
      if (ports.get("grpc") !== help.grpcPort) {
        problem(cwhere, `containerPort grpc must be ${binary}'s default ${help.grpcPort}, got ` +
                        `${ports.get("grpc")}`);
      }
      if (ports.get("metrics") !== help.metricsPort) {
        problem(cwhere, `containerPort metrics must be ${binary}'s default ${help.metricsPort}, ` +
                        `got ${ports.get("metrics")}`);
      }
      const listen = effective(flags, binary, "listen-address");
      if (portOf(listen) !== help.grpcPort || !listen.startsWith("0.0.0.0:")) {
        problem(cwhere, `listen address ${listen} must be 0.0.0.0:${help.grpcPort}`);
      }
      if (Number(effective(flags, binary, "metrics-port")) !== help.metricsPort) {
        problem(cwhere, `metrics port ${effective(flags, binary, "metrics-port")} must be ` +
                        `${help.metricsPort}`);
      }

      // Probes: gRPC health on the gRPC port, liveness and readiness always.
      for (const probe of ["livenessProbe", "readinessProbe", "startupProbe"]) {
        const p = container[probe];
        if (!p) {
          if (probe !== "startupProbe") problem(cwhere, `no ${probe}`);
          continue;
        }
        if (p.grpc?.port !== help.grpcPort) {
          problem(cwhere, `${probe} must be a grpc probe on port ${help.grpcPort}`);
        }
        if (p.grpc?.service) problem(cwhere, `${probe} checks service '${p.grpc.service}', not ""`);
      }

      // Resources: requests and limits of CPU and memory; GPUs as the
      // overlay says; --memory-budget within the memory limit.
      const resources = container.resources ?? {};
      for (const kind of ["requests", "limits"]) {
        for (const r of ["cpu", "memory"]) {
          if (resources[kind]?.[r] === undefined) problem(cwhere, `no resources.${kind}.${r}`);
        }
      }
      for (const r of ["cpu", "memory"]) {
        if (parseQuantity(resources.requests?.[r]) > parseQuantity(resources.limits?.[r])) {
          problem(cwhere, `resources.requests.${r} exceeds the limit`);
        }
      }
      const gpu = resources.limits?.["nvidia.com/gpu"];
      if (gpu !== undefined && resources.requests?.["nvidia.com/gpu"] !== undefined &&
          String(resources.requests["nvidia.com/gpu"]) !== String(gpu)) {
        problem(cwhere, "nvidia.com/gpu requests must equal limits");
      }
      const wantsGpu = isGpu && ["sluice-trainer", "sluice-rollout-worker"].includes(name);
      if (wantsGpu && !(Number(gpu) >= 1)) problem(cwhere, "GPU overlay: no nvidia.com/gpu limit");
      if (!isGpu && gpu !== undefined) problem(cwhere, "nvidia.com/gpu outside the GPU overlay");
      if (wantsGpu) {
        const tolerates = (spec.tolerations ?? []).some((t) => t.key === "nvidia.com/gpu");
        if (!tolerates || !spec.nodeSelector) {
          problem(cwhere, "GPU pods need a nodeSelector and a nvidia.com/gpu toleration");
        }
      }
      if (help.flags.has("memory-budget")) {
        const budget = effective(flags, binary, "memory-budget");
        const limit = parseQuantity(resources.limits?.memory);
        const percent = /^(\d+(?:\.\d+)?)%$/.exec(budget);
        if (percent) {
          if (!(Number(percent[1]) > 0 && Number(percent[1]) <= 90)) {
            problem(cwhere, `--memory-budget ${budget}: leave the process room under its limit ` +
                            "(at most 90%)");
          }
        } else if (!(parseQuantity(budget.replace(/iB$/, "i").replace(/B$/, "")) < limit)) {
          problem(cwhere, `--memory-budget ${budget} is not below the memory limit ${limit}`);
        }
      }

      // Security: non-root uid 10001 without privilege escalation,
      // capabilities, or a writable root; RuntimeDefault seccomp. The one
      // exception is the reward server's sandbox, exactly as documented.
      const sc = container.securityContext ?? {};
      const effectiveSc = (key) => sc[key] ?? podSecurity[key];
      if (effectiveSc("runAsNonRoot") !== true) problem(cwhere, "runAsNonRoot must be true");
      if (effectiveSc("runAsUser") !== UID) problem(cwhere, `runAsUser must be ${UID}`);
      if (effectiveSc("runAsGroup") !== UID) problem(cwhere, `runAsGroup must be ${UID}`);
      if (sc.allowPrivilegeEscalation !== false) {
        problem(cwhere, "allowPrivilegeEscalation must be false");
      }
      if (sc.privileged) problem(cwhere, "privileged");
      if (!(sc.capabilities?.drop ?? []).includes("ALL")) problem(cwhere, "capabilities must drop ALL");
      if ((sc.capabilities?.add ?? []).length) problem(cwhere, "capabilities added");
      if (sc.readOnlyRootFilesystem !== true) problem(cwhere, "readOnlyRootFilesystem must be true");
      const tmp = (container.volumeMounts ?? []).find((m) => m.mountPath === "/tmp");
      const tmpVolume = tmp && (spec.volumes ?? []).find((v) => v.name === tmp.name);
      if (!tmpVolume?.emptyDir) problem(cwhere, "/tmp must be an emptyDir (the root is read-only)");
      const seccomp = effectiveSc("seccompProfile")?.type;
      const exception = {
        hostUsers: spec.hostUsers === false,
        procMount: sc.procMount === "Unmasked",
        seccomp: seccomp === "Unconfined",
        appArmor: (sc.appArmorProfile ?? podSecurity.appArmorProfile)?.type === "Unconfined",
      };
      const anyException = Object.values(exception).some(Boolean);
      if (anyException) {
        if (!isRewardServer) {
          problem(cwhere, `sandbox exception outside the reward server: ${JSON.stringify(exception)}`);
        } else if (!Object.values(exception).every(Boolean)) {
          // procMount Unmasked is only valid with hostUsers: false; the rest
          // is needed together or not at all (docs/kubernetes.md).
          problem(cwhere, `the sandbox exception is all four or none: ${JSON.stringify(exception)}`);
        }
        if (enforcesRestricted) problem(cwhere, "sandbox exception in a namespace enforcing restricted");
      } else if (seccomp !== "RuntimeDefault" && seccomp !== "Localhost") {
        problem(cwhere, `seccompProfile must be RuntimeDefault, got ${seccomp}`);
      }
      if (sc.procMount && sc.procMount !== "Default" && spec.hostUsers !== false) {
        problem(cwhere, "procMount Unmasked needs hostUsers: false (the API server refuses it)");
      }
      if (isGpu && isRewardServer && !anyException) {
        problem(cwhere, "GPU overlay: the reward server's sandbox needs its exception");
      }
      if (isGpu && isRewardServer && !flags.has("require-sandbox")) {
        problem(cwhere, "GPU overlay: the reward server should --require-sandbox");
      }
      if (isCpuDemo && !enforcesRestricted) problem(dir, "cpu-demo's namespace must enforce restricted");

      // Durable state lives on a volume that outlives the pod.
      const stateFlag = { "sluice-controller": "runs-dir", "sluice-replay-buffer": "data-dir" }[name];
      if (stateFlag) {
        const dirValue = effective(flags, binary, stateFlag);
        const mount = (container.volumeMounts ?? []).find(
            (m) => dirValue === m.mountPath || String(dirValue).startsWith(m.mountPath + "/"));
        const volume = mount && (spec.volumes ?? []).find((v) => v.name === mount.name);
        if (!mount || !(volume?.persistentVolumeClaim || claimTemplates.has(mount.name))) {
          problem(cwhere, `--${stateFlag} ${dirValue} is not on a PersistentVolumeClaim`);
        }
      }
      if (name === "sluice-trainer") {
        const mount = (container.volumeMounts ?? []).find(
            (m) => m.mountPath === `${STATE_ROOT}/checkpoints`);
        if (!mount || !claimTemplates.has(mount.name)) {
          problem(cwhere, `${STATE_ROOT}/checkpoints must be the StatefulSet's claim`);
        }
      }
      // Workers: per-pod identity and a reachable relay address.
      if (name === "sluice-rollout-worker") {
        const fieldOf = (v) => env.get(v)?.valueFrom?.fieldRef?.fieldPath;
        if (flags.get("worker-id")?.value !== "$(POD_NAME)" || fieldOf("POD_NAME") !== "metadata.name") {
          problem(cwhere, "--worker-id must be $(POD_NAME) from metadata.name");
        }
        if (flags.get("advertise-address")?.value !== `$(POD_IP):${help.grpcPort}` ||
            fieldOf("POD_IP") !== "status.podIP") {
          problem(cwhere, `--advertise-address must be $(POD_IP):${help.grpcPort} from status.podIP`);
        }
      }
    }
    if ((workload.kind === "Deployment" || workload.kind === "StatefulSet") &&
        ["sluice-controller", "sluice-trainer", "sluice-replay-buffer"].includes(name) &&
        workload.spec.replicas !== 1) {
      problem(where, "singletons run one replica");
    }
  }

  // Addresses the services dial name a Service of this rendering and the
  // right port.
  const controller = containersByService.get("sluice-controller");
  const worker = containersByService.get("sluice-rollout-worker");
  const dialed = [];
  if (controller) {
    for (const [flag, target] of [["trainer-address", "sluice-trainer"],
                                  ["replay-buffer-address", "sluice-replay-buffer"],
                                  ["reward-server-address", "sluice-reward-server"],
                                  ["advertise-address", "sluice-controller"]]) {
      dialed.push([`controller --${flag}`, effective(controller.flags, "sluice-controller", flag),
                   target]);
    }
  }
  if (worker) {
    dialed.push(["rollout worker --controller-address",
                 effective(worker.flags, "sluice-rollout-worker", "controller-address"),
                 "sluice-controller"]);
  }
  for (const [what, address, target] of dialed) {
    const [host, port] = String(address).split(":");
    const service = services.find((s) => s.metadata.name === target);
    const servicePort = service?.spec.ports.find((p) => p.name === "grpc")?.port;
    if (host !== target || Number(port) !== servicePort ||
        servicePort !== HELP[SERVICES[target].binary].grpcPort) {
      problem(dir, `${what} is ${address}, expected ${target}:${servicePort}`);
    }
  }

  // Services select pods, and their target ports are named ports of those pods.
  for (const service of services) {
    const where = id(dir, service);
    const selected = workloads.filter((w) => matches(service.spec.selector, podLabels(w)));
    if (!service.spec.selector || selected.length === 0) {
      problem(where, "selects no pod template");
      continue;
    }
    for (const port of service.spec.ports ?? []) {
      const target = port.targetPort ?? port.port;
      const ok = selected.every((w) => podSpec(w).containers.some((c) => (c.ports ?? []).some(
          (p) => p.name === target || p.containerPort === target)));
      if (!ok) problem(where, `port ${port.name}: targetPort ${target} is no container port`);
    }
    if (SERVICES[service.metadata.name]) {
      const binary = SERVICES[service.metadata.name].binary;
      for (const [name, want] of [["grpc", HELP[binary].grpcPort], ["metrics", HELP[binary].metricsPort]]) {
        if (service.spec.ports.find((p) => p.name === name)?.port !== want) {
          problem(where, `port ${name} must be ${want}`);
        }
      }
    }
  }
  for (const workload of objects.filter((o) => o.kind === "StatefulSet")) {
    if (!services.some((s) => s.metadata.name === workload.spec.serviceName)) {
      problem(id(dir, workload), `serviceName ${workload.spec.serviceName} is no Service`);
    }
  }

  // NetworkPolicies: default deny, and every selector names real pods.
  const policies = byKind("NetworkPolicy");
  const denyAll = policies.some((p) => Object.keys(p.spec.podSelector ?? {}).length === 0 &&
                                       (p.spec.policyTypes ?? []).includes("Ingress") &&
                                       !(p.spec.ingress ?? []).length);
  if (!denyAll) problem(dir, "no default-deny ingress NetworkPolicy");
  const CLIENT_LABEL = "sluice.dev/client";
  for (const policy of policies) {
    const where = id(dir, policy);
    const selector = policy.spec.podSelector?.matchLabels ?? {};
    const targets = workloads.filter((w) => matches(selector, podLabels(w)));
    if (Object.keys(selector).length > 0 && targets.length === 0) problem(where, "selects no pod");
    for (const rule of policy.spec.ingress ?? []) {
      for (const peer of rule.from ?? []) {
        const labels = peer.podSelector?.matchLabels;
        if (peer.namespaceSelector || !labels) continue; // Another namespace: Prometheus.
        const isClient = Object.keys(labels).length === 1 && labels[CLIENT_LABEL] === "true";
        if (!isClient && !workloads.some((w) => matches(labels, podLabels(w)))) {
          problem(where, `from ${JSON.stringify(labels)}: no such pods`);
        }
      }
      for (const port of rule.ports ?? []) {
        const ok = targets.every((w) => podSpec(w).containers.some((c) => (c.ports ?? []).some(
            (p) => p.name === port.port || p.containerPort === port.port)));
        if (!ok) problem(where, `port ${port.port} is not a port of the selected pods`);
      }
    }
  }
  // Who may call whom: the callers each service needs (docs/run-lifecycle.md).
  const CALLERS = {
    "sluice-controller": ["sluice-rollout-worker", "sluice-trainer"],
    "sluice-trainer": ["sluice-controller", "sluice-rollout-worker"],
    "sluice-replay-buffer": ["sluice-controller", "sluice-rollout-worker", "sluice-trainer"],
    "sluice-reward-server": ["sluice-controller", "sluice-rollout-worker", "sluice-trainer"],
    "sluice-rollout-worker": ["sluice-rollout-worker"],
  };
  for (const [target, callers] of Object.entries(CALLERS)) {
    const targetWorkload = workloads.find((w) => w.metadata.name === target);
    if (!targetWorkload) continue;
    const allowedFrom = (caller) => {
      const callerLabels = podLabels(workloads.find((w) => w.metadata.name === caller) ?? {});
      return policies.some((p) =>
          matches(p.spec.podSelector?.matchLabels, podLabels(targetWorkload)) &&
          (p.spec.ingress ?? []).some((rule) =>
              (rule.ports ?? []).some((port) => port.port === "grpc") &&
              (rule.from ?? []).some((peer) => !peer.namespaceSelector &&
                  matches(peer.podSelector?.matchLabels, callerLabels))));
    };
    for (const caller of callers) {
      if (!allowedFrom(caller)) problem(dir, `NetworkPolicy: ${caller} may not call ${target}`);
    }
    for (const other of Object.keys(SERVICES).filter((s) => !callers.includes(s))) {
      if (allowedFrom(other)) problem(dir, `NetworkPolicy: ${other} may call ${target}, needlessly`);
    }
  }

  // PodDisruptionBudgets select pods and never block a drain for good.
  for (const pdb of byKind("PodDisruptionBudget")) {
    const where = id(dir, pdb);
    const selected = workloads.filter((w) => matches(pdb.spec.selector?.matchLabels, podLabels(w)));
    if (selected.length !== 1) {
      problem(where, "must select one workload's pods");
      continue;
    }
    const replicas = selected[0].spec.replicas ?? 1;
    if (pdb.spec.minAvailable !== undefined && !(Number(pdb.spec.minAvailable) < replicas)) {
      problem(where, `minAvailable ${pdb.spec.minAvailable} with ${replicas} replicas blocks drains`);
    }
    if (pdb.spec.maxUnavailable !== undefined && String(pdb.spec.maxUnavailable) === "0") {
      problem(where, "maxUnavailable 0 blocks drains");
    }
  }
  for (const name of ["sluice-reward-server", "sluice-rollout-worker"]) {
    const workload = workloads.find((w) => w.metadata.name === name);
    if (workload && !byKind("PodDisruptionBudget").some(
        (p) => matches(p.spec.selector?.matchLabels, podLabels(workload)))) {
      problem(dir, `no PodDisruptionBudget for ${name}`);
    }
  }

  // Prometheus Operator monitors: every job, named as everywhere else.
  const jobs = new Map();
  for (const monitor of byKind("ServiceMonitor")) {
    const where = id(dir, monitor);
    const selected = services.filter((s) => matches(monitor.spec.selector?.matchLabels, s.metadata.labels));
    if (selected.length !== 1) {
      problem(where, `must select one Service, selects ${selected.length}`);
      continue;
    }
    const service = selected[0];
    const job = monitor.spec.jobLabel ? service.metadata.labels?.[monitor.spec.jobLabel]
                                      : service.metadata.name;
    jobs.set(job, where);
    for (const endpoint of monitor.spec.endpoints ?? []) {
      if (!service.spec.ports.some((p) => p.name === endpoint.port)) {
        problem(where, `endpoint port ${endpoint.port} is no port of Service ${service.metadata.name}`);
      }
    }
  }
  for (const monitor of byKind("PodMonitor")) {
    const where = id(dir, monitor);
    const selected = workloads.filter((w) => matches(monitor.spec.selector?.matchLabels, podLabels(w)));
    if (selected.length !== 1) {
      problem(where, `must select one workload's pods, selects ${selected.length}`);
      continue;
    }
    if (!monitor.spec.jobLabel) {
      problem(where, "needs jobLabel (the default job would be <namespace>/<name>)");
      continue;
    }
    jobs.set(podLabels(selected[0])[monitor.spec.jobLabel], where);
    for (const endpoint of monitor.spec.podMetricsEndpoints ?? []) {
      if (!podSpec(selected[0]).containers.some((c) => (c.ports ?? []).some((p) => p.name === endpoint.port))) {
        problem(where, `endpoint port ${endpoint.port} is no container port`);
      }
    }
  }
  if (jobs.size > 0) {
    const want = Object.keys(SERVICES).sort().join(",");
    const got = [...jobs.keys()].sort().join(",");
    if (want !== got) problem(dir, `monitor jobs ${got}, expected exactly ${want}`);
    if (byKind("PodMonitor").length === 0 || !byKind("PodMonitor").some(
        (m) => matches(m.spec.selector?.matchLabels, { "app.kubernetes.io/name": "sluice-rollout-worker" }))) {
      problem(dir, "rollout workers are scraped per pod: a PodMonitor");
    }
  } else if (isGpu) {
    problem(dir, "the GPU overlay includes the Prometheus Operator monitors");
  }
  if (dir.includes("components/grafana") || workloads.some((w) => w.metadata.name === GRAFANA)) {
    checkGrafana(dir, objects, policies);
  }
  return containersByService;
}

// --- Grafana (components/grafana): the dashboards and provisioning of
// deploy/grafana, a datasource that matches docker-compose's and points at
// the namespace the NetworkPolicies let Prometheus in from, and the pod
// security every pod of the namespace has.
const GRAFANA = "sluice-grafana";
const GRAFANA_DIR = path.resolve(args.k8sDir, "..", "grafana");

function checkGrafana(dir, objects, policies) {
  const where = `${dir}: ${GRAFANA}`;
  const workloads = objects.filter((o) => WORKLOAD_KINDS.has(o.kind) && o.metadata.name === GRAFANA);
  if (workloads.length !== 1) {
    problem(where, `expected one workload ${GRAFANA}, found ${workloads.length}`);
    return;
  }
  const workload = workloads[0];
  const spec = podSpec(workload);
  const labels = podLabels(workload);
  if (labels["app.kubernetes.io/name"] !== GRAFANA) {
    problem(where, `pod label app.kubernetes.io/name must be ${GRAFANA}`);
  }
  if (spec.automountServiceAccountToken !== false) {
    problem(where, "automountServiceAccountToken must be false (Grafana calls no Kubernetes API)");
  }
  if ((workload.spec.replicas ?? 1) !== 1) problem(where, "one replica (its state is an emptyDir)");
  const container = spec.containers.find((c) => c.name === "grafana");
  if (!container) {
    problem(where, "no container named grafana");
    return;
  }
  if (!/^(.*\/)?grafana\/grafana:\d+\.\d+\.\d+$/.test(container.image ?? "")) {
    problem(where, `image ${container.image} must be grafana/grafana at a pinned version`);
  }
  const http = (container.ports ?? []).find((p) => p.name === "http");
  if (http?.containerPort !== 3000) problem(where, "containerPort http must be 3000");
  for (const probe of ["livenessProbe", "readinessProbe"]) {
    const p = container[probe];
    if (p?.httpGet?.path !== "/api/health" || ![3000, "http"].includes(p?.httpGet?.port)) {
      problem(where, `${probe} must GET /api/health on the http port`);
    }
  }
  const resources = container.resources ?? {};
  for (const kind of ["requests", "limits"]) {
    for (const r of ["cpu", "memory"]) {
      if (resources[kind]?.[r] === undefined) problem(where, `no resources.${kind}.${r}`);
    }
  }
  // The restricted Pod Security Standard, as for Sluice's own pods (its own
  // uid: the image's).
  const sc = container.securityContext ?? {};
  const podSc = spec.securityContext ?? {};
  if ((sc.runAsNonRoot ?? podSc.runAsNonRoot) !== true) problem(where, "runAsNonRoot must be true");
  if (sc.allowPrivilegeEscalation !== false) problem(where, "allowPrivilegeEscalation must be false");
  if (!(sc.capabilities?.drop ?? []).includes("ALL")) problem(where, "capabilities must drop ALL");
  if (sc.readOnlyRootFilesystem !== true) problem(where, "readOnlyRootFilesystem must be true");
  if ((sc.seccompProfile ?? podSc.seccompProfile)?.type !== "RuntimeDefault") {
    problem(where, "seccompProfile must be RuntimeDefault");
  }
  if (spec.hostNetwork || spec.hostPID || spec.hostIPC) problem(where, "host namespaces");

  // What is mounted where.
  const configMaps = new Map(objects.filter((o) => o.kind === "ConfigMap").map((o) => [o.metadata.name, o]));
  const mounted = (mountPath) => {
    const mount = (container.volumeMounts ?? []).find((m) => m.mountPath === mountPath);
    const volume = mount && (spec.volumes ?? []).find((v) => v.name === mount.name);
    return { mount, volume, configMap: volume?.configMap && configMaps.get(volume.configMap.name) };
  };
  for (const writable of ["/var/lib/grafana", "/tmp"]) {
    if (!mounted(writable).volume?.emptyDir) problem(where, `${writable} must be an emptyDir (the root is read-only)`);
  }
  const readYaml = (file) => YAML.parse(fs.readFileSync(file, "utf8"));

  // The datasource: compose's, but for the cluster's Prometheus.
  const datasourceMount = mounted("/etc/grafana/provisioning/datasources");
  const composeDatasources = readYaml(path.join(GRAFANA_DIR, "provisioning", "datasources", "prometheus.yml")).datasources;
  if (!datasourceMount.configMap) {
    problem(where, "no ConfigMap of the rendering at /etc/grafana/provisioning/datasources");
  } else {
    const files = Object.values(datasourceMount.configMap.data ?? {});
    const datasources = files.flatMap((text) => YAML.parse(text)?.datasources ?? []);
    for (const want of composeDatasources) {
      const got = datasources.find((d) => d.uid === want.uid);
      if (!got) {
        problem(where, `no datasource uid ${want.uid} (docker-compose's, which the dashboards use)`);
        continue;
      }
      for (const key of ["name", "type", "isDefault", "access"]) {
        if (got[key] !== want[key]) problem(where, `datasource ${want.uid}: ${key} ${got[key]}, docker-compose's ${want[key]}`);
      }
      const host = /^https?:\/\/([^:/]+)/.exec(got.url ?? "")?.[1] ?? "";
      const namespace = /^[^.]+\.([^.]+)\.svc(\.cluster\.local)?$/.exec(host)?.[1];
      const allowed = new Set(policies.flatMap((p) => (p.spec.ingress ?? []).flatMap((r) => (r.from ?? []).map(
          (peer) => peer.namespaceSelector?.matchLabels?.["kubernetes.io/metadata.name"]))).filter(Boolean));
      if (!namespace) {
        problem(where, `datasource url ${got.url} is not a Service in a namespace (<service>.<namespace>.svc)`);
      } else if (!allowed.has(namespace)) {
        problem(where, `datasource url ${got.url} is in namespace ${namespace}, but the NetworkPolicies ` +
                       `let Prometheus scrape from [${[...allowed]}]`);
      }
    }
  }

  // The dashboards: every file of deploy/grafana/dashboards, as it is, where
  // the provider looks.
  const providerMount = mounted("/etc/grafana/provisioning/dashboards");
  if (!providerMount.configMap) {
    problem(where, "no ConfigMap of the rendering at /etc/grafana/provisioning/dashboards");
    return;
  }
  const providers = Object.values(providerMount.configMap.data ?? {}).flatMap((t) => YAML.parse(t)?.providers ?? []);
  const dashboardFiles = fs.readdirSync(path.join(GRAFANA_DIR, "dashboards")).filter((f) => f.endsWith(".json"));
  for (const provider of providers) {
    const dashboards = mounted(provider.options?.path);
    if (!dashboards.configMap) {
      problem(where, `dashboard provider ${provider.name} reads ${provider.options?.path}, where no ConfigMap is mounted`);
      continue;
    }
    for (const file of dashboardFiles) {
      const text = dashboards.configMap.data?.[file];
      if (text === undefined) {
        problem(where, `dashboard ${file} is not in ConfigMap ${dashboards.configMap.metadata.name} ` +
                       "(deploy/grafana/kustomization.yaml lists each file)");
      } else if (text !== fs.readFileSync(path.join(GRAFANA_DIR, "dashboards", file), "utf8")) {
        problem(where, `dashboard ${file} differs from deploy/grafana/dashboards/${file}`);
      }
    }
  }
  if (providers.length === 0) problem(where, "no dashboard provider");
  const service = objects.find((o) => o.kind === "Service" && o.metadata.name === GRAFANA);
  if (!service?.spec.ports?.some((p) => p.name === "http" && p.port === 3000)) {
    problem(where, "no Service sluice-grafana with port http 3000");
  }
  if (!policies.some((p) => matches(p.spec.podSelector?.matchLabels, labels) &&
                            (p.spec.ingress ?? []).some((r) => (r.ports ?? []).some((port) => port.port === "http")))) {
    problem(where, "no NetworkPolicy lets anyone reach Grafana's http port (the namespace denies by default)");
  }
}

// --- docker-compose: ports and addresses agree.
function checkCompose(renderings) {
  // merge: compose files share settings through YAML merge keys (<<: *sluice).
  const compose = YAML.parse(fs.readFileSync(args.compose, "utf8"), { merge: true });
  const composeDir = path.dirname(args.compose);
  const compared = [];
  for (const [k8sName, service] of Object.entries(SERVICES)) {
    const entry = compose.services?.[service.compose];
    if (!entry) {
      problem(args.compose, `no service ${service.compose}`);
      continue;
    }
    // Flags from the compose command, and from a config file it mounts.
    let command = entry.command ?? [];
    if (typeof command === "string") command = command.split(/\s+/).filter(Boolean);
    // ${VAR:-default} as compose reads it with VAR unset.
    command = command.map((c) => String(c).replace(/\$\{[A-Za-z_]\w*(?::?-([^}]*))?\}/g,
                                                    (m, d) => d ?? ""));
    const list = command.filter((c) => c !== service.binary);
    const flags = new Map();
    for (let i = 0; i < list.length; i++) {
      const arg = String(list[i]);
      if (!arg.startsWith("--")) continue;
      const eq = arg.indexOf("=");
      const name = eq >= 0 ? arg.slice(2, eq) : arg.slice(2);
      let value = eq >= 0 ? arg.slice(eq + 1) : true;
      if (eq < 0 && i + 1 < list.length && !String(list[i + 1]).startsWith("--")) value = list[++i];
      flags.set(canonicalName(service.binary, name), { value });
    }
    if (flags.has("config")) {
      const inContainer = String(flags.get("config").value);
      for (const volume of [...(entry.volumes ?? []), ...(entry.configs ?? [])]) {
        const spec = typeof volume === "string" ? volume.split(":") : [volume.source, volume.target];
        if (spec[1] === inContainer || inContainer.startsWith(spec[1] + "/")) {
          const hostPath = path.resolve(composeDir, spec[0], path.relative(spec[1], inContainer));
          const configSource = compose.configs?.[spec[0]]?.file;
          const file = configSource ? path.resolve(composeDir, configSource) : hostPath;
          if (fs.existsSync(file)) {
            for (const [k, v] of Object.entries(YAML.parse(fs.readFileSync(file, "utf8")) ?? {})) {
              const name = canonicalName(service.binary, k.replace(/_/g, "-"));
              if (!flags.has(name)) flags.set(name, { value: v });
            }
          }
        }
      }
    }
    const binary = service.binary;
    for (const [flag] of flags) {
      if (flag !== "config" && !HELP[binary].flags.has(flag)) {
        problem(args.compose, `${service.compose}: --${flag} is not a flag of ${binary}`);
      }
    }
    const composeGrpc = portOf(effective(flags, binary, "listen-address"));
    const composeMetrics = Number(effective(flags, binary, "metrics-port"));
    for (const [dir, containers] of renderings) {
      const k8s = containers.get(k8sName);
      if (!k8s) continue;
      const k8sGrpc = portOf(effective(k8s.flags, binary, "listen-address"));
      const k8sMetrics = Number(effective(k8s.flags, binary, "metrics-port"));
      if (k8sGrpc !== composeGrpc || k8sMetrics !== composeMetrics) {
        problem(dir, `${k8sName} ports ${k8sGrpc}/${k8sMetrics}, docker-compose ${service.compose} ` +
                     `${composeGrpc}/${composeMetrics}`);
      }
      // The ports each dialed address names.
      for (const flag of ["trainer-address", "replay-buffer-address", "reward-server-address",
                          "controller-address", "advertise-address"]) {
        const a = effective(k8s.flags, binary, flag);
        const b = effective(flags, binary, flag);
        if (a && b && portOf(a) !== portOf(b) && !String(a).startsWith("$(")) {
          problem(dir, `${k8sName} --${flag} port ${portOf(a)}, docker-compose ${portOf(b)}`);
        }
      }
      // Flags set in compose but not in Kubernetes (or the other way): told,
      // not failed; the deployments differ in paths and hosts by design.
      // State directories are the image's contract (/var/lib/sluice/...):
      // the same in both, so a volume moved between them means the same.
      for (const flag of ["runs-dir", "data-dir"]) {
        const a = effective(k8s.flags, binary, flag);
        const b = effective(flags, binary, flag);
        if (HELP[binary].flags.has(flag) && a !== b) {
          problem(dir, `${k8sName} --${flag} ${a}, docker-compose ${b}`);
        }
      }
      const only = (x, y) => [...x.keys()].filter((f) => f !== "config" && !y.has(f));
      const differ = [...flags.keys()].filter(
          (f) => f !== "config" && k8s.flags.has(f) &&
                 String(k8s.flags.get(f).value) !== String(flags.get(f).value) &&
                 !["listen-address"].includes(f))
          .map((f) => `${f} ${flags.get(f).value} vs ${k8s.flags.get(f).value}`);
      compared.push(`${dir} ${k8sName}: ports ${k8sGrpc}/${k8sMetrics} = compose; ` +
                    `flags only in compose: [${only(flags, k8s.flags)}], ` +
                    `only in k8s: [${only(k8s.flags, flags)}], values (compose vs k8s): [${differ}]`);
    }
  }
  return compared;
}

// --- Starting each container's command on loopback.
async function startAll(renderings, workdir) {
  const seen = new Map();
  for (const [dir, containers] of renderings) {
    for (const [name, { container, config, binary }] of containers) {
      const key = JSON.stringify([binary, container.args, config?.text]);
      if (!seen.has(key)) seen.set(key, { dir, name, container, config, binary });
    }
  }
  const sluice = path.join(args.binDir, "sluice");
  const results = [];
  // One at a time: the machine's cores are shared.
  for (const [i, { dir, name, container, config, binary }] of [...seen.values()].entries()) {
    const where = `${dir}: ${name} started`;
    const root = fs.mkdtempSync(path.join(workdir, `${name}-`));
    const argv = [];
    const env = {
      POD_NAME: `${name}-test-${i}`,
      POD_IP: "127.0.0.1",
    };
    for (const arg of container.args ?? []) {
      let a = String(arg).replace(/\$\(([A-Za-z_]\w*)\)/g, (m, v) => env[v] ?? m);
      if (a.startsWith("--config=") || a === "--config") {
        // The rendered file, moved to loopback and to this test's directory:
        // every key is kept (an unknown one makes the binary exit 2).
        const parsed = YAML.parse(config.text) ?? {};
        parsed.listen_address = "127.0.0.1:0";
        parsed.metrics_port = 0;
        for (const [k, v] of Object.entries(parsed)) {
          if (typeof v === "string" && v.startsWith(STATE_ROOT)) parsed[k] = path.join(root, v);
          // Other services' names would be looked up in DNS: never leave
          // loopback in a test. Port 1 refuses at once.
          if (typeof v === "string" && /^sluice-[a-z-]+:\d+$/.test(v) && k !== "advertise_address") {
            parsed[k] = "127.0.0.1:1";
          }
        }
        const file = path.join(root, path.basename(config.file));
        fs.writeFileSync(file, YAML.stringify(parsed));
        a = `--config=${file}`;
      }
      argv.push(a);
    }
    argv.push("--ready-fd=3");
    const started = Date.now();
    const child = spawn(path.join(args.binDir, binary), argv, {
      stdio: ["ignore", "pipe", "pipe", "pipe"],
      env: { ...process.env, HOME: root, TMPDIR: root },
    });
    let output = "";
    child.stdout.on("data", (d) => (output += d));
    child.stderr.on("data", (d) => (output += d));
    let ready = "";
    child.stdio[3].on("data", (d) => (ready += d));
    let startTimer;
    const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
    const readyOrExit = await Promise.race([
      new Promise((resolve) => {
        const poll = setInterval(() => {
          if (ready.includes("}")) {
            clearInterval(poll);
            resolve("ready");
          }
        }, 20);
        exited.then(() => clearInterval(poll));
      }),
      exited.then(() => "exited"),
      new Promise((resolve) => (startTimer = setTimeout(() => resolve("timeout"), 60000))),
    ]);
    clearTimeout(startTimer);
    if (readyOrExit !== "ready") {
      child.kill("SIGKILL");
      const { code } = await exited;
      problem(where, `${binary} ${argv.join(" ")} did not start (${readyOrExit}, exit ${code}):\n` +
                     output.split("\n").slice(-8).join("\n"));
      continue;
    }
    const grpc = JSON.parse(ready.slice(0, ready.indexOf("}") + 1)).grpc;
    const health = spawnSync(sluice, ["health", "--target", grpc], { encoding: "utf8", timeout: 20000 });
    const readyMs = Date.now() - started;
    if (health.status !== 0) {
      problem(where, `sluice health --target ${grpc}: exit ${health.status} ${health.stdout}${health.stderr}`);
    }
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 30000);
    const { code, signal } = await exited;
    clearTimeout(timer);
    if (code !== 0) problem(where, `exit ${code ?? signal} on SIGTERM:\n${output.split("\n").slice(-5).join("\n")}`);
    results.push(`${dir} ${name}: ${binary} ${argv.join(" ")} -> SERVING in ${readyMs} ms, exit ${code}`);
  }
  return results;
}

// --- Main.
const started = Date.now();
const renderings = new Map();
for (const dir of kustomizations()) {
  let objects;
  try {
    objects = render(dir);
  } catch (e) {
    problem(dir, `kubectl kustomize failed: ${e.stderr ?? e.message}`);
    continue;
  }
  for (const object of objects) await validateSchema(id(dir, object), object);
  renderings.set(dir, checkRendering(dir, objects));
  // What the rendering asks of a cluster (requests x replicas).
  const total = { cpu: 0, memory: 0, gpu: 0 };
  for (const w of objects.filter((o) => WORKLOAD_KINDS.has(o.kind))) {
    for (const c of podSpec(w).containers) {
      const requests = c.resources?.requests ?? {};
      const n = w.spec.replicas ?? 1;
      total.cpu += n * (parseQuantity(requests.cpu) || 0);
      total.memory += n * (parseQuantity(requests.memory) || 0);
      total.gpu += n * (Number(requests["nvidia.com/gpu"]) || 0);
    }
  }
  console.log(`${dir}: ${objects.length} objects rendered and checked; requests ` +
              `${total.cpu.toFixed(1)} CPUs, ${(total.memory / 1024 ** 3).toFixed(1)} GiB, ` +
              `${total.gpu} GPUs`);
}
if (!renderings.has("overlays/cpu-demo") || !renderings.has("overlays/gpu")) {
  problem(args.k8sDir, "overlays cpu-demo and gpu must exist and render");
}
if (args.compose) {
  for (const line of checkCompose(renderings)) console.log(`compose: ${line}`);
} else {
  console.log("compose: no docker-compose.yml beside deploy/: not compared");
}
if (args.start) {
  const workdir = fs.mkdtempSync(path.join(os.tmpdir(), "sluice-k8s-start-"));
  try {
    for (const line of await startAll(renderings, workdir)) console.log(`start: ${line}`);
  } finally {
    fs.rmSync(workdir, { recursive: true, force: true });
  }
}
console.log(`${((Date.now() - started) / 1000).toFixed(1)} s`);
if (problems.length > 0) {
  console.error(`\n${problems.length} problem(s):`);
  for (const p of problems) console.error(`  ${p}`);
  process.exit(1);
}
console.log("all manifests valid");
