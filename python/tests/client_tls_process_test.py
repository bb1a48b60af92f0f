"""The Python client against `sluice up --tls`: it finds the stack's CA and
operator token through endpoints.json as the CLI does, submits and watches a
short run over TLS; the read-only token may read but not cancel, no token and
plaintext are refused with codes that say which, and an explicit token or CA
overrides what endpoints.json says.

Needs SLUICE_BIN_DIR and PYTHONPATH=<build>/python; ctest sets both.
"""

import os
import sys
import unittest

import grpc
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stack  # noqa: E402

import sluice  # noqa: E402

SHORT = {
    "name": "py-tls",
    "seed": 3,
    "model": {"builtin": "micro"},
    "task": {"arithmetic": {"max_operand": 9, "operators": ["+"], "num_prompts": 40},
             "eval_split_size": 10},
    "warm_start": {"sft_steps": 5, "learning_rate": 3.0e-3, "batch_size": 16},
    "algorithm": {"objective": "grpo", "group_size": 4, "batch_size_groups": 2,
                  "max_staleness": 1, "learning_rate": 1.0e-3, "total_steps": 3},
    "rollout": {"sampling": {"max_new_tokens": 3}},
}


class ClientTlsProcessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = stack.LocalStack(extra_flags=["--tls"])
        try:
            cls.stack.start()
        except Exception:
            cls.stack.stop()
            raise
        cls.tls = os.path.join(cls.stack.state_dir, "tls")

    @classmethod
    def tearDownClass(cls):
        left = cls.stack.stop()
        if left:
            raise AssertionError("services still running after the stack stopped: %s" % left)

    def test_operator_runs_viewer_reads_and_strangers_are_refused(self):
        with sluice.Client(endpoints=self.stack.state_dir, timeout=20) as client:
            self.assertEqual(client.security.tls_ca, os.path.join(self.tls, "ca.pem"))
            self.assertEqual(client.security.token_file,
                             os.path.join(self.tls, "operator.token"))
            run = client.submit(yaml.safe_dump(SHORT))
            final = client.wait(run.run_id)
            self.assertEqual(sluice.state_name(final.state), "SUCCEEDED")
            self.assertTrue(any(r.run_id == run.run_id for r in client.list()))
            target = client.target

        viewer = os.path.join(self.tls, "viewer.token")
        with sluice.Client(target, timeout=20, tls_ca=os.path.join(self.tls, "ca.pem"),
                           token_file=viewer) as client:
            self.assertEqual(client.get(run.run_id).run_id, run.run_id)
            with self.assertRaises(sluice.SluiceError) as denied:
                client.cancel(run.run_id)
            self.assertEqual(denied.exception.code, grpc.StatusCode.PERMISSION_DENIED)
            self.assertIn("needs role operator", str(denied.exception))

        with sluice.Client(target, timeout=5, tls_ca=os.path.join(self.tls, "ca.pem"),
                           token="slc_not-a-token") as client:
            with self.assertRaises(sluice.SluiceError) as unknown:
                client.list()
            self.assertEqual(unknown.exception.code, grpc.StatusCode.UNAUTHENTICATED)

        # Plaintext: an explicit token without a CA dials without TLS.
        with sluice.Client(target, timeout=5,
                           token_file=os.path.join(self.tls, "operator.token")) as client:
            with self.assertRaises(sluice.SluiceError) as plaintext:
                client.list()
            self.assertEqual(plaintext.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertIn("plaintext", str(plaintext.exception))

    def test_security_settings_are_checked(self):
        with self.assertRaises(sluice.SluiceError):
            sluice.Security(tls_cert="a.pem")
        with self.assertRaises(sluice.SluiceError):
            sluice.Security(token="a", token_file="b")
        with self.assertRaises(sluice.SluiceError) as missing:
            sluice.Security(token_file="/nonexistent/token").metadata()
        self.assertIn("token_file", str(missing.exception))


if __name__ == "__main__":
    unittest.main()
