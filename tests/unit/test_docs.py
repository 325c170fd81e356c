"""The documents a newcomer reads hold together: every relative link in the README, the
changelog, the architecture, docs/ and benchmarks/ resolves to a file, and a `#fragment` to one of
its headings (GitHub's anchors); the README stays a first screen, not a manual."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([
    ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "ARCHITECTURE.md",
    *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").rglob("*.md"),
])
README_LINES = 300
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def broken(page: Path) -> list[str]:
    """The relative links of `page` (outside code blocks) that name no file or no heading."""
    out = []
    for target in _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            out.append(f"{target}: no such heading")
    return out


@pytest.mark.parametrize("page", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_a_broken_link_and_a_missing_heading_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Caps and limits\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#caps-and-limits) [b](nope.md) [c](other.md#not-a-heading)\n"
                    "```\n[d](inside-a-fence.md)\n```\n[e](https://example.com/x.md)\n")
    assert broken(page) == ["nope.md: no such file", "other.md#not-a-heading: no such heading"]


def test_headings_get_githubs_anchors() -> None:
    assert anchor(" Several gateway processes: `serve --workers N`") == (
        "several-gateway-processes-serve---workers-n")
    assert anchor("OpenRLHF (0.11)") == "openrlhf-011"


def test_the_readme_is_a_first_screen() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines: move a topic to docs/"


# One name per concept: a replica is a replica, and "key" is the API key's word alone (the route
# digest, the lookup digest, a group's id). Old names appear only where a page says they are old.
_OTHER_NAMES = re.compile(
    r"GRM_BACKEND_|--backend-url|grm-service backend|grm_backend_|entrypoint backend|"
    r"\b(?:routing|group|cache|lookup|request)[ _-]keys?\b", re.IGNORECASE)
USER_PAGES = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", *(ROOT / "docs").glob("*.md")])


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.name)
def test_each_concept_has_one_name(page: Path) -> None:
    found = [line for line in page.read_text(encoding="utf-8").splitlines()
             if _OTHER_NAMES.search(line) and "old `" not in line]
    assert found == [], f"{page.name}: say replica, route digest, lookup digest or group id"
