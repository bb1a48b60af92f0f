#!/usr/bin/env python3
"""Generates the `sluice` package's protobuf messages and gRPC stubs.

    generate_stubs.py --proto-root proto --out DIR [--protoc PROTOC --grpc-python-plugin PLUGIN]

Writes, under DIR:
  sluice/v1/<name>_pb2.py, <name>_pb2_grpc.py   from proto/sluice/v1/*.proto
  sluice/_health/health_pb2.py, health_pb2_grpc.py  from proto/grpc/health/v1/health.proto

The one generator of the package's generated code: the CMake build runs it
into <build>/python, and setup.py (pip install ./python, and the wheel the
build makes) into the wheel. Generated files are never committed: they must
match the protos and the protobuf runtime they run on.

grpc/health/v1/health.proto is generated into sluice/_health/, not into a
top-level grpc/ package, which would shadow grpcio's own `grpc` module for
anyone who has the package on sys.path; its stub module's import of its
messages is rewritten to match. The proto's package stays grpc.health.v1, so
the service's name on the wire is unchanged.

The compiler: --protoc and --grpc-python-plugin (or $SLUICE_PROTOC and
$SLUICE_GRPC_PYTHON_PLUGIN) when given; else grpcio-tools' bundled protoc
(`grpc_tools.protoc`, what pip installs to build the wheel); else `protoc`
and `grpc_python_plugin` on PATH (Debian: protobuf-compiler-grpc).
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

HEALTH_IMPORT = "from grpc.health.v1 import health_pb2"
HEALTH_IMPORT_RELOCATED = "from sluice._health import health_pb2"


class GenerateError(Exception):
    pass


def _compiler(protoc, plugin):
    """A function(args) that runs protoc with the gRPC Python plugin."""
    protoc = protoc or os.environ.get("SLUICE_PROTOC")
    plugin = plugin or os.environ.get("SLUICE_GRPC_PYTHON_PLUGIN")
    if not protoc:
        try:
            from grpc_tools import protoc as grpc_tools_protoc
        except ImportError:
            grpc_tools_protoc = None
        if grpc_tools_protoc is not None:
            import importlib.resources

            includes = str(importlib.resources.files("grpc_tools") / "_proto")

            def run_grpc_tools(args):
                code = grpc_tools_protoc.main(["protoc", "-I" + includes] + args)
                if code != 0:
                    raise GenerateError("grpc_tools.protoc %s failed (%d)" % (" ".join(args), code))

            return run_grpc_tools
        protoc = shutil.which("protoc")
        plugin = plugin or shutil.which("grpc_python_plugin")
    if not protoc or not plugin:
        raise GenerateError(
            "no protobuf compiler with the gRPC Python plugin: install grpcio-tools "
            "(pip install grpcio-tools), or Debian's protobuf-compiler-grpc (protoc and "
            "grpc_python_plugin), or pass --protoc and --grpc-python-plugin")

    def run_protoc(args):
        command = [protoc, "--plugin=protoc-gen-grpc_python=" + plugin] + args
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise GenerateError("%s failed:\n%s" % (" ".join(command), result.stderr.strip()))

    return run_protoc


def generate(proto_root, out, protoc=None, plugin=None):
    """Writes the generated modules under `out`; returns their paths."""
    proto_root = os.path.abspath(proto_root)
    out = os.path.abspath(out)
    protos = sorted(os.path.relpath(p, proto_root)
                    for p in glob.glob(os.path.join(proto_root, "sluice", "v1", "*.proto")))
    health = os.path.join("grpc", "health", "v1", "health.proto")
    if not protos or not os.path.isfile(os.path.join(proto_root, health)):
        raise GenerateError("%s holds no sluice/v1/*.proto and %s: not the repository's proto/"
                            % (proto_root, health))
    compile_protos = _compiler(protoc, plugin)
    written = []

    package = os.path.join(out, "sluice", "v1")
    os.makedirs(package, exist_ok=True)
    compile_protos(["-I" + proto_root, "--python_out=" + out, "--grpc_python_out=" + out] + protos)
    init = os.path.join(package, "__init__.py")
    if not os.path.exists(init):
        with open(init, "w") as handle:
            handle.write('"""Messages and stubs generated from proto/sluice/v1."""\n')
    written.append(init)
    for proto in protos:
        stem = os.path.splitext(os.path.basename(proto))[0]
        for suffix in ("_pb2.py", "_pb2_grpc.py"):
            path = os.path.join(package, stem + suffix)
            if not os.path.isfile(path):
                raise GenerateError("protoc did not write " + path)
            written.append(path)

    with tempfile.TemporaryDirectory(prefix="sluice-health-") as scratch:
        compile_protos(["-I" + proto_root, "--python_out=" + scratch, "--grpc_python_out=" + scratch,
                        health])
        generated = os.path.join(scratch, "grpc", "health", "v1")
        relocated = os.path.join(out, "sluice", "_health")
        os.makedirs(relocated, exist_ok=True)
        with open(os.path.join(generated, "health_pb2_grpc.py")) as handle:
            stubs = handle.read()
        if HEALTH_IMPORT not in stubs:
            raise GenerateError("health_pb2_grpc.py no longer imports `%s`; update %s"
                                % (HEALTH_IMPORT, os.path.basename(__file__)))
        _write_if_changed(os.path.join(relocated, "health_pb2_grpc.py"),
                          stubs.replace(HEALTH_IMPORT, HEALTH_IMPORT_RELOCATED))
        with open(os.path.join(generated, "health_pb2.py")) as handle:
            _write_if_changed(os.path.join(relocated, "health_pb2.py"), handle.read())
        _write_if_changed(os.path.join(relocated, "__init__.py"),
                          '"""grpc.health.v1 messages and stubs, kept inside sluice so that '
                          "grpcio's grpc\nmodule is never shadowed.\"\"\"\n")
        written += [os.path.join(relocated, n)
                    for n in ("__init__.py", "health_pb2.py", "health_pb2_grpc.py")]
    return written


def _write_if_changed(path, text):
    try:
        with open(path) as handle:
            if handle.read() == text:
                return
    except OSError:
        pass
    with open(path, "w") as handle:
        handle.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proto-root", required=True, help="the repository's proto/ directory")
    parser.add_argument("--out", required=True, help="directory to write sluice/v1 and sluice/_health under")
    parser.add_argument("--protoc")
    parser.add_argument("--grpc-python-plugin")
    parser.add_argument("--stamp", help="touch this file when done (for build systems)")
    args = parser.parse_args()
    try:
        generate(args.proto_root, args.out, args.protoc, args.grpc_python_plugin)
    except GenerateError as error:
        print("generate_stubs: %s" % error, file=sys.stderr)
        return 1
    if args.stamp:
        with open(args.stamp, "w"):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
