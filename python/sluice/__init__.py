"""Python client for Sluice, asynchronous RL post-training of LLMs.

    import sluice
    with sluice.Client("127.0.0.1:50051") as client:
        run = client.submit("configs/smoke.yaml")
        for run in client.watch(run.run_id):
            print(sluice.format_progress(run))

Submodules:
  sluice.client   Client (submit, get, watch, cancel, list, health), SluiceError
  sluice.spec     YAML/dict -> RunSpec, as `sluice submit` reads specs (SpecError)
  sluice.report   plots of a run's files (`python3 -m sluice.report RUN_DIR`)
  sluice.v1       generated messages and stubs (sluice.v1.controller_pb2, ...)

The client's names are imported lazily, so `python3 -m sluice.report` needs
matplotlib but not grpcio.
"""

__version__ = "0.9.0"

_LAZY = {
    "Client": "sluice.client",
    "Security": "sluice.client",
    "SluiceError": "sluice.errors",
    "TERMINAL_STATES": "sluice.client",
    "controller_target": "sluice.client",
    "format_progress": "sluice.client",
    "resolve_security": "sluice.client",
    "state_name": "sluice.client",
    "SpecError": "sluice.errors",
    "load_run_spec": "sluice.spec",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError("module 'sluice' has no attribute %r" % name)
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
