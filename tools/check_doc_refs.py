#!/usr/bin/env python3
"""Check that the tour documents name files and functions that exist.

docs/architecture.md and docs/request-flow.md send a reader to files and functions by name;
a rename that forgets them leaves a newcomer grepping for nothing. Every `path` in backticks
that looks like a source file must exist (from the repository root, or under daemon/src/,
client/, common/ or kernels/), and every `zd_`/`zc_`/`zs_`/`zk_`/`zr_` name in backticks must
be defined in the tree (a function, macro, type or enum constant).

  python3 tools/check_doc_refs.py [DOC...]
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["docs/architecture.md", "docs/request-flow.md"]
BASES = ["", "daemon/src/", "daemon/", "client/", "common/", "kernels/", "client/python/"]
SRC_EXT = (".c", ".h", ".py", ".cu", ".proto", ".cmake", ".in", ".sh", ".txt", ".cpp")


def sources():
    out = subprocess.check_output(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT)
    return [f for f in out.decode().split() if f.endswith(SRC_EXT)]


def defined_names(files):
    names = set()
    pat = re.compile(r"\b((?:zd|zc|zs|zk|zr)_\w+)\s*(?:\(|\[|;|=|,|\)|$| [A-Z0-9(])")
    for f in files:
        if not f.endswith((".c", ".h", ".cu")):
            continue
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            for line in fh:
                if line.startswith((" ", "\t", "/", "*")) and "#define" not in line and \
                        not re.match(r"\s+(?:\w+\s+)*\**(?:zd|zc|zs|zk|zr)_\w+\s*[;,=\[]", line) and \
                        not re.match(r"\s+[A-Z_0-9]+\s*[,=]", line):
                    continue
                for m in pat.finditer(line):
                    names.add(m.group(1))
                m = re.match(r"\s*#define\s+(\w+)", line)
                if m:
                    names.add(m.group(1))
                m = re.match(r"\s+((?:ZD|ZC|ZS|ZK|ZR)_[A-Z0-9_]+)\s*[,=]", line)
                if m:
                    names.add(m.group(1))
    return names


def main():
    docs = sys.argv[1:] or DOCS
    files = sources()
    names = defined_names(files)
    bad = []
    for doc in docs:
        text = open(os.path.join(ROOT, doc)).read()
        for n, line in enumerate(text.splitlines(), 1):
            for tok in re.findall(r"`([^`]+)`", line):
                for part in re.split(r"[\s,]+", tok):
                    part = part.strip("().;:")
                    if re.match(r"^[\w./-]+\.(c|h|py|cu|proto|cmake|sh|md|in)$", part) and \
                            "/" in part or re.match(r"^\w+\.(c|h|py)$", part):
                        if not any(os.path.exists(os.path.join(ROOT, b, part)) for b in BASES) \
                                and not any(f.endswith("/" + part) for f in files):
                            bad.append("%s:%d: no file %s" % (doc, n, part))
                    elif re.match(r"^(zd|zc|zs|zk|zr)_\w+$", part) and part not in names:
                        bad.append("%s:%d: no definition of %s" % (doc, n, part))
    for b in bad:
        print(b)
    print("doc refs: %d problems in %s" % (len(bad), ", ".join(docs)) if bad else
          "doc refs: clean (%s)" % ", ".join(docs))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
