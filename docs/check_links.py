#!/usr/bin/env python3
"""Checks the documentation: README.md and every page of the book (docs/src).

1. Every relative Markdown link or image resolves to an existing file, and a
   `#fragment` into a Markdown page names one of its headings (as mdBook and
   GitHub make ids: lower case, punctuation dropped, spaces as dashes; the
   headings of included text count). Links to public sites (http, https,
   mailto) are not fetched.
2. Every `{{#include FILE[:ANCHOR]}}` names an existing file (and anchor).
   The text it pulls in is checked as part of the including page: each of its
   relative links must resolve both from the included file (as a reader of
   the repository sees it) and from the page (as the built book serves it).
3. No page but the benchmarks pages and the changelog names a commit hash
   (7 or 40 hex digits), a date, a session, a stop or an issue number: those
   are history, which lives in CHANGELOG.md and on the benchmarks pages.
4. The benchmarks page's generated section (between `<!-- compare:begin -->`
   and `<!-- compare:end -->`) is exactly what `deploy/bench/compare
   --write-docs` wrote (deploy/bench/docs_section.py: its header line holds a
   checksum of the section), so a hand edit there fails.

Exits 1 and prints one line per problem. Run from anywhere:
`python3 docs/check_links.py`.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "docs" / "src"

# The generated section's format has one home, beside the script that writes it.
sys.dont_write_bytecode = True
sys.path.insert(0, str(ROOT / "deploy" / "bench"))
import docs_section  # noqa: E402

# Pages (relative to the repository) allowed to hold history.
HISTORY_ALLOWED = ("docs/src/benchmarks/", "docs/src/changelog.md", "CHANGELOG.md")

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")
FENCE = re.compile(r"^\s*(```|~~~)")
HISTORY = [
    (re.compile(r"\b[0-9a-f]{40}\b"), "a 40-hex commit hash"),
    # Seven hex digits with at least one digit and one letter: a short hash
    # (a plain number such as 1000000 or a word such as "defaced" is not).
    (re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7}\b"), "a short commit hash"),
    (re.compile(r"\b20\d\d-\d\d-\d\d\b"), "a date"),
    (re.compile(r"\bstop \d+\b", re.I), "a stop number"),
    (re.compile(r"(?<!copy )\bsessions?\b(?! of)", re.I), "a session"),
    (re.compile(r"\bissues? \d+\b", re.I), "an issue number"),
]


def strip_code(text, inline=True):
    """The text without fenced code blocks and (unless `inline` is false)
    inline code spans: links and history words inside code are examples,
    not links or history."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "``", line) if inline else line)
    return "\n".join(out)


def included_text(path, anchor):
    """The lines of `path` an include takes: all, or those between
    `ANCHOR: name` and `ANCHOR_END: name`. None when the anchor is missing."""
    lines = path.read_text(encoding="utf-8").split("\n")
    if anchor is None:
        return "\n".join(lines)
    if re.fullmatch(r"\d*(:\d*)?", anchor):
        start, _, end = anchor.partition(":")
        first = int(start) - 1 if start else 0
        last = int(end) if end else len(lines)
        return "\n".join(lines[first:last])
    begin = next((i for i, l in enumerate(lines) if re.search(rf"ANCHOR:\s*{re.escape(anchor)}\b", l)), None)
    finish = next((i for i, l in enumerate(lines) if re.search(rf"ANCHOR_END:\s*{re.escape(anchor)}\b", l)), None)
    if begin is None or finish is None or finish < begin:
        return None
    return "\n".join(lines[begin + 1 : finish])


def is_external(target):
    return re.match(r"^[a-z][a-z0-9+.-]*:", target) is not None


def expanded(path):
    """A Markdown file's text with its `{{#include}}`s replaced by the text
    they pull in (one level, as the book uses them)."""
    text = path.read_text(encoding="utf-8")

    def pull(match):
        file_part, _, anchor = match.group(1).partition(":")
        included = (path.parent / file_part).resolve()
        if not included.is_file():
            return ""
        return included_text(included, anchor or None) or ""

    return INCLUDE.sub(pull, text)


def heading_ids(path):
    """The ids of a Markdown file's headings (with its includes)."""
    ids = set()
    for line in strip_code(expanded(path), inline=False).split("\n"):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        title = re.sub(r"<[^>]+>", "", match.group(1)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        ids.add(slug)
    return ids


def resolves(base_dir, target, page=None):
    path, _, fragment = target.partition("#")
    file = (base_dir / path).resolve() if path else page
    if file is None or not file.exists():
        return path == "" and page is None
    if fragment and file.suffix == ".md":
        return fragment in heading_ids(file)
    return True


def rel(path):
    return path.resolve().relative_to(ROOT).as_posix()


def check_history(text, where, problems):
    for number, line in enumerate(strip_code(text).split("\n"), 1):
        for pattern, what in HISTORY:
            match = pattern.search(line)
            if match:
                problems.append(f"{where}:{number}: {what} ({match.group(0)!r}) outside the benchmarks pages and the changelog")


def check_page(page, problems):
    text = page.read_text(encoding="utf-8")
    where = rel(page)
    history_allowed = where.startswith(HISTORY_ALLOWED)
    for target in LINK.findall(strip_code(text)):
        if not is_external(target) and not resolves(page.parent, target, page):
            problems.append(f"{where}: broken link {target}")
    if not history_allowed:
        check_history(INCLUDE.sub("", text), where, problems)
    for spec in INCLUDE.findall(text):
        file_part, _, anchor = spec.partition(":")
        included = (page.parent / file_part).resolve()
        if not included.is_file():
            problems.append(f"{where}: {{{{#include {spec}}}}} names a missing file")
            continue
        body = included_text(included, anchor or None)
        if body is None:
            problems.append(f"{where}: {{{{#include {spec}}}}} names a missing anchor")
            continue
        shown = f"{rel(included)} (included in {where})"
        for target in LINK.findall(strip_code(body)):
            if is_external(target):
                continue
            if not resolves(included.parent, target, included):
                problems.append(f"{shown}: broken link {target}")
            elif not resolves(page.parent, target, page):
                problems.append(f"{shown}: link {target} resolves in the repository but not in the book; use a path in code quotes or a link that works from both")
        if not history_allowed:
            check_history(body, shown, problems)


def main():
    problems = []
    pages = [ROOT / "README.md"] + sorted(SRC.rglob("*.md"))
    for page in pages:
        check_page(page, problems)
    summary = (SRC / "SUMMARY.md").read_text(encoding="utf-8")
    listed = {(SRC / t).resolve() for t in LINK.findall(summary) if not is_external(t)}
    for page in sorted(SRC.rglob("*.md")):
        if page.name != "SUMMARY.md" and page.resolve() not in listed:
            problems.append(f"{rel(page)}: not listed in docs/src/SUMMARY.md")
    problems += docs_section.problems((ROOT / docs_section.PAGE).read_text(encoding="utf-8"))
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) in the documentation")
        return 1
    print(f"documentation: {len(pages)} pages, every relative link resolves, no history outside the benchmarks pages and the changelog")
    return 0


if __name__ == "__main__":
    sys.exit(main())
