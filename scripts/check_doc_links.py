#!/usr/bin/python3
"""Checks the repository's Markdown as a clone of it would show them.

  scripts/check_doc_links.py [--source-dir DIR] [--cli build/bin/sluice] [FILE.md ...]

For every Markdown file of the repository (README.md, docs/, deploy/,
benchmarks/, ...; not testdata/, which holds third-party files):

- every relative link resolves inside the repository: `[text](path)`,
  `[text](path#anchor)`, `[text](#anchor)`, `![image](path)`, reference
  definitions `[id]: path` and HTML `href`/`src`. The target must exist, lie
  under the repository root (a `../` that climbs out of it is dead in a
  clone) and not be ignored by git (a build output is not in a clone either).
  An `#anchor` into a Markdown file must be one of its headings, slugged as
  GitHub does (lower case, punctuation dropped, spaces to hyphens, `-1`,
  `-2` for repeats), or an explicit `<a id=...>`/`<a name=...>`; an anchor
  into another file must be a GitHub line anchor (`#L12`, `#L12-L20`).
  Links with a scheme (https:, mailto:) are not fetched.
- user documentation says nothing only a developer of Sluice can follow:
  no internal tracker numbers ("issue 17") and no paths outside the
  repository (`../shared/...`); a figure names the machine it was measured
  on, not "this 2-core machine".

With --cli, also: the README's row for the `sluice` binary names every verb
its `--help` lists, and every sub-verb (`runs list`, `token create`, ...).

Code blocks and inline code are not read for links (they show commands, not
links). Exits 1 listing every problem as FILE:LINE: ..., 0 when none.
"""

import argparse
import os
import re
import subprocess
import sys
import urllib.parse

# Markdown files that are not the project's documentation.
EXCLUDED_PREFIXES = ("testdata/", "build", "deploy/k8s/node_modules/", "third_party/")

