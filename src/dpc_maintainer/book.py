"""The course as a website (`make book`): the chapters, the labs as students get them, the references.

    python -m dpc_maintainer.book [--out build/book] [--hub-url URL] [--repo GIT_URL]   # what `make book` runs
    python -m dpc_maintainer.book --check SITE --base URL --result FILE [--search TERM=PAGE ...]

It runs in the site builder's own environment (requirements-book.txt, build/book-env: Sphinx, MyST-NB,
sphinx-book-theme, Playwright), not the course's. The build stages a Sphinx project under build/book-src
from the committed notebooks (course/*.ipynb with their outputs; labs/*/*.ipynb, the student form that
`make labs` writes and the release ships: no answers, no hidden tests), the start page (book/index.md
with the map of chapters and labs and the student's commands, from the student release's README, the clone
address from book/hub.yml's release_git_url) and the README's references, then runs
Sphinx with book/conf.py: nothing is executed, nothing is fetched (MathJax is served from the site).
Each chapter and lab page opens with its Needs line, a link to download the notebook and, when
book/hub.yml names a hub and the release's git URL, an "open on your class hub" nbgitpuller link.

`--check` is the browser half of tests/test_book.py: headless Chromium (Playwright driving Debian's
/usr/bin/chromium) visits every page of a served site and writes what it found as JSON (console
errors, links and anchors that do not resolve, images of zero size, search results, the side menu on a
phone and the search fields on a desktop).
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpc_instructor.release import STUDENT_FILES, TEMPLATES, first_heading, readme_section
from dpc_maintainer.classroom import CHROMIUM, CHROMIUM_FLAGS, pull_link
from dpc_maintainer.needs import NEEDS

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "book"  # conf.py, the start page's template, the hub settings, the site's CSS
SETTINGS = CONF / "hub.yml"
GUIDE = CONF / "guide"  # the instructor's guide: Markdown pages, staged as they are (site: guide/)
DEFAULT_OUT = ROOT / "build" / "book"
STAGE = ROOT / "build" / "book-src"
DOWNLOADS = "notebooks"  # the notebooks as they are in the release, under the site's notebooks/<path>
BASH_BLOCK = re.compile(r"```bash\n.*?```", re.S)
# The start page speaks to a student: its commands are the student release's (its README and Makefile,
# src/dpc_instructor/student_files/), never this repository's maintainer targets.
STUDENT_README = TEMPLATES / next(t for t, rel in STUDENT_FILES.items() if rel == "README.md")
STUDENT_MAKEFILE = TEMPLATES / next(t for t, rel in STUDENT_FILES.items() if rel == "Makefile")
URL_PLACEHOLDER = "<url>"  # the student README's stand-in for the release's git address


@dataclass(frozen=True)
class Hub:
    """Where "open on your class hub" leads: the hub's address, the release's git URL and branch."""

    url: str = ""
    repo: str = ""
    branch: str = "student"

    def link(self, path: str) -> str:
        """The nbgitpuller link that opens the release's `path` on the hub ('' when the hub is not set)."""
        return pull_link(self.url, self.repo, path, self.branch) if self.url and self.repo else ""


def load_hub(path: Path = SETTINGS) -> Hub:
    """book/hub.yml's settings (hub_url, release_git_url, branch); empty when the file or a value is missing."""
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines() if path.exists() else []:
        key, sep, value = raw.split("#", 1)[0].partition(":")
        if sep and key.strip():
            values[key.strip()] = value.strip().strip("\"'")
    return Hub(values.get("hub_url", ""), values.get("release_git_url", ""), values.get("branch") or "student")


def notebooks() -> list[str]:
    """The site's notebooks, as paths of the release: the chapters in order, then the labs."""
    chapters = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "course").glob("*.ipynb"))
    labs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "labs").glob("*/*.ipynb"))
    return chapters + labs


def page_of(path: str) -> str:
    """The site page of a notebook: course/05-ring-allreduce.ipynb -> course/05-ring-allreduce.html."""
    return str(Path(path).with_suffix(".html"))


def header(path: str, needs: str, hub: Hub) -> str:
    """The markdown a notebook's page opens with: its Needs line, download, open on the hub."""
    up = "../" * path.count("/")
    links = [f'<a class="dpc-download" href="{up}{DOWNLOADS}/{path}" download>Download the notebook</a>']
    if hub.link(path):
        links.append(f'<a class="dpc-hub" href="{hub.link(path)}">Open on your class hub</a>')
    links.append('<a class="dpc-print" href="javascript:window.print()">Print</a>')
    box = f"```{{admonition}} Needs\n:class: dpc-needs\n{needs}\n```\n\n" if needs else ""
    return box + '<p class="dpc-launch">' + " · ".join(links) + "</p>\n"


