"""The user docs hold together: every relative link in README.md and docs/*.md reaches a file,
and an anchor a heading of it; the README stays short; no issue numbers leak into them; the
developers' "Where things live" names every runtime file."""

import ast
import re
from pathlib import Path

import pytest

from mlx_ring.config import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link inside one is an example, not a link)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_slug_is_githubs():
    assert slug("Add a Mac (or a Linux box)") == "add-a-mac-or-a-linux-box"
    assert slug("Speculative decoding (`DRAFT_TOKENS`)") == "speculative-decoding-draft_tokens"
    assert slug("What a verify pass costs") == "what-a-verify-pass-costs"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(
                f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
            )
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '{anchor}' in {dest.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n[ok](#top) [gone](missing.md) [no anchor](#nowhere) [web](https://x.org)\n"
        "```\n[in code](also-missing.md)\n```\n"
    )
    assert links(page) == ["#top", "missing.md", "#nowhere"]
    assert anchors(page) == {"top"}


def test_the_readme_stays_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 320, f"README.md has {lines} lines; move detail to a page under docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_issue_numbers_in_user_docs(page):
    found = re.findall(r"(?i)\bissues?\s*#?\d+|(?<![\w/&])#\d+\b", page.read_text())
    assert not found, f"{page.name} cites {found}: say what is true now, without the issue trail"


def named_in_where_things_live(text: str) -> set[str]:
    """Every path "Where things live" names: a backticked path, or a file's name in the
    row of its folder."""
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    named = set()
    for line in section.splitlines():
        cells = line.split("|")[1:-1]
        if len(cells) < 2:
            continue
        folders = [t for t in re.findall(r"`([^`]+)`", cells[0]) if t.endswith("/")]
        for t in re.findall(r"`([^`]+)`", line):
            named |= {t, *(f + t for f in folders)}
    return named


def runtime_files(root: Path) -> list[str]:
    """Every module a rank or the launcher runs: server.py, shard.py and the package (less an
    `__init__.py` with no code, at most a docstring)."""

    def code(p: Path) -> bool:
        tree = ast.parse(p.read_text())
        return p.name != "__init__.py" or len(tree.body) > (ast.get_docstring(tree) is not None)

    package = [p for p in sorted((root / "mlx_ring").rglob("*.py")) if code(p)]
    return ["server.py", "shard.py", *(str(p.relative_to(root)) for p in package)]


def test_where_things_live_names_every_runtime_file():
    named = named_in_where_things_live((ROOT / "docs" / "development.md").read_text())
    missing = [f for f in runtime_files(ROOT) if f not in named]
    assert not missing, (
        'docs/development.md\'s "Where things live" does not name '
        f"{', '.join(missing)}; add each there"
    )


def test_the_runtime_files_check_sees_a_missing_file(tmp_path):
    (tmp_path / "mlx_ring" / "ring").mkdir(parents=True)
    for f in ("ring/__init__.py", "ring/wire.py", "ring/extra.py", "top.py"):
        (tmp_path / "mlx_ring" / f).write_text('"""A docstring alone."""\n')
    (tmp_path / "mlx_ring" / "__init__.py").write_text("X = 1\n")  # code: it must be named
    text = (
        "## Where things live\n\n| place | what |\n| --- | --- |\n| `mlx_ring/ring/` | `wire.py` "
        "(the wire) |\n| `mlx_ring/top.py` | top |\n\n## Next\n\n`mlx_ring/ring/extra.py`\n"
    )
    named = named_in_where_things_live(text)
    files = runtime_files(tmp_path)
    assert files == [
        "server.py",
        "shard.py",
        "mlx_ring/__init__.py",
        "mlx_ring/ring/extra.py",
        "mlx_ring/ring/wire.py",
        "mlx_ring/top.py",
    ]
    assert [f for f in files if f not in named] == [
        "server.py",
        "shard.py",
        "mlx_ring/__init__.py",
        "mlx_ring/ring/extra.py",
    ]
