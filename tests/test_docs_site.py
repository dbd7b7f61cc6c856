"""The documentation site (tools/build_docs.py) in a real headless browser: every page loads without console errors,
its images and plots are drawn, executed pages show their outputs (as text, not as lists of lines) and figures, and
every internal link points to a page and an anchor that exist.

The site itself executes every notebook (cached by content in $RLHF_NB_CACHE/docs); executing them all takes too long
for a test, so this one executes the two notebooks below, whose pages show text outputs, tables and figures, in a
fresh cache (tests/conftest.py points $RLHF_NB_CACHE at a temporary folder), and renders the others as stored.

Chromium and its driver come from Debian's packages (`apt-get install chromium chromium-driver`); tools/test.sh
installs them when they are missing and it runs as root. Without them this test is skipped with the reason."""
import html, json, re, shutil, subprocess, sys
from pathlib import Path
from urllib.parse import urlparse, unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


EXECUTED = ("05_loss_zoo", "04b_health")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "build_docs.py"), "--out", str(out), "--execute", *EXECUTED,
                        "--jobs", "2"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return out


def test_every_notebook_has_a_page_and_nothing_comes_from_the_network(site):
    pages = {p.stem for p in site.glob("*.html")}
    assert pages == {p.stem for p in (ROOT / "nbs").glob("*.ipynb")} | {"api"}
    for p in site.glob("*.html"):
        text = p.read_text()
        assert not re.search(r"""(src|href)=["']https?://""", text), f"{p.name} loads something from the network"
        assert "#| export" not in text, f"{p.name} shows nbdev directives"
    assert "<math" in (site / "05_loss_zoo.html").read_text()                     # LaTeX became MathML
    assert sorted(json.loads((site / "build.json").read_text())["executed"]) == sorted(EXECUTED)
    sheets = {p.name for p in site.glob("nb-*.css")}
    for p in site.glob("*.html"):                                                  # one shared notebook stylesheet
        text = p.read_text()
        assert max((len(m) for m in re.findall(r"<style[^>]*>.*?</style>", text, re.S)), default=0) < 5000, p.name
        if p.stem != "api": assert set(re.findall(r'href="(nb-[\w]+\.css)"', text)) <= sheets and len(sheets) == 1, p.name
    assert 'href="01a_core.html#gspo_policy_loss"' in (site / "api.html").read_text()


def test_sidebar_follows_the_learning_path(site):
    """Every page's sidebar shows the parts of the learning path (nbs/index.ipynb) in order with their reading times,
    each part's notebooks under it in reading order, between the home page and the API reference."""
    sys.path.insert(0, str(ROOT / "tools"))
    from path_words import learning_path
    parts = learning_path(ROOT / "nbs" / "index.ipynb")
    want = [(f"{i}. {part}", time_, stems) for i, (part, time_, stems) in enumerate(parts, 1)]
    for page in ("index", "02_ppo", "api"):
        nav = re.search(r'<nav class="site">(.*?)</nav>', (site / f"{page}.html").read_text(), re.S).group(1)
        shown = []
        for m in re.finditer(r"<h3>(.*?)(?: <span>\((.*?)\)</span>)?</h3>|<a href=\"([\w.-]+)\.html\"", nav):
            if m.group(1): shown.append((html.unescape(m.group(1)), html.unescape(m.group(2) or ""), []))
            elif shown and m.group(3) != "api": shown[-1][2].append(m.group(3))
        assert shown == want, f"{page}.html: the sidebar's parts differ from the learning path"
        assert nav.index("index.html") < nav.index("<h3>") and nav.rindex("api.html") > nav.rindex("<h3>")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("NO BROWSER: chromium and chromedriver are not installed (apt-get install chromium chromium-driver; "
                    "tools/test.sh does it when run as root) -- the docs site was not checked in a browser")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--allow-file-access-from-files"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()


PAGE_STATE = """return {ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  images: document.images.length,
  broken: Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80)),
  nav: document.querySelectorAll('nav.site a').length, ready: document.readyState,
  navText: Array.from(document.querySelectorAll('nav.site a')).map(a => a.textContent).join('|'),
  codeCells: document.querySelectorAll('.jp-CodeCell').length,
  outputs: document.querySelectorAll('.jp-CodeCell .jp-OutputArea-output').length,
  texts: Array.from(document.querySelectorAll('.jp-OutputArea-output pre')).map(e => e.textContent.slice(0, 200))}"""


def test_pages_load_clean_in_chromium(site, browser):
    state, errors = {}, []
    for page in sorted(site.glob("*.html")):
        browser.get(page.as_uri())
        st = browser.execute_script(PAGE_STATE)
        logs = [l for l in browser.get_log("browser") if l["level"] in ("SEVERE", "ERROR")]
        errors += [f"{page.name}: {l['message'][:200]}" for l in logs]
        errors += [f"{page.name}: image not drawn: {b}" for b in st["broken"]]
        assert st["ready"] == "complete" and st["nav"] >= len(state) and st["nav"] > 10, (page.name, st["nav"])
        state[page.name] = st
    assert not errors, "\n".join(errors)
    assert not any("`" in st["navText"] for st in state.values())                 # titles without markdown backticks
    for name in json.loads((site / "build.json").read_text())["executed"]:          # executed pages: outputs, shown as text
        st = state[f"{name}.html"]
        assert st["outputs"] > 0 or not st["codeCells"], f"{name}: code cells without any output"
        assert not [t for t in st["texts"] if re.match(r"""\[\s*(['"]).*?\\n\1,""", t, re.S)], f"{name}: an output shown as a list of lines"
    assert all(state[f"{name}.html"]["images"] >= 1 for name in EXECUTED)           # each of these draws a figure
    bad = []
    for name, st in state.items():
        for href in st["links"]:
            u = urlparse(href)
            if u.scheme != "file": continue
            target = Path(unquote(u.path)).name
            if target not in state: bad.append(f"{name} -> {target} (no such page)")
            elif u.fragment and unquote(u.fragment) not in state[target]["ids"]: bad.append(f"{name} -> {target}#{u.fragment} (no such anchor)")
    assert not bad, "broken internal links:\n" + "\n".join(sorted(set(bad))[:40])


def test_cache_key_follows_the_code_a_notebook_runs(tmp_path, monkeypatch):
    "An executed notebook is cached under its content and the package modules it reaches: editing one re-executes it."
    sys.path.insert(0, str(ROOT / "tools"))
    import build_docs
    pkg = tmp_path / "rlhf_nb"; pkg.mkdir()
    (pkg / "a.py").write_text("from .b import f\n"); (pkg / "b.py").write_text("def f(): return 1\n"); (pkg / "c.py").write_text("x = 1\n")
    nb = tmp_path / "n.ipynb"; nb.write_text('{"cells": [{"source": ["from rlhf_nb.a import f"]}]}')
    monkeypatch.setattr(build_docs, "PKG", pkg)
    assert build_docs.modules_reached(nb) == ["a", "b"]
    key = build_docs.cache_path(nb, tmp_path)
    (pkg / "c.py").write_text("x = 2\n")                                      # a module it does not reach
    assert build_docs.cache_path(nb, tmp_path) == key
    (pkg / "b.py").write_text("def f(): return 2\n")                          # reached through a.py
    assert build_docs.cache_path(nb, tmp_path) != key