def page_notebook(nb: dict[str, Any], path: str, hub: Hub) -> dict[str, Any]:
    """The notebook as its page shows it: the title, then the header, then the rest (Needs line moved up)."""
    nb = copy.deepcopy(nb)
    needs = ""
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        found = NEEDS.search(text) if cell["cell_type"] == "markdown" else None
        if found:
            needs = found.group(0).removeprefix("**Needs:**").strip()
            cell["source"] = (text[:found.start()] + text[found.end():]).strip("\n")
            break
    first = "".join(nb["cells"][0]["source"])
    title, _, rest = first.partition("\n")
    made = [{"id": f"{nb['cells'][0].get('id', 'dpc')}-{i}", "cell_type": "markdown", "metadata": {}, "source": src}
            for i, src in enumerate((title, header(path, needs, hub), rest.strip("\n"))) if src]
    nb["cells"] = made + [c for c in nb["cells"][1:] if "".join(c["source"]).strip()]
    return nb


def student_block(first: str) -> str:
    """The first ```bash block of the student README whose first line starts with `first`."""
    for block in BASH_BLOCK.findall(STUDENT_README.read_text()):
        if block.splitlines()[1].startswith(first):
            return block
    raise ValueError(f"{STUDENT_README.relative_to(ROOT)} has no ```bash block starting with {first!r}")


def get_course(hub: Hub) -> str:
    """How a student clones the release: the student README's clone block, with book/hub.yml's
    release_git_url (the one setting of the release's address, also the hub link's) when it is set."""
    block = student_block("git clone")
    if not hub.repo:
        return block + f"\n\n(`{URL_PLACEHOLDER}`: the git address your instructor gives you.)"
    return block.replace(URL_PLACEHOLDER, hub.repo).replace("-b student ", f"-b {hub.branch} ")


def start_page(hub: Hub | None = None) -> str:
    """book/index.md with the map of chapters and labs and the student's commands filled in."""
    from dpc_runtime.manifest import chapters  # PyYAML: in both environments, read when building

    rows = []
    for ch in chapters():
        lab = sorted((ROOT / "labs" / ch.lab).glob("*.ipynb"))[0].relative_to(ROOT).as_posix() if ch.lab else ""
        lab_cell = f"[{first_heading(ROOT / lab)}]({lab})" if lab else "—"
        rows.append(f"| {ch.number} | [{first_heading(ROOT / ch.notebook)}]({ch.notebook}) | {lab_cell} |")
    template = (CONF / "index.md").read_text()
    return (template.replace("@MAP@", "\n".join(rows))
            .replace("@GET_COURSE@", get_course(load_hub() if hub is None else hub))
            .replace("@QUICK_START@", student_block("make lab"))
            .replace("@CHECK@", student_block("make check")))


def guide_pages() -> list[str]:
    """The instructor's guide's pages as paths of the site's sources (guide/index.md, guide/grade.md, ...)."""
    return sorted(p.relative_to(CONF).as_posix() for p in GUIDE.glob("*.md"))


