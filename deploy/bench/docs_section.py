"""The generated section of the benchmarks page (docs/src/benchmarks/index.md).

`deploy/bench/compare --write-docs` writes its run (date, the build, the
machine, the load average before and after, the table and the goal lines)
between two markers of the page, and nothing else of it.
`docs/check_links.py` (run by .ci/run) calls `problems()` on the page.

Invariant: the section is exactly what the script wrote. Its first line
carries a checksum of the lines below it, so a hand edit between the
markers (or markers without the script's header) fails the check; rerun the
script, or edit the page outside the markers. Python 3 standard library
only.
"""

import hashlib

PAGE = "docs/src/benchmarks/index.md"
BEGIN = "<!-- compare:begin -->"
END = "<!-- compare:end -->"
HEADER_START = "<!-- Written by deploy/bench/compare --write-docs: do not edit by hand, rerun it. sha256:"
HEADER = HEADER_START + "{digest} -->"


def _digest(body_lines):
    return hashlib.sha256("\n".join(body_lines).encode()).hexdigest()[:16]


def section(body_lines):
    """The section's lines, markers included, for `body_lines` of Markdown."""
    return [BEGIN, HEADER.format(digest=_digest(body_lines))] + list(body_lines) + [END]


def _bounds(lines):
    """(index of BEGIN, index of END), or None when the page lacks one of
    them, holds either twice, or has them out of order."""
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        return None
    return begins[0], ends[0]


def replace(text, body_lines):
    """The page `text` with its section replaced by one of `body_lines`;
    raises ValueError when the page has no single pair of markers."""
    lines = text.split("\n")
    bounds = _bounds(lines)
    if bounds is None:
        raise ValueError(f"the page needs exactly one {BEGIN} and, below it, one {END}")
    begin, end = bounds
    return "\n".join(lines[:begin] + section(body_lines) + lines[end + 1:])


def problems(text, where=PAGE):
    """What is wrong with the page's generated section (empty when nothing)."""
    lines = text.split("\n")
    bounds = _bounds(lines)
    if bounds is None:
        return [f"{where}: the generated section needs exactly one {BEGIN} and, below it, one {END}"]
    begin, end = bounds
    header = lines[begin + 1] if begin + 1 < end else ""
    if not header.startswith(HEADER_START):
        return [f"{where}:{begin + 2}: the generated section does not start with the header "
                "deploy/bench/compare --write-docs writes"]
    if header != HEADER.format(digest=_digest(lines[begin + 2:end])):
        return [f"{where}:{begin + 2}: the generated section was edited by hand (its checksum differs); "
                "rerun deploy/bench/compare --write-docs, or edit outside the markers"]
    return []
