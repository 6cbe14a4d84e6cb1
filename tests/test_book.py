"""The course as a website (`make book`, src/dpc_maintainer/book.py): built once from the committed notebooks,
served on a free port and read in headless Chromium (Playwright in the site builder's environment, Debian's
/usr/bin/chromium): every page loads without a console error, links, anchors and images resolve, math renders,
search finds the chapters that teach a term, pages open over file://, and no page holds a line of an answer
or of a hidden test (the release's rule, dpc_instructor.release.secret_lines). On a phone (390 px) the menu
button opens the side menu and its link leads to a chapter; a desktop shows one search field; the start page
tells a student how to get the course, and every `make` command a student's page names is a rule of the
student release's Makefile (src/dpc_instructor/student_files/Makefile)."""
from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from gradekit import ROOT

from dpc_instructor import release
from dpc_maintainer import book
from dpc_maintainer.classroom import CHROMIUM, pull_link
from dpc_maintainer.needs import NEEDS
from dpc_runtime.launch import free_port

pytestmark = pytest.mark.gate  # tests/tiers.py

BOOK_PYTHON = ROOT / "build" / "book-env" / "bin" / "python"
HUB = book.Hub("http://hub.invalid:8000", "https://git.invalid/course/dp-course-student")
SEARCHES = {"reduce-scatter": "course/05-ring-allreduce.html", "SyncBatchNorm": "course/07-ddp-syncbn.html"}
FILE_PAGES = ["index.html", "course/05-ring-allreduce.html"]  # the last: a chapter with plots
# `make <target>` as a page shows it: an inline literal that starts with it, a line of a code block that starts
# with it, or `make <target>` quoted in a code block's comment. Options and VAR=value are skipped.
INLINE_CODE = re.compile(r'<code class="docutils literal[^"]*">(.*?)</code>', re.S)
CODE_BLOCK = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)
MAKE = re.compile(r"^[ \t]*(?:\$[ \t]+)?make((?:[ \t]+[^\s#]+)*)|`make((?:[ \t]+[^`\s]+)*)`", re.M)
# A mention the text gives to someone else ("the course's maintainers' `make solutions`") is no instruction.
SOMEONE_ELSE = re.compile(r"maintainer|instructor", re.I)
INSTRUCTOR_PAGES = ("guide/",)  # the instructor's guide (book/guide/): its commands are the instructor's
EXTERNAL_ASSET = re.compile(r'<(?:script|img)[^>]+src="(?:https?:)?//|<link[^>]+rel="stylesheet"[^>]+href="(?:https?:)?//')


TEXT_FILES = {".html", ".js", ".ipynb", ".txt", ".css", ".json", ".md"}


def _source(rel: Path) -> str:
    """The notebook a file of the site shows (taught.txt's allowances are per notebook)."""
    if rel.parts[0] == book.DOWNLOADS:
        rel = Path(*rel.parts[1:])
    return rel.with_suffix(".ipynb").as_posix()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(ROOT / "src")
    return env