def stage(src: Path, hub: Hub) -> int:
    """Write the Sphinx project's sources into src (start page, references, pages, downloads); pages written."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    (src / "index.md").write_text(start_page(hub))
    refs = readme_section("References")
    (src / "references.md").write_text(refs.replace("## References", "# References", 1) + "\n")
    paths = notebooks()
    for path in paths:
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        nb = page_notebook(json.loads((ROOT / path).read_text()), path, hub)
        (src / path).write_text(json.dumps(nb, indent=1))
    guide = guide_pages()
    for page in guide:  # the instructor's guide (book/guide/), as written
        (src / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CONF / page, src / page)
    return len(paths) + 2 + len(guide)


def build(out: Path = DEFAULT_OUT, hub: Hub | None = None, src: Path = STAGE) -> Path:
    """Stage and build the site into out (a fresh folder); return out. Raises RuntimeError on a Sphinx error."""
    t0 = time.monotonic()
    pages = stage(src, load_hub() if hub is None else hub)
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-E", "-j", "auto", "-c", str(CONF),
           "-d", str(src.with_name(src.name + "-doctrees")),  # Sphinx's cache, not in the site
           "--fail-on-warning", "--keep-going", str(src), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"sphinx-build failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    for path in notebooks():  # "Download the notebook": the file as the release has it
        (out / DOWNLOADS / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, out / DOWNLOADS / path)
    print(f"book: {pages} pages in {out} ({time.monotonic() - t0:.0f} s); open {out / 'index.html'}", flush=True)
    return out


# ---------------------------------------------------------------- the browser checks (tests/test_book.py)

JS_PAGE = """() => ({
  ids: [...document.querySelectorAll('[id]')].map(e => e.id)
         .concat([...document.querySelectorAll('a[name]')].map(e => e.name)),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  sources: [...document.querySelectorAll('img[src], script[src], link[rel=stylesheet][href]')]
             .map(e => e.src || e.href),
  broken_images: [...document.images].filter(i => !i.complete || i.naturalWidth === 0 || i.naturalHeight === 0)
                   .map(i => i.src),
  images: document.images.length,
  math: document.querySelectorAll('mjx-container svg').length,
  raw_math: document.querySelectorAll('.math:not(:has(mjx-container))').length,
  copy_buttons: document.querySelectorAll('button.copybtn').length,
  text: document.body.innerText,
})"""
JS_SEARCH_DONE = """() => {
  const s = document.querySelector('#search-results .search-summary');
  return s !== null && s.textContent.trim() !== '' && !/preparing|searching/i.test(s.textContent);
}"""


# A phone (390 px, an iPhone 12-15's CSS width) and a desktop. What a reader can see: a box on screen, not
# hidden by CSS, and at least partly inside the viewport (a drawer parked off-screen is not visible).
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
SEARCH_FIELDS = "input[type=search], .search-button-field, .search-button"
MENU_LINKS = ".bd-docs-nav a.reference.internal[href*='course/']"  # the side menu's chapter links
JS_SHOWN = """(sel) => [...document.querySelectorAll(sel)].filter(e => {
  const r = e.getBoundingClientRect();
  return e.checkVisibility({checkOpacity: true, checkVisibilityCSS: true}) && r.width > 0 && r.height > 0
    && r.right > 0 && r.bottom > 0 && r.left < innerWidth && r.top < innerHeight;
}).length"""


async def _layout(browser: Any, base: str) -> dict[str, Any]:
    """The start page on a phone (the menu button opens the side menu, whose link leads to a chapter) and on a
    desktop (how many search fields show at once)."""
    out: dict[str, Any] = {}
    page = await browser.new_page(viewport=PHONE)
    await page.goto(base + "index.html", wait_until="load")
    menu: dict[str, Any] = {"toggles": await page.evaluate(JS_SHOWN, ".primary-toggle"),
                            "links_before": await page.evaluate(JS_SHOWN, MENU_LINKS),
                            "search_fields": await page.evaluate(JS_SHOWN, SEARCH_FIELDS)}
    if menu["toggles"]:
        await page.locator(".primary-toggle:visible").first.click()
        try:  # the drawer slides in: a deadline, not a sleep
            await page.wait_for_function(f"() => ({JS_SHOWN})({json.dumps(MENU_LINKS)}) > 0", timeout=5_000,
                                         polling=100)
        except Exception:  # playwright's TimeoutError: the menu stayed shut
            pass
    menu["links_after"] = await page.evaluate(JS_SHOWN, MENU_LINKS)
    menu["followed"] = ""
    if menu["links_after"]:
        link = page.locator(MENU_LINKS + ":visible").first
        menu["link"] = await link.get_attribute("href")
        await link.click()
        try:
            await page.wait_for_url(lambda url: url.split("#")[0] != base + "index.html", timeout=10_000)
            await page.wait_for_load_state("load")
            menu["followed"] = page.url.removeprefix(base).split("#")[0]
            menu["title"] = await page.title()
        except Exception:  # no navigation within the deadline
            pass
    out["phone"] = menu
    await page.close()
    page = await browser.new_page(viewport=DESKTOP)
    await page.goto(base + "index.html", wait_until="load")
    out["desktop"] = {"search_fields": await page.evaluate(JS_SHOWN, SEARCH_FIELDS),
                      "links": await page.evaluate(JS_SHOWN, MENU_LINKS)}
    await page.close()
    return out


def site_pages(site: Path) -> list[str]:
    """Every HTML page of a built site, relative to it."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if not p.relative_to(site).parts[0].startswith("_"))


async def _visit(page: Any, url: str) -> dict[str, Any]:
    """Load one page; what it holds and the console errors it logged while loading."""
    errors: list[str] = []

    def on_console(msg: Any) -> None:
        if msg.type == "error":
            errors.append(msg.text)

    def on_error(e: Any) -> None:
        errors.append(f"uncaught: {e}")

    def on_response(r: Any) -> None:
        if r.status >= 400:
            errors.append(f"HTTP {r.status}: {r.url}")

    page.on("console", on_console)
    page.on("pageerror", on_error)
    page.on("response", on_response)
    try:
        response = await page.goto(url, wait_until="load")
        if response is not None and not response.ok and not url.startswith("file:"):
            errors.append(f"HTTP {response.status}")
        # MathJax typesets after load: wait until no formula is left as TeX (a deadline, not a sleep).
        await page.wait_for_function("() => document.querySelectorAll('.math:not(:has(mjx-container))').length === 0",
                                     timeout=30_000, polling=100)
        found: dict[str, Any] = await page.evaluate(JS_PAGE)
    finally:
        page.remove_listener("console", on_console)
        page.remove_listener("pageerror", on_error)
        page.remove_listener("response", on_response)
    found["errors"] = errors
    return found


