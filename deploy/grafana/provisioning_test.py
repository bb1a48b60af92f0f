#!/usr/bin/python3
"""Grafana's provisioning against the dashboards and the compose files.

  provisioning_test.py --source-dir DIR

Checks, without pulling Grafana's image or starting anything:

1. The provisioning files: one default datasource of type prometheus (its
   uid and name are what the dashboards get), a file provider with a path.
2. Every dashboard: every datasource it names is the `${datasource}`
   variable (of type prometheus, so it picks the provisioned default),
   Grafana's own, or a provisioned uid; its uid is unique; and the
   Kubernetes component's datasource (deploy/k8s/components/grafana) is the
   same one (uid, name, type, default) at another URL, and
   deploy/grafana/kustomization.yaml lists every dashboard file.
3. `docker-compose --profile grafana config` of the bridge file
   (docker-compose.yml + docker-compose.override.yml) and of the host-network
   file (+ deploy/docker/compose.host-network.yml): the grafana service is in
   the `grafana` profile, mounts the provisioning directories and the
   dashboards where the provider reads them, and reaches the datasource's
   URL: on the bridge, the URL's host is a service on a network Grafana
   shares, listening on the URL's port; on the host network, the name maps
   to 127.0.0.1 (extra_hosts) and Prometheus listens there on that port. No
   other service depends on Grafana, so the stack runs without the profile.

Exits 1 listing every problem.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse

import yaml

problems = []


def problem(message):
    problems.append(message)
    print("FAIL: " + message, flush=True)


def note(message):
    print(message, flush=True)


def load_yaml(path):
    with open(path) as handle:
        return yaml.safe_load(handle)


def datasources_in(directory):
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "*.y*ml"))):
        for datasource in (load_yaml(path) or {}).get("datasources") or []:
            found.append((os.path.basename(path), datasource))
    return found


def dashboard_datasource_refs(node, found):
    """Every `datasource` value in a dashboard: dicts ({type, uid}) and strings."""
    if isinstance(node, dict):
        if "datasource" in node:
            found.append(node["datasource"])
        for value in node.values():
            dashboard_datasource_refs(value, found)
    elif isinstance(node, list):
        for value in node:
            dashboard_datasource_refs(value, found)
    return found


def check_provisioning(grafana):
    datasources = datasources_in(os.path.join(grafana, "provisioning", "datasources"))
    defaults = [d for _, d in datasources if d.get("isDefault")]
    if len(defaults) != 1:
        problem(f"provisioning/datasources: {len(defaults)} default datasources, expected one")
        return None, None
    default = defaults[0]
    if default.get("type") != "prometheus":
        problem(f"the default datasource {default.get('name')} is of type {default.get('type')}, not prometheus")
    for key in ("uid", "name", "url"):
        if not default.get(key):
            problem(f"the default datasource has no {key}")
    providers = []
    for path in sorted(glob.glob(os.path.join(grafana, "provisioning", "dashboards", "*.y*ml"))):
        providers += (load_yaml(path) or {}).get("providers") or []
    paths = [p.get("options", {}).get("path") for p in providers if p.get("type", "file") == "file"]
    if len(paths) != 1 or not paths[0]:
        problem(f"provisioning/dashboards: expected one file provider with a path, got {paths}")
        return default, None
    note(f"ok: datasource {default['name']} (uid {default['uid']}, {default['url']}); "
         f"provider reads {paths[0]}")
    return default, paths[0]


def check_dashboards(grafana, default, source_dir):
    provisioned_uids = {d.get("uid") for _, d in datasources_in(os.path.join(grafana, "provisioning", "datasources"))}
    provisioned_names = {d.get("name") for _, d in datasources_in(os.path.join(grafana, "provisioning", "datasources"))}
    files = sorted(glob.glob(os.path.join(grafana, "dashboards", "*.json")))
    if not files:
        problem("no dashboards in deploy/grafana/dashboards")
    uids = {}
    for path in files:
        name = os.path.basename(path)
        with open(path) as handle:
            dashboard = json.load(handle)
        uid = dashboard.get("uid")
        if uid in uids:
            problem(f"{name}: uid {uid} is also {uids[uid]}'s")
        uids[uid] = name
        variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
        for ref in dashboard_datasource_refs(dashboard, []):
            if isinstance(ref, dict):
                ref_uid = ref.get("uid")
                if ref_uid in ("${datasource}", "$datasource"):
                    variable = variables.get("datasource")
                    if not variable or variable.get("type") != "datasource":
                        problem(f"{name}: uses ${{datasource}} but has no datasource variable")
                    elif variable.get("query") != default.get("type"):
                        problem(f"{name}: its datasource variable lists {variable.get('query')} datasources; "
                                f"the provisioned default is {default.get('type')}")
                    current = (variable or {}).get("current") or {}
                    if current.get("value") and current["value"] not in provisioned_uids | provisioned_names:
                        problem(f"{name}: its datasource variable's current value {current['value']} is "
                                "not provisioned")
                elif ref_uid in ("-- Grafana --", "grafana") or ref.get("type") == "grafana":
                    continue
                elif ref_uid not in provisioned_uids:
                    problem(f"{name}: names datasource uid {ref_uid}, which is not provisioned "
                            f"({sorted(provisioned_uids)})")
            elif isinstance(ref, str) and ref not in provisioned_names | provisioned_uids | {"-- Grafana --"} \
                    and not ref.startswith("$"):
                problem(f"{name}: names datasource {ref!r}, which is not provisioned")
    note(f"ok: {len(files)} dashboards reference only ${{datasource}} (type {default.get('type')}) "
         "or provisioned datasources")

    # Kubernetes: the same datasource, every dashboard in the ConfigMap.
    k8s = os.path.join(source_dir, "deploy", "k8s", "components", "grafana", "datasources")
    if os.path.isdir(k8s):
        others = [d for _, d in datasources_in(k8s)]
        match = [d for d in others if d.get("uid") == default.get("uid")]
        if len(match) != 1:
            problem(f"deploy/k8s/components/grafana: no datasource with uid {default.get('uid')}")
        else:
            for key in ("name", "type", "isDefault", "access"):
                if match[0].get(key) != default.get(key):
                    problem(f"deploy/k8s/components/grafana: datasource {key} {match[0].get(key)!r}, "
                            f"compose's {default.get(key)!r}")
    kustomization = os.path.join(grafana, "kustomization.yaml")
    if os.path.exists(kustomization):
        listed = set()
        for generator in (load_yaml(kustomization) or {}).get("configMapGenerator") or []:
            listed.update(os.path.normpath(f.split("=")[-1]) for f in generator.get("files") or [])
        for path in files:
            relative = os.path.relpath(path, grafana)
            if relative not in listed:
                problem(f"deploy/grafana/kustomization.yaml does not list {relative}: Kubernetes would not "
                        "get that dashboard")


def compose_config(source_dir, files, environment):
    command = ["docker-compose", "--project-directory", source_dir, "-p", "sluice-provisioning-check"]
    for file in files:
        command += ["-f", os.path.join(source_dir, file)]
    command += ["--profile", "grafana", "config"]
    env = dict(os.environ, **environment)
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    if result.returncode != 0:
        problem(f"{' '.join(command)}: exit {result.returncode}\n{result.stderr.strip()}")
        return None
    return yaml.safe_load(result.stdout)


def volume_mounts(service, source_dir):
    """{target: source (absolute for bind mounts)} of a service in `config` output."""
    mounts = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            parts = volume.split(":")
            source, target = parts[0], parts[1]
        else:
            source, target = volume.get("source"), volume.get("target")
        if source and (source.startswith("/") or source.startswith(".")):
            source = os.path.realpath(os.path.join(source_dir, source))
        mounts[target] = source
    return mounts


def listen_port(service):
    """(host, port) Prometheus listens on, from --web.listen-address (default 0.0.0.0:9090)."""
    command = service.get("command") or []
    if isinstance(command, str):
        command = command.split()
    for arg in command:
        match = re.match(r"--web\.listen-address=(.*):(\d+)$", str(arg))
        if match:
            return match.group(1), int(match.group(2))
    return "0.0.0.0", 9090


def check_compose(source_dir, label, files, environment, default, provider_path):
    config = compose_config(source_dir, files, environment)
    if config is None:
        return
    services = config.get("services") or {}
    grafana = services.get("grafana")
    if not grafana:
        problem(f"{label}: no grafana service")
        return
    if grafana.get("profiles") != ["grafana"]:
        problem(f"{label}: grafana's profiles are {grafana.get('profiles')}, expected [grafana] "
                "(so that a plain `up` does not pull it)")
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        if name != "grafana" and "grafana" in depends:
            problem(f"{label}: {name} depends on grafana, which only the profile starts")
    grafana_dir = os.path.realpath(os.path.join(source_dir, "deploy", "grafana"))
    mounts = volume_mounts(grafana, source_dir)
    for target, want in (("/etc/grafana/provisioning/datasources", "provisioning/datasources"),
                         ("/etc/grafana/provisioning/dashboards", "provisioning/dashboards"),
                         (provider_path, "dashboards")):
        if mounts.get(target) != os.path.join(grafana_dir, want):
            problem(f"{label}: grafana mounts {mounts.get(target)} at {target}, expected deploy/grafana/{want}")

    url = urllib.parse.urlparse(default["url"])
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    target = services.get(host)
    if grafana.get("network_mode") == "host":
        extra = grafana.get("extra_hosts") or {}
        if isinstance(extra, list):
            extra = dict(entry.split(":", 1) for entry in extra)
        if extra.get(host) != "127.0.0.1":
            problem(f"{label}: on the host network grafana resolves {host} to {extra.get(host)}, "
                    "not 127.0.0.1 (extra_hosts)")
        if not target or target.get("network_mode") != "host":
            problem(f"{label}: the datasource host {host} is no service on the host network")
        else:
            bind, listen = listen_port(target)
            if listen != port or bind not in ("0.0.0.0", "127.0.0.1", ""):
                problem(f"{label}: {host} listens on {bind}:{listen}; the datasource dials 127.0.0.1:{port}")
    else:
        if not target:
            problem(f"{label}: the datasource host {host} is no compose service")
        else:
            networks = lambda s: set(s.get("networks") or {"default": None})  # noqa: E731
            if target.get("network_mode") or not networks(grafana) & networks(target):
                problem(f"{label}: grafana and {host} share no network")
            bind, listen = listen_port(target)
            if listen != port or bind not in ("0.0.0.0", ""):
                problem(f"{label}: {host} listens on {bind}:{listen}; the datasource dials {host}:{port}")
    note(f"ok: {label}: grafana (profile grafana) mounts the provisioning and dashboards, "
         f"{default['url']} reaches the {host} service")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source-dir", required=True)
    args = parser.parse_args()
    source_dir = os.path.realpath(args.source_dir)
    grafana = os.path.join(source_dir, "deploy", "grafana")
    default, provider_path = check_provisioning(grafana)
    if default:
        check_dashboards(grafana, default, source_dir)
    if shutil.which("docker-compose") is None:
        problem("docker-compose is not installed (scripts/install-deps.sh installs it)")
    elif default and provider_path:
        check_compose(source_dir, "docker-compose.yml (bridge)",
                      ["docker-compose.yml", "docker-compose.override.yml"], {}, default, provider_path)
        check_compose(source_dir, "compose.host-network.yml",
                      ["docker-compose.yml", "deploy/docker/compose.host-network.yml"],
                      {"SLUICE_BIND": "127.0.0.1"}, default, provider_path)
    if problems:
        print(f"\n{len(problems)} problem(s)")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