def _wait_served(url: str, server: subprocess.Popen, timeout: float = 30) -> None:
    """Until url answers 200 (a deadline; fails when the server died)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert server.poll() is None, "the static server ended"
        assert time.monotonic() < deadline, f"{url} not served within {timeout:.0f} s"
        time.sleep(0.1)  # polling a port, with a deadline


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built by the site builder's environment (`make book-env` installs it when missing)."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing (make test installs it: src/dpc_setup/system.sh, DPC_SYSTEM_BROWSER=1)")
        pytest.skip(f"{CHROMIUM} is missing (as root: apt-get install chromium)")
    env = subprocess.run(["make", "-s", "book-env"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert env.returncode == 0, env.stdout[-3000:] + env.stderr[-3000:]
    out = tmp_path_factory.mktemp("book")
    t0 = time.monotonic()
    done = subprocess.run([str(BOOK_PYTHON), "-m", "dpc_maintainer.book", "--out", str(out / "site"),
                           "--src", str(out / "src"), "--hub-url", HUB.url, "--repo", HUB.repo],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"book built in {time.monotonic() - t0:.1f} s: {done.stdout.strip()}")
    return out / "site"


@pytest.fixture(scope="module")
def checked(site: Path) -> dict:
    """What Chromium found on every page of the site served by a static server on a free port."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_served(f"http://127.0.0.1:{port}/index.html", server)
        result = site.parent / "result.json"
        args = [a for term in SEARCHES for a in ("--search", term)] + [a for p in FILE_PAGES for a in ("--file-page", p)]
        done = subprocess.run([str(BOOK_PYTHON), "-m", "dpc_maintainer.book", "--check", str(site),
                               "--base", f"http://127.0.0.1:{port}/", "--result", str(result), *args],
                              cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    found: dict = json.loads(result.read_text())
    return found


def test_every_page_loads_without_a_console_error(checked):
    pages = checked["pages"]
    assert {book.page_of(p) for p in book.notebooks()} | {"index.html", "references.html", "search.html"} <= set(pages)
    assert {name: p["errors"] for name, p in pages.items() if p["errors"]} == {}


def test_every_internal_link_and_anchor_resolves(checked):
    assert checked["missing"] == []


def test_every_image_renders_and_math_is_typeset(checked):
    pages = checked["pages"]
    assert {name: p["broken_images"] for name, p in pages.items() if p["broken_images"]} == {}
    assert sum(p["images"] for p in pages.values()) >= 20  # the chapters' committed plots
    assert all(p["raw_math"] == 0 for p in pages.values())
    assert pages["course/07-ddp-syncbn.html"]["math"] > 0


def test_code_cells_can_be_copied(checked):
    assert all(checked["pages"][book.page_of(p)]["copy_buttons"] > 0 for p in book.notebooks())


@pytest.mark.parametrize("term", SEARCHES)
def test_search_finds_the_chapter_that_teaches_it(checked, term):
    assert SEARCHES[term] in checked["search"][term]


def test_pages_work_offline_from_the_folder(checked):
    for name in FILE_PAGES:
        assert checked["file"][name]["errors"] == [] and checked["file"][name]["broken_images"] == []
    assert checked["file"][FILE_PAGES[-1]]["images"] > 0


def test_no_page_loads_anything_from_elsewhere(site):
    assert [p.name for p in site.rglob("*.html") if EXTERNAL_ASSET.search(p.read_text())] == []


def test_no_page_holds_a_line_of_an_answer_or_a_hidden_test(site, checked):
    secrets = release.secret_lines()
    allowed = release.taught()
    assert secrets, "solutions/ has no answer lines: the check would have nothing to look for"
    leaks = []
    for path in sorted(site.rglob("*")):  # the files: pages, search index, downloads (pictures left out)
        if path.suffix in TEXT_FILES:
            lines = release.searchable_lines(path)
            leaks += [f"{path.relative_to(site)}: {s!r} ({w})" for s, w in secrets.items()
                      if s in lines and (_source(path.relative_to(site)), s) not in allowed]
    for name, page in checked["pages"].items():  # the text as a reader sees it (code out of its markup)
        lines = {release.norm(line) for line in page["text"].splitlines()}
        leaks += [f"{name}: {s!r} ({w})" for s, w in secrets.items()
                  if s in lines and (_source(Path(name)), s) not in allowed]
    assert leaks == []
    lab = checked["pages"]["labs/05-ring-allreduce/ring-allreduce.html"]["text"]
    assert "YOUR CODE HERE" in lab  # the student form, visible tests and all


def test_each_notebook_page_opens_with_its_needs_line_the_download_and_the_hub_link(site):
    for path in book.notebooks():
        page = html.unescape((site / book.page_of(path)).read_text())
        title = page.index("<h1")
        start = page.index('class="dpc-launch"')
        cells = json.loads((ROOT / path).read_text())["cells"]
        needs = NEEDS.search("\n".join("".join(c["source"]) for c in cells))
        assert needs is not None, path
        assert title < page.index("dpc-needs") < start, path
        assert needs.group(0).removeprefix("**Needs:** ")[:40] in page, path  # its start: no quote to curl
        download = re.search(r'class="dpc-download" href="([^"]+)"', page)
        assert download is not None, path
        assert (site / book.page_of(path)).parent.joinpath(download.group(1)).resolve().read_bytes() == \
            (ROOT / path).read_bytes()
        assert f'class="dpc-hub" href="{pull_link(HUB.url, HUB.repo, path)}"' in page, path


def test_without_a_hub_there_is_no_hub_link(tmp_path):
    assert "dpc-hub" not in book.header("course/05-ring-allreduce.ipynb", "2 CPU cores", book.Hub())
    assert book.load_hub(tmp_path / "missing.yml") == book.Hub()
    half = tmp_path / "hub.yml"
    half.write_text('hub_url: "https://hub.example.edu"  # no git URL yet\nrelease_git_url: ""\n')
    assert book.load_hub(half).link("course/05-ring-allreduce.ipynb") == ""
    half.write_text("hub_url: https://hub.example.edu\nrelease_git_url: https://git.example.edu/x/dp-course-student\n")
    link = book.load_hub(half).link("course/05-ring-allreduce.ipynb")
    assert link == ("https://hub.example.edu/hub/user-redirect/git-pull?repo=https%3A//git.example.edu/x/"
                    "dp-course-student&branch=student&urlpath=lab/tree/dp-course-student/course/05-ring-allreduce.ipynb")


def test_the_menu_opens_on_a_phone_and_leads_to_a_chapter(checked):
    phone = checked["layout"]["phone"]
    assert phone["toggles"] == 1 and phone["links_before"] == 0, phone  # one menu button, the menu shut
    assert phone["links_after"] > 0, f"the menu button at {book.PHONE['width']} px did not open the side menu: {phone}"
    assert phone["followed"] == phone["link"] and phone["followed"].startswith("course/"), phone
    assert phone["title"].startswith("Chapter "), phone


def test_a_desktop_shows_one_search_field(checked):
    desktop = checked["layout"]["desktop"]
    assert desktop["search_fields"] == 1, desktop
    assert desktop["links"] > 0  # and the side menu beside the page
    assert checked["layout"]["phone"]["search_fields"] == 1


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def make_targets(page: str) -> list[tuple[str, str]]:
    """Each `make <target>` a page's HTML shows as a command: (target, the text just before it)."""
    found = []
    for where in INLINE_CODE.finditer(page):
        words = _text(where.group(1)).split()
        if words[:1] == ["make"] and len(words) > 1:  # a bare `make` names the tool ("`make`, `git` and `g++`")
            found.append((words[1:], _text(page[max(0, where.start() - 300):where.start()])[-60:]))
    for where in CODE_BLOCK.finditer(page):
        for m in MAKE.finditer(_text(where.group(1))):
            if (m.group(1) or m.group(2) or "").strip():
                found.append(((m.group(1) or m.group(2)).split(), ""))
    targets = []
    for words, before in found:
        named = [w for w in words if not w.startswith("-") and "=" not in w]
        targets.append((named[0] if named else "", before))  # '': plain `make`, the first rule
    return targets


def student_pages(site: Path) -> list[str]:
    """The pages a student reaches from the start page by its links (the instructor's guide left out)."""
    seen, todo = set(), ["index.html"]
    while todo:
        name = todo.pop()
        if name in seen or name.startswith(INSTRUCTOR_PAGES) or not (site / name).is_file():
            continue
        seen.add(name)
        for href in re.findall(r'href="([^"#?]+)', (site / name).read_text()):
            if "//" not in href and href.endswith(".html"):
                target = (site / name).parent.joinpath(href).resolve()
                if target.is_relative_to(site.resolve()):
                    todo.append(target.relative_to(site.resolve()).as_posix())
    return sorted(seen)


def student_targets() -> set[str]:
    """The rules of the Makefile the student release ships ('' for plain `make`)."""
    rules = re.findall(r"^([A-Za-z][\w.-]*(?:[ \t]+[A-Za-z][\w.-]*)*)[ \t]*:(?![=:])", book.STUDENT_MAKEFILE.read_text(),
                       re.M)
    return {t for r in rules for t in r.split()} | {""}


def test_every_make_command_a_student_page_names_is_in_the_student_makefile(site):
    targets = student_targets()
    assert {"lab", "check", "help"} <= targets and "test" not in targets  # the parse found the student's rules
    pages = student_pages(site)
    assert {"index.html", "references.html"} | {book.page_of(p) for p in book.notebooks()} <= set(pages)
    named = {(name, t) for name in pages for t, before in make_targets((site / name).read_text())
             if not SOMEONE_ELSE.search(before)}
    assert sorted(f"{name}: make {t}" for name, t in named if t not in targets) == []
    assert {t for name, t in named if name == "index.html"} >= {"lab", "check", "help"}


def test_the_start_page_says_how_to_get_the_course(site):
    start = _text((site / "index.html").read_text())
    assert f"git clone -b student {HUB.repo} dp-course-student" in start  # book/hub.yml's release_git_url
    assert "make test" not in start and "make check LAB=" in start
    assert "<url>" in book.start_page(book.Hub()) and "your instructor gives you" in book.start_page(book.Hub())