async def _search(page: Any, base: str, term: str) -> list[str]:
    """The pages (relative to base) the site's search lists for term, once it says it has finished."""
    await page.goto(f"{base}search.html?q={term}", wait_until="load")
    await page.wait_for_function(JS_SEARCH_DONE, timeout=60_000, polling=100)
    hrefs: list[str] = await page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.href)")
    return sorted({h.removeprefix(base).split("#")[0].split("?")[0] for h in hrefs})


async def _missing(page: Any, base: str, seen: dict[str, dict[str, Any]]) -> list[str]:
    """Internal links whose page, file or anchor does not exist: 'page -> link' each."""
    bad = []
    status: dict[str, int] = {}
    for name, found in sorted(seen.items()):
        for url in found["links"] + found["sources"]:
            if not url.startswith(base):
                continue
            target, _, anchor = url.removeprefix(base).partition("#")
            target = target.split("?")[0] or "index.html"
            if target.endswith("/"):
                target += "index.html"
            if target in seen:
                if anchor and anchor not in seen[target]["ids"]:
                    bad.append(f"{name} -> {url} (no anchor #{anchor})")
                continue
            if target not in status:
                status[target] = (await page.request.get(base + target)).status
            if status[target] != 200:
                bad.append(f"{name} -> {url} (HTTP {status[target]})")
    return bad


async def _check(site: Path, base: str, searches: list[str], file_pages: list[str], shots: Path) -> dict[str, Any]:
    """Every page of the site served at base, a few over file://, the searches, and the start page on a phone
    and on a desktop (`_layout`), in one Chromium.

    Screenshots of the start page and of the last file page go into shots (start.png, page.png).
    """
    from playwright.async_api import async_playwright

    out: dict[str, Any] = {"pages": {}, "file": {}, "search": {}}
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = await browser.new_page()
        seen = {name: await _visit(page, base + name) for name in site_pages(site)}
        out["missing"] = await _missing(page, base, seen)
        for term in searches:
            out["search"][term] = await _search(page, base, term)
        for name in file_pages:
            found = await _visit(page, (site / name).resolve().as_uri())
            out["file"][name] = {k: found[k] for k in ("errors", "broken_images", "images", "math")}
        for name, shot in ("index.html", "start.png"), (file_pages[-1], "page.png"):
            await page.goto(base + name, wait_until="load")
            await page.screenshot(path=str(shots / shot), full_page=False)
        out["layout"] = await _layout(browser, base)
        await browser.close()
    out["pages"] = {k: {x: v[x] for x in v if x not in ("ids", "links", "sources")} for k, v in seen.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    """Build the site (default) or, with --check, check a served one in Chromium."""
    ap = argparse.ArgumentParser(prog="python -m dpc_maintainer.book", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the site's folder (default build/book)")
    ap.add_argument("--src", type=Path, default=STAGE, help="where the Sphinx sources are staged")
    ap.add_argument("--hub-url", help="instead of book/hub.yml's hub_url (the classroom test's hub)")
    ap.add_argument("--repo", help="instead of book/hub.yml's release_git_url")
    ap.add_argument("--check", type=Path, metavar="SITE", help="check the built site SITE, served at --base")
    ap.add_argument("--base", help="the URL SITE is served at, ending in /")
    ap.add_argument("--result", type=Path, help="where --check writes what it found (JSON)")
    ap.add_argument("--search", action="append", default=[], help="a term to search for (repeatable)")
    ap.add_argument("--file-page", action="append", default=[], help="a page also opened over file://")
    a = ap.parse_args(argv)
    if a.check:
        res = asyncio.run(_check(a.check.resolve(), a.base, a.search, a.file_page or ["index.html"],
                                a.result.parent))
        a.result.write_text(json.dumps(res, indent=1))
        return 0
    hub = load_hub()
    if a.hub_url is not None or a.repo is not None:
        hub = Hub(a.hub_url if a.hub_url is not None else hub.url, a.repo if a.repo is not None else hub.repo,
                  hub.branch)
    try:
        build(a.out.resolve(), hub, a.src.resolve())
    except RuntimeError as e:
        print(f"book: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
