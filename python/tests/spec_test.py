"""The generated package imports cleanly beside grpcio, and specs read from YAML
or dicts as `sluice submit` reads them (controller/spec_yaml.cc).

Run by ctest with PYTHONPATH=<build>/python and SLUICE_SOURCE_DIR; needs no
running service.
"""

import os
import subprocess
import sys
import unittest

SOURCE_DIR = os.environ.get("SLUICE_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


class PackageTest(unittest.TestCase):
    def python(self, code):
        return subprocess.run([PYTHON, "-c", code], capture_output=True, text=True,
                              env=os.environ.copy(), timeout=60)

    def test_imports_beside_grpcio_in_either_order(self):
        for code in ("import grpc; import sluice.client",
                     "import sluice.client; import grpc",
                     "import sluice, sluice._health.health_pb2_grpc; import grpc"):
            check = code + """
import os, grpc, grpc.experimental
assert 'dist-packages' in grpc.__file__ or 'site-packages' in grpc.__file__, grpc.__file__
assert grpc.insecure_channel.__module__ == 'grpc', grpc.insecure_channel.__module__
assert not hasattr(grpc, 'health') or 'sluice' not in str(getattr(grpc, 'health'))
channel = grpc.insecure_channel('127.0.0.1:1'); channel.close()
import sluice
print(sluice.Client.__module__, sluice.SluiceError.__module__)
"""
            result = self.python(check)
            self.assertEqual(result.returncode, 0, code + "\n" + result.stderr)
            self.assertEqual(result.stdout.split(), ["sluice.client", "sluice.errors"])

    def test_no_top_level_grpc_package_is_generated(self):
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            if entry:
                self.assertFalse(os.path.exists(os.path.join(entry, "grpc")),
                                 "%s/grpc would shadow grpcio" % entry)
                self.assertTrue(os.path.isfile(os.path.join(entry, "sluice", "v1",
                                                            "controller_pb2_grpc.py")))

    def test_health_stub_keeps_the_wire_name(self):
        from sluice._health import health_pb2, health_pb2_grpc

        self.assertEqual(health_pb2.DESCRIPTOR.package, "grpc.health.v1")
        self.assertEqual(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                         "grpc.health.v1.Health")
        self.assertTrue(hasattr(health_pb2_grpc, "HealthStub"))

    def test_every_service_has_stubs(self):
        from sluice.v1 import (controller_pb2_grpc, replay_buffer_pb2_grpc,
                               reward_server_pb2_grpc, rollout_worker_pb2_grpc,
                               trainer_pb2_grpc)

        for module, stub in ((controller_pb2_grpc, "ControllerServiceStub"),
                             (replay_buffer_pb2_grpc, "ReplayBufferServiceStub"),
                             (reward_server_pb2_grpc, "RewardServiceStub"),
                             (rollout_worker_pb2_grpc, "RolloutWorkerServiceStub"),
                             (trainer_pb2_grpc, "TrainerServiceStub")):
            self.assertTrue(hasattr(module, stub), "%s.%s" % (module.__name__, stub))

    def test_report_needs_no_grpcio(self):
        result = self.python("import sys; sys.modules['grpc'] = None\n"
                             "import sluice.report; print('ok')")
        self.assertEqual(result.returncode, 0, result.stderr)


class SpecTest(unittest.TestCase):
    def setUp(self):
        from sluice import spec

        self.spec = spec

    def load(self, value):
        return self.spec.load_run_spec(value)

    def errors(self, value):
        with self.assertRaises(self.spec.SpecError) as caught:
            self.load(value)
        return caught.exception.errors

    def test_smoke_yaml_file(self):
        path = os.path.join(SOURCE_DIR, "configs", "smoke.yaml")
        spec = self.load(path)
        self.assertEqual(spec.name, "smoke")
        self.assertEqual(spec.model.builtin, "micro")
        self.assertEqual(spec.algorithm.objective, 1)  # OBJECTIVE_GRPO
        self.assertEqual(spec.algorithm.max_staleness, 1)
        self.assertTrue(spec.algorithm.HasField("max_staleness"))
        self.assertEqual(list(spec.task.arithmetic.operators), ["+"])
        self.assertEqual([v.name for v in spec.reward.verifiers], ["math"])
        self.assertAlmostEqual(spec.warm_start.learning_rate, 3.0e-3)
        # The same spec as a dict (yaml.safe_load's native types) and as text.
        import yaml

        with open(path) as handle:
            text = handle.read()
        self.assertEqual(self.load(yaml.safe_load(text)), spec)
        self.assertEqual(self.load(text), spec)

    def test_every_config_in_the_tree_reads(self):
        configs = os.path.join(SOURCE_DIR, "configs")
        names = sorted(n for n in os.listdir(configs) if n.endswith(".yaml"))
        self.assertIn("smoke.yaml", names)
        for name in names:
            with open(os.path.join(configs, name)) as handle:
                head = handle.read()
            if "model:" not in head:  # not a run spec (e.g. a service config)
                continue
            with self.subTest(name):
                self.load(os.path.join(configs, name))

    def test_enum_spellings(self):
        for spelling in ("grpo", "GRPO", "OBJECTIVE_GRPO", 1):
            self.assertEqual(self.load({"algorithm": {"objective": spelling}})
                             .algorithm.objective, 1, spelling)
        self.assertEqual(self.load("algorithm: {objective: decoupled-ppo}").algorithm.objective,
                         2)
        self.assertEqual(self.load({"buffer": {"sampler": "prioritized"}}).buffer.sampler, 4)

    def test_yaml_scalars_are_read_by_field_type(self):
        spec = self.load("name: yes\nseed: 007\nlabels: {on: off}\n"
                         "algorithm: {normalize_advantage_by_std: no, learning_rate: 1e-4}\n"
                         "rollout: {sampling: {temperature: .inf}}\n")
        self.assertEqual(spec.name, "yes")  # a string field keeps the text
        self.assertEqual(spec.seed, 7)
        self.assertEqual(dict(spec.labels), {"on": "off"})
        self.assertTrue(spec.algorithm.HasField("normalize_advantage_by_std"))
        self.assertFalse(spec.algorithm.normalize_advantage_by_std)
        self.assertAlmostEqual(spec.algorithm.learning_rate, 1e-4)
        self.assertEqual(spec.rollout.sampling.temperature, float("inf"))

    def test_null_selects_a_message_and_single_values_fill_lists(self):
        spec = self.load("task:\n  arithmetic:\n    operators: '*'\n")
        self.assertTrue(spec.task.HasField("arithmetic"))
        self.assertEqual(list(spec.task.arithmetic.operators), ["*"])
        self.assertTrue(self.load({"task": {"arithmetic": None}}).task.HasField("arithmetic"))

    def test_camel_case_names(self):
        self.assertEqual(self.load({"algorithm": {"groupSize": 6}}).algorithm.group_size, 6)

    def test_errors_name_field_and_line_all_at_once(self):
        errors = self.errors("name: x\nalgorithm:\n  objective: grpoo\n  group_size: four\n"
                             "model: {builtin: a, hf_model_dir: b}\nalgoritm: 1\nseed: -1\n")
        self.assertEqual(errors, [
            'spec:3: algorithm.objective: unknown value "grpoo"; expected one of grpo, '
            "decoupled_ppo, trajectory_balance (or the full name, e.g. OBJECTIVE_GRPO)",
            'spec:4: algorithm.group_size: expected an integer, got "four"',
            "spec:5: model: only one of builtin or hf_model_dir may be set",
            'spec:6: unknown field "algoritm" in the run spec; did you mean "algorithm"?',
            'spec:7: seed: expected a non-negative integer, got "-1"',
        ])

    def test_dict_errors(self):
        errors = self.errors({"algorithm": {"group_size": True, "learning_rate": "fast",
                                            "batch_size_groups": 2**40},
                              "zzz_not_a_field": 1, "labels": ["a"]})
        self.assertIn('spec: algorithm.group_size: expected an integer, got "True"', errors)
        self.assertIn('spec: algorithm.learning_rate: expected a number, got "fast"', errors)
        self.assertIn("spec: algorithm.batch_size_groups: value 1099511627776 is out of range "
                      "for a 32-bit integer", errors)
        self.assertIn("spec: labels: expected a mapping, got a list", errors)
        self.assertTrue(any(e.startswith('spec: unknown field "zzz_not_a_field" in the run '
                                         "spec; known fields: name, seed, model") for e in errors),
                        errors)

    def test_invalid_yaml_and_missing_file(self):
        self.assertEqual(self.errors("algorithm: [\n"),
                         ["spec:2:1: invalid YAML: expected the node content, but found "
                          "'<stream end>'"])
        self.assertEqual(self.errors("- a\n- b\n"),
                         ['spec:1: the run spec: expected a mapping of RunSpec fields, got a '
                          'list'])
        missing = os.path.join(SOURCE_DIR, "no-such-spec.yaml")
        self.assertEqual(self.errors(missing),
                         ["%s: cannot read: No such file or directory" % missing])
        with self.assertRaises(TypeError):
            self.load(42)

    def test_closest_name(self):
        self.assertEqual(self.spec.closest_name("grop_size", ["group_size", "seed"]),
                         "group_size")
        self.assertIsNone(self.spec.closest_name("completely_else", ["group_size", "seed"]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
