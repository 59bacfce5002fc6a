"""Every relative link in the repository's Markdown resolves: the file (or
folder) exists, and a `#fragment` into a Markdown file names one of its
headings, slugged as GitHub renders them. Prints each broken link with its
file and line; exit status 1 if there is one."""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), ".."))
SKIP_DIRS = {".git", "build", "node_modules", "__pycache__"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def markdown_files():
    for here, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        for name in files:
            if name.endswith(".md"):
                yield os.path.join(here, name)


def prose_lines(path):
    """(line number, text) outside fenced code blocks."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield number, line


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"`|\*|_(?=\W)|(?<=\W)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, found = {}, set()
        for _, line in prose_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def broken_links(path):
    for number, line in prose_lines(path):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            resolved = (os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                        if file_part else path)
            if not os.path.exists(resolved):
                yield number, target, "no such file"
            elif fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
                yield number, target, f"no heading #{fragment} in {os.path.relpath(resolved, ROOT)}"


def main():
    files = sorted(markdown_files())
    if not files:
        sys.exit(f"doc_links_test: no Markdown under {ROOT}")
    bad = [(os.path.relpath(p, ROOT), n, t, why)
           for p in files for n, t, why in broken_links(p)]
    for path, number, target, why in bad:
        print(f"{path}:{number}: ({target}): {why}")
    if bad:
        sys.exit(f"doc_links_test: {len(bad)} broken links in {len(files)} files")
    print(f"doc_links_test: PASS ({len(files)} files)")


if __name__ == "__main__":
    main()
