#!/usr/bin/env python3
"""Every relative link and image in README.md and docs/*.md names a file or
folder that exists, and every '#anchor' a heading that exists (GitHub's
anchor rules). Prints each broken link as FILE:LINE: LINK: why, and exits 1
when there is one.

  check_links.py SOURCE_ROOT
"""
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import markdown_pages  # noqa: E402  (defines: Page, page_paths, resolve)

# Files a page already shows that another change of the same issue adds.
# An entry is accepted while its file is missing; remove it once the file is
# committed (the test says so when it finds the file).
PENDING = {}


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root = sys.argv[1]
    paths = markdown_pages.page_paths(root)
    pages = {path: markdown_pages.Page(root, path) for path in paths}
    anchors = {}
    broken = []
    checked = 0
    for path in paths:
        page = pages[path]
        for line, target in page.links():
            resolved = markdown_pages.resolve(page, target)
            if resolved is None:
                continue
            checked += 1
            linked, anchor = resolved
            where = f"{path}:{line}: ({target})"
            if linked.startswith(".."):
                broken.append(f"{where}: points outside the repository")
                continue
            full = os.path.join(root, linked)
            if not os.path.exists(full):
                if linked in PENDING:
                    continue
                broken.append(f"{where}: {linked} does not exist")
                continue
            if anchor is None:
                continue
            if not linked.endswith(".md") or os.path.isdir(full):
                broken.append(f"{where}: an anchor into {linked}, which is not a markdown page")
                continue
            if linked not in anchors:
                target_page = pages.get(linked) or markdown_pages.Page(root, linked)
                anchors[linked] = target_page.anchors()
            if anchor not in anchors[linked]:
                broken.append(f"{where}: {linked} has no heading with the anchor #{anchor}")
    for pending, what in PENDING.items():
        if os.path.exists(os.path.join(root, pending)):
            print(f"note: {pending} ({what}) exists now: remove it from PENDING in {__file__}")
    for line in broken:
        print(line)
    print(f"docs links: {checked} relative links in {len(paths)} pages, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
