#!/usr/bin/env python3
"""Checks that the C++ sources are formatted as .clang-format says.

Every tracked .h/.cc file must be formatted, except those named in
scripts/format-legacy.txt: files written before .clang-format was checked in,
which are reformatted when next edited. The list only shrinks: a listed file
that is now formatted is a failure too ("remove it from the list"), so a
formatted file cannot fall back.

  scripts/check_format.py [--source-dir DIR] [--clang-format BIN] [--fix]

--fix formats every file the check would fail on (not the legacy ones) and
rewrites the list without the files that are now formatted. Exit 0 when
everything is in order, 1 with the files and the command to fix them.
"""
import argparse
import os
import shutil
import subprocess
import sys

LEGACY = "scripts/format-legacy.txt"
SKIP_PREFIXES = ("build/", "deploy/k8s/node_modules/", "third_party/")


def tracked_sources(source_dir):
    result = subprocess.run(["git", "ls-files", "-z", "--", "*.h", "*.cc"], cwd=source_dir,
                            capture_output=True)
    if result.returncode == 0:
        files = result.stdout.decode().split("\0")
    else:  # not a git checkout (a source tarball): every .h/.cc under the tree
        files = [os.path.relpath(os.path.join(d, f), source_dir)
                 for d, _, names in os.walk(source_dir) for f in names
                 if f.endswith((".h", ".cc"))]
    files = [f for f in files if f and not f.startswith(SKIP_PREFIXES)]
    # A file deleted in the work tree but not yet in the index is not checked.
    return sorted(f for f in files if os.path.isfile(os.path.join(source_dir, f)))


def unformatted(clang_format, source_dir, files):
    """The subset of `files` that clang-format would change."""
    bad = []
    # One process per batch: clang-format starts in milliseconds but a tree
    # has hundreds of files.
    for i in range(0, len(files), 64):
        batch = files[i:i + 64]
        result = subprocess.run([clang_format, "--dry-run", "--style=file"] + batch,
                                cwd=source_dir, capture_output=True, text=True)
        if result.returncode != 0 and "warning:" not in result.stderr:
            sys.exit(f"check_format: {clang_format} failed: {result.stderr.strip()}")
        for line in result.stderr.splitlines():
            # "path:line:col: warning: code should be clang-formatted [-Wclang-format-violations]"
            if "-Wclang-format-violations" in line:
                path = line.split(":", 1)[0]
                if path not in bad:
                    bad.append(path)
    return bad


def read_legacy(source_dir):
    path = os.path.join(source_dir, LEGACY)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [l.strip() for l in f if l.strip() and not l.startswith("#")]


def write_legacy(source_dir, names):
    path = os.path.join(source_dir, LEGACY)
    with open(path) as f:
        header = [l for l in f if l.startswith("#")]
    with open(path, "w") as f:
        f.writelines(header)
        f.writelines(n + "\n" for n in sorted(names))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source-dir", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--clang-format", default="clang-format")
    parser.add_argument("--fix", action="store_true")
    args = parser.parse_args()
    source_dir = os.path.abspath(args.source_dir)
    if shutil.which(args.clang_format) is None:
        print(f"check_format: {args.clang_format} not found: install Debian's clang-format "
              "(scripts/install-deps.sh does)", file=sys.stderr)
        return 1
    files = tracked_sources(source_dir)
    legacy = read_legacy(source_dir)
    legacy_set = set(legacy)
    bad = set(unformatted(args.clang_format, source_dir, files))
    new_bad = sorted(f for f in bad if f not in legacy_set)
    now_formatted = sorted(f for f in legacy if f in files and f not in bad)
    gone = sorted(f for f in legacy if f not in files)
    if args.fix:
        if new_bad:
            subprocess.run([args.clang_format, "-i", "--style=file"] + new_bad, cwd=source_dir,
                           check=True)
        write_legacy(source_dir, [f for f in legacy if f in files and f in bad])
        print(f"check_format: formatted {len(new_bad)} file(s); {LEGACY} lost "
              f"{len(now_formatted) + len(gone)} name(s)")
        return 0
    problems = 0
    for f in new_bad:
        print(f"{f}: not formatted as .clang-format says", file=sys.stderr)
        problems += 1
    for f in now_formatted:
        print(f"{f}: formatted now: remove it from {LEGACY}", file=sys.stderr)
        problems += 1
    for f in gone:
        print(f"{f}: no longer exists: remove it from {LEGACY}", file=sys.stderr)
        problems += 1
    print(f"check_format: {len(files)} files, {len(legacy_set)} legacy, {problems} problem(s)")
    if problems:
        print("fix with: scripts/check_format.py --fix  (or clang-format -i FILE)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
