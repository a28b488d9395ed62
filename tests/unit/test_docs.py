"""The docs held to the tree: docs/architecture.md names every module of the product and the
testbeds (and names none that is gone), every relative link of the README and the docs
resolves to a file and, with an `#anchor`, to a heading of it (GitHub's slugs), and the
README stays short enough to read top to bottom, its quick start on one screen.

Which modules must be named: every `.py` file under reconciler/, sidecar/, telemetry/,
kubecore/, e2e/ and benchmarks/, except test modules (`test_*.py`, `conftest.py`, which
docs/testing.md describes by tier) and `__init__.py`, which is named by its package's
folder (`e2e/fake_model/`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"
PACKAGES = ("reconciler", "sidecar", "telemetry", "kubecore", "e2e", "benchmarks")
README_MAX_LINES = 150
SCREEN_LINES = 45

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def module_names(root: Path = ROOT) -> list[str]:
    """What docs/architecture.md must name, as paths from the repository root: each module,
    and each package folder (with a trailing `/`) in place of its `__init__.py`."""
    names = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if path.name.startswith("test_") or path.name == "conftest.py":
                continue
            if path.name == "__init__.py":
                names.append(relative.parent.as_posix() + "/")
            else:
                names.append(relative.as_posix())
    return names


def _named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w])", text) is not None


def missing_from(text: str, names: list[str]) -> list[str]:
    return [name for name in names if not _named(name, text)]


def named_but_gone(text: str, root: Path = ROOT) -> list[str]:
    """Module paths the text names (under the packages above) that the tree does not hold."""
    pattern = rf"(?<![\w/.])((?:{'|'.join(PACKAGES)})/[\w/]*\.py)(?![\w])"
    return sorted({p for p in re.findall(pattern, text) if not (root / p).is_file()})


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as rendered (a link's text, no code marks),
    lower-cased, every character but letters, digits, `_`, `-` and spaces dropped, and each
    space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor; a repeated one gets `-1`, `-2`, ... as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(markdown: str) -> list[str]:
    """The targets of the inline links and images, outside code blocks and code spans."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return LINK.findall(prose)


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` that leads nowhere, with why."""
    broken = []
    for target in links(page.read_text()):
        if SCHEME.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" \
                and anchor not in anchors(destination.read_text()):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def pages(root: Path = ROOT) -> Iterator[Path]:
    yield root / "README.md"
    yield from sorted((root / "docs").glob("*.md"))
    for folder in ("e2e", "examples"):
        yield from sorted((root / folder).rglob("README.md"))


def test_architecture_names_every_module() -> None:
    missing = missing_from(ARCHITECTURE.read_text(), module_names())
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)


def test_architecture_names_no_module_that_is_gone() -> None:
    gone = named_but_gone(ARCHITECTURE.read_text())
    assert not gone, "docs/architecture.md names modules the tree lacks: " + ", ".join(gone)


@pytest.mark.parametrize("page", list(pages()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}"


def test_the_quick_start_fits_on_one_screen() -> None:
    text = README.read_text()
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.DOTALL | re.MULTILINE)
    assert section, "README.md has no '## Quick start' section"
    lines = len(section.group(0).splitlines())
    assert lines <= SCREEN_LINES, f"the quick start is {lines} lines, at most {SCREEN_LINES}"


def test_the_checks_themselves() -> None:
    """The rules above, on made-up text, so that a check that passes is not a check that
    cannot fail."""
    assert slug("The test command (`scripts/test`): where the time goes") \
        == "the-test-command-scriptstest-where-the-time-goes"
    assert slug("### 1,000 streams again (2026-12-03, morning)".lstrip("# ")) \
        == "1000-streams-again-2026-12-03-morning"
    assert slug("Read [the API](api.md) first") == "read-the-api-first"
    assert anchors("# A\n## A\n```\n# B\n```\n") == {"a", "a-1"}
    assert links("[x](a.md) `[y](b.md)` ![z](c.svg)\n```\n[w](d.md)\n```\n") \
        == ["a.md", "c.svg"]
    text = "- `e2e/local/node_agent/kube.py`: ...\n- `e2e/local/`: ...\n"
    assert missing_from(text, ["e2e/local/kube.py", "e2e/local/node_agent/kube.py",
                               "e2e/local/", "e2e/local/node_agent/"]) \
        == ["e2e/local/kube.py", "e2e/local/node_agent/"]
    assert named_but_gone("`reconciler/nowhere.py` and `reconciler/swap.py`") \
        == ["reconciler/nowhere.py"]
