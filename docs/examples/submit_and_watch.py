#!/usr/bin/env python3
"""Submit a run spec to a Sluice controller and follow it to its end.

    PYTHONPATH=build/python python3 docs/examples/submit_and_watch.py configs/smoke.yaml
    PYTHONPATH=build/python python3 docs/examples/submit_and_watch.py configs/smoke.yaml \\
        --target 127.0.0.1:50051 --name my-smoke

Prints the run id, one progress line per update and the outcome; exits 0 if
the run SUCCEEDED, 1 if it failed or was cancelled, 2 if the spec was refused
or the controller could not be reached. Ctrl-C cancels the run.
"""

import argparse
import sys

import sluice


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="run spec YAML file (configs/*.yaml)")
    parser.add_argument("--target", help="controller HOST:PORT (default: the local stack's)")
    parser.add_argument("--state-dir", help="`sluice up --state-dir` to find the controller in")
    parser.add_argument("--name", help="override the spec's name")
    args = parser.parse_args()

    try:
        spec = sluice.load_run_spec(args.spec)  # a RunSpec message
    except sluice.SpecError as error:
        print(error, file=sys.stderr)
        return 2
    if args.name:
        spec.name = args.name

    with sluice.Client(args.target, endpoints=args.state_dir) as client:
        try:
            run = client.submit(spec)
        except sluice.SluiceError as error:
            print("refused: %s" % error, file=sys.stderr)
            return 2
        print("submitted %s to %s" % (run.run_id, client.target), flush=True)
        try:
            for run in client.watch(run.run_id, interval=1.0):
                print(sluice.format_progress(run), flush=True)
        except KeyboardInterrupt:
            run = client.cancel(run.run_id, "interrupted by the user")
            print("cancelled %s" % run.run_id)
            return 1
        except sluice.SluiceError as error:
            print("lost the run: %s" % error, file=sys.stderr)
            return 2

    summary = run.summary
    print("run %s %s after %.1f s" % (run.run_id, sluice.state_name(run.state),
                                      summary.wall_seconds))
    if run.error_message:
        print("error: %s" % run.error_message)
    print("eval accuracy (held-out, greedy): %.3f -> %.3f" % (summary.eval_before,
                                                               summary.eval_after))
    print("steps %d, final reward %.3f, max staleness %d (eta %d)" % (
        summary.steps, summary.final_reward_mean, summary.max_staleness, summary.eta))
    return 0 if sluice.state_name(run.state) == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
