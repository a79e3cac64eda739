"""The documentation: README is a short front page, the site (mkdocs.yml, docs/) builds with warnings as errors
(a broken link or anchor, a page left out of the navigation), and the pages a user reads carry no measurement
history (dated rounds belong in docs/dev/ and git history). Their commands run in tests/e2e/test_readme.py."""

import os
import re
import subprocess
import sys

from helpers import DOC_PAGES, ROOT

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pages = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    assert {"index.html", "reference/config/index.html", "clusters/index.html", "dev/benchmarks/index.html"} <= pages


def test_readme_is_a_front_page_that_links_into_the_site():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    linked = set(re.findall(r"\]\((docs/[^)#]+)\)", text))
    guide = {p.relative_to(ROOT).as_posix() for p in DOC_PAGES[1:] if p.name != "index.md"}
    assert guide <= linked, f"guide pages README does not link to: {sorted(guide - linked)}"
    assert all((ROOT / page).is_file() for page in linked)


def test_the_pages_a_user_reads_hold_no_dated_measurements():
    for page in DOC_PAGES:
        prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        dated = [line for line in prose.splitlines() if DATE.search(line) and not re.search(r"(outputs|multirun)/20", line)]
        assert not dated, f"{page.relative_to(ROOT)}: {dated[:3]}"
