"""The documentation pages a reader meets (README.md, then docs/*.md) and what
the docs tests read in them: links, headings with GitHub's anchors, and the
fenced shell blocks with the test mark on the line before each.

Python standard library only; imported by check_links.py and
run_shell_blocks.py.
"""
import os
import re
import urllib.parse

SHELL_LANGUAGES = {"sh", "bash", "shell", "console", "zsh"}

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_COMMENT = re.compile(r"<!--.*?-->")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); text may hold one level of [brackets].
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")

# The marks a shell block carries on the line before its opening fence.
MARK_RUN = re.compile(r"^<!--\s*test:\s*run(?:\s+if\s+(cuda-sim))?\s*-->$")
MARK_SKIP = re.compile(r"^<!--\s*test:\s*skip\s*\((.*\S.*)\)\s*-->$")
MARK_ANY = re.compile(r"^<!--\s*test:")


class Page:
    """One markdown file: its lines, with those inside fenced blocks known."""

    def __init__(self, root, relpath):
        self.root = root
        self.relpath = relpath
        with open(os.path.join(root, relpath), encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.fenced = self._fenced_lines()

    def _fenced_lines(self):
        fenced = set()
        opening = None
        for number, line in enumerate(self.lines, 1):
            match = FENCE.match(line)
            if opening is None:
                if match:
                    opening = match.group(2)
                    fenced.add(number)
            else:
                fenced.add(number)
                if match and match.group(2)[0] == opening[0] and len(match.group(2)) >= len(opening) \
                        and not line.strip().strip(opening[0]):
                    opening = None
        return fenced

    def prose_lines(self):
        """(line number, text) outside fenced blocks, without comments or inline code."""
        for number, line in enumerate(self.lines, 1):
            if number in self.fenced:
                continue
            line = HTML_COMMENT.sub("", line)
            yield number, INLINE_CODE.sub("", line)

    def links(self):
        """(line number, target) of every inline link, image and reference definition."""
        for number, line in self.prose_lines():
            for match in INLINE_LINK.finditer(line):
                yield number, match.group(1)
            definition = REFERENCE_DEFINITION.match(line)
            if definition:
                yield number, definition.group(1)

    def anchors(self):
        """The anchors GitHub makes for this page's headings (and explicit <a name>)."""
        anchors = set()
        seen = {}
        for number, line in enumerate(self.lines, 1):
            if number in self.fenced:
                continue
            for name in HTML_ANCHOR.findall(line):
                anchors.add(name)
            match = HEADING.match(line)
            if not match:
                continue
            slug = github_slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
        return anchors

    def shell_blocks(self):
        """Every fenced shell block: dict(line, indent, text, mark, mark_line, error)."""
        blocks = []
        number = 1
        while number <= len(self.lines):
            line = self.lines[number - 1]
            match = FENCE.match(line)
            if not match or number not in self.fenced:
                number += 1
                continue
            indent, fence, language = match.group(1), match.group(2), match.group(3).lower()
            body = []
            end = number + 1
            while end <= len(self.lines):
                closing = FENCE.match(self.lines[end - 1])
                if closing and closing.group(2)[0] == fence[0] and len(closing.group(2)) >= len(fence) \
                        and not self.lines[end - 1].strip().strip(fence[0]):
                    break
                text = self.lines[end - 1]
                body.append(text[len(indent):] if text.startswith(indent) else text.lstrip())
                end += 1
            if language in SHELL_LANGUAGES:
                blocks.append(self._marked_block(number, indent, "\n".join(body) + "\n"))
            number = end + 1
        return blocks

    def _marked_block(self, number, indent, text):
        block = {"line": number, "indent": indent, "text": text, "mark": None, "condition": None,
                 "reason": None, "error": None}
        before = number - 1
        while before >= 1 and not self.lines[before - 1].strip():
            before -= 1
        previous = self.lines[before - 1].strip() if before >= 1 else ""
        run = MARK_RUN.match(previous)
        skip = MARK_SKIP.match(previous)
        if run:
            block["mark"], block["condition"] = "run", run.group(1)
        elif skip:
            block["mark"], block["reason"] = "skip", skip.group(1).strip()
        elif MARK_ANY.match(previous):
            block["error"] = (f"the mark '{previous}' is not one of <!-- test: run -->, "
                              "<!-- test: run if cuda-sim --> or <!-- test: skip (the reason) -->")
        else:
            block["error"] = ("a shell block with no mark: put <!-- test: run --> or "
                              "<!-- test: skip (the reason) --> on the line before it")
        return block

    def stray_marks(self, blocks):
        """Line numbers of test marks that no shell block follows."""
        marked = set()
        for block in blocks:
            before = block["line"] - 1
            while before >= 1 and not self.lines[before - 1].strip():
                before -= 1
            marked.add(before)
        return [number for number, line in enumerate(self.lines, 1)
                if number not in self.fenced and MARK_ANY.match(line.strip()) and number not in marked]


def github_slug(heading):
    """GitHub's anchor for a heading: its rendered text, lower case, punctuation
    other than '-' and '_' dropped, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)                           # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def page_paths(root):
    """README.md and docs/*.md, relative to root."""
    paths = ["README.md"]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        paths += sorted(os.path.join("docs", name) for name in os.listdir(docs) if name.endswith(".md"))
    return [path for path in paths if os.path.isfile(os.path.join(root, path))]


def resolve(page, target):
    """(path relative to root, anchor or None) of a relative link, or None for a URL."""
    if not target or URL_SCHEME.match(target):
        return None
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path)
    anchor = urllib.parse.unquote(anchor) if anchor else None
    if not path:
        return page.relpath, anchor
    if path.startswith("/"):
        return os.path.normpath(path.lstrip("/")), anchor
    return os.path.normpath(os.path.join(os.path.dirname(page.relpath), path)), anchor


def reader_order(root):
    """The pages in the order a reader meets them: README.md first, then each
    page in the order of its first link from a page already met; pages that
    nothing links to come last, by name."""
    paths = page_paths(root)
    pages = {path: Page(root, path) for path in paths}
    order = ["README.md"] if "README.md" in pages else []
    index = 0
    while index < len(order):
        for _, target in pages[order[index]].links():
            resolved = resolve(pages[order[index]], target)
            if resolved and resolved[0] in pages and resolved[0] not in order:
                order.append(resolved[0])
        index += 1
    order += [path for path in paths if path not in order]
    return [pages[path] for path in order]