# Phrases user documentation must not contain, with why.
FORBIDDEN = [
    (re.compile(r"\bissues?\s+#?\d+\b", re.I),
     "an internal tracker number: say what changed, not which issue did it"),
    (re.compile(r"(?<![\w.])\.\./shared/"),
     "a path outside the repository: a clone has no ../shared"),
    (re.compile(r"\bthis\s+\d+-core\b", re.I),
     "'this N-core machine': describe the machine (cores, memory) beside the figure"),
]

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:.|\n)*?(?<!`)\1(?!`)")
# [text](target "title") and ![alt](target): text may hold one level of [...].
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ATTR = re.compile(r"<[a-zA-Z][^>]*?\s(?:href|src)\s*=\s*[\"']([^\"']+)[\"']")
HTML_ANCHOR = re.compile(r"<a\s[^>]*?(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
ATX_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


def git(source_dir, *args, stdin=None):
    try:
        result = subprocess.run(["git", "-C", source_dir, *args], input=stdin,
                                capture_output=True, text=True)
    except FileNotFoundError:
        return None
    return result


def markdown_files(source_dir):
    """Tracked and untracked-but-not-ignored *.md files, or every *.md on disk
    outside a git checkout."""
    listed = git(source_dir, "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.md")
    if listed is not None and listed.returncode == 0:
        names = [n for n in listed.stdout.split("\0") if n]
    else:
        names = []
        for root, dirs, files in os.walk(source_dir):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                if name.endswith(".md"):
                    names.append(os.path.relpath(os.path.join(root, name), source_dir))
    names = [n for n in names if os.path.exists(os.path.join(source_dir, n))]
    return sorted(n for n in names if not n.startswith(EXCLUDED_PREFIXES))


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks, with
    inline code blanked out (kept the same length, so nothing shifts)."""
    blanked = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    fence = None
    for number, (line, raw) in enumerate(zip(blanked.split("\n"), text.split("\n")), start=1):
        match = FENCE.match(raw)
        if fence:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            continue
        if match:
            fence = match.group(1)
            continue
        yield number, line


def heading_text(markdown):
    """A heading as GitHub renders its text: links to their text, no code
    backticks, no emphasis stars, no HTML tags."""
    parts = re.split(r"(`+)(.*?)\1", markdown)
    text = []
    for index in range(0, len(parts), 3):
        prose = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", parts[index])
        text.append(re.sub(r"<[^>]+>", "", prose).replace("*", ""))
        if index + 2 < len(parts):
            text.append(parts[index + 2])  # code: its text as written
    return "".join(text)


def slug(text):
    """GitHub's anchor for a heading (github-slugger): lower case, every
    character that is not a letter, digit, space, hyphen or underscore
    dropped, each space a hyphen."""
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors_of(path, cache={}):
    if path in cache:
        return cache[path]
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    anchors = set()
    seen = {}
    lines = list(prose_lines(text))
    raw_lines = text.split("\n")
    for index, (number, line) in enumerate(lines):
        raw = raw_lines[number - 1]
        heading = None
        match = ATX_HEADING.match(raw)
        if match and not raw.startswith("    "):
            heading = match.group(2)
        elif (index + 1 < len(lines) and lines[index + 1][0] == number + 1 and raw.strip()
              and re.match(r"^\s{0,3}(=+|-+)\s*$", raw_lines[number]) and not raw.lstrip().startswith(("-", "*", "|"))):
            heading = raw  # setext
        if heading is not None:
            base = slug(heading_text(heading))
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
        anchors.update(HTML_ANCHOR.findall(line))
    cache[path] = anchors
    return anchors


def links_in(text):
    """(line number, target) of every link in the prose."""
    for number, line in prose_lines(text):
        for pattern in (INLINE_LINK, HTML_ATTR):
            for match in pattern.finditer(line):
                yield number, match.group(1)
        match = REFERENCE_DEF.match(line)
        if match:
            yield number, match.group(1)


class Checker:
    def __init__(self, source_dir):
        self.root = os.path.realpath(source_dir)
        self.problems = []
        self.links = 0
        self.ignored = {}

    def problem(self, where, message):
        self.problems.append(f"{where}: {message}")

    def is_ignored(self, relative):
        if relative not in self.ignored:
            result = git(self.root, "check-ignore", "-q", "--no-index", "--", relative)
            self.ignored[relative] = result is not None and result.returncode == 0
        return self.ignored[relative]

    def check_link(self, file, number, target):
        where = f"{file}:{number}"
        target = target.strip("<>")
        if SCHEME.match(target):
            return
        self.links += 1
        path_part, _, anchor = target.partition("#")
        path_part = urllib.parse.unquote(path_part)
        here = os.path.dirname(os.path.join(self.root, file))
        if not path_part:
            resolved = os.path.join(self.root, file)
        elif path_part.startswith("/"):
            resolved = os.path.join(self.root, path_part.lstrip("/"))
        else:
            resolved = os.path.join(here, path_part)
        resolved = os.path.normpath(resolved)
        inside = os.path.realpath(resolved)
        if inside != self.root and not inside.startswith(self.root + os.sep):
            self.problem(where, f"{target}: outside the repository (a clone does not have it)")
            return
        if not os.path.exists(resolved):
            self.problem(where, f"{target}: no such file in the repository")
            return
        relative = os.path.relpath(resolved, self.root)
        if relative != "." and self.is_ignored(relative):
            self.problem(where, f"{target}: ignored by git (a build output?), not in a clone")
            return
        if not anchor:
            return
        anchor = urllib.parse.unquote(anchor)
        if os.path.isdir(resolved):
            self.problem(where, f"{target}: an anchor into a directory")
        elif resolved.endswith(".md"):
            if anchor not in anchors_of(resolved):
                known = sorted(anchors_of(resolved))
                close = [a for a in known if anchor.split("-")[0] in a][:5]
                hint = f"; headings there include {', '.join('#' + a for a in close)}" if close else ""
                self.problem(where, f"{target}: no heading '#{anchor}' in "
                             f"{os.path.relpath(resolved, self.root)}{hint}")
        elif not LINE_ANCHOR.match(anchor):
            self.problem(where, f"{target}: '#{anchor}' is neither a Markdown heading nor a line (#L12)")

    def check_file(self, file):
        with open(os.path.join(self.root, file), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        for number, target in links_in(text):
            self.check_link(file, number, target)
        for number, line in enumerate(text.split("\n"), start=1):
            for pattern, why in FORBIDDEN:
                match = pattern.search(line)
                if match:
                    self.problem(f"{file}:{number}", f"'{match.group(0)}': {why}")


def cli_verbs(binary, *words):
    """The subcommands `binary words... --help` lists, with theirs: {verb: [sub-verbs]}."""
    result = subprocess.run([binary, *words, "--help"], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"{binary} {' '.join(words)} --help exited {result.returncode}")
    verbs = []
    listing = False
    for line in result.stdout.splitlines():
        if line.strip().lower().startswith("subcommands"):
            listing = True
        elif listing and re.match(r"^  \S", line):
            verbs.append(line.split()[0])
        elif listing and line.strip() and not line.startswith("  "):
            listing = False
    if words:
        return verbs
    return {verb: cli_verbs(binary, verb) for verb in verbs}


def check_cli_table(checker, binary):
    """The README's `sluice` row names every verb of the CLI."""
    with open(os.path.join(checker.root, "README.md"), encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    rows = [(n, line) for n, line in enumerate(lines, start=1) if line.startswith("| `sluice` |")]
    if len(rows) != 1:
        checker.problem("README.md", f"expected one table row for `sluice`, found {len(rows)}")
        return
    number, row = rows[0]
    verbs = cli_verbs(binary)
    for verb, subverbs in verbs.items():
        if not re.search(r"`" + re.escape(verb) + r"\b", row):
            checker.problem(f"README.md:{number}", f"the sluice row does not name the verb `{verb}` "
                            f"({os.path.basename(binary)} --help lists it)")
        for sub in subverbs:
            if not re.search(r"\b" + re.escape(sub) + r"\b", row):
                checker.problem(f"README.md:{number}", f"the sluice row does not name `{verb} {sub}`")
    return len(verbs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--cli", help="the sluice binary: check that README.md names each of its verbs")
    parser.add_argument("files", nargs="*", help="Markdown files relative to the source dir (default: all)")
    args = parser.parse_args()
    checker = Checker(args.source_dir)
    files = args.files or markdown_files(checker.root)
    if not files:
        print("check_doc_links: no Markdown files found under " + checker.root, file=sys.stderr)
        return 2
    for file in files:
        checker.check_file(file)
    verbs = check_cli_table(checker, args.cli) if args.cli else None
    for problem in checker.problems:
        print(problem)
    print(f"check_doc_links: {len(files)} files, {checker.links} relative links"
          + (f", {verbs} CLI verbs" if verbs else "") + f", {len(checker.problems)} problem(s)")
    return 1 if checker.problems else 0


if __name__ == "__main__":
    sys.exit(main())
