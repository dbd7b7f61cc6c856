#!/usr/bin/env python
"""Build the documentation site from the notebooks without quarto: one HTML page per notebook with its outputs and
figures, a navigation bar between them, and an API reference page generated from rlhf_nb/_modidx.py.

    python tools/build_docs.py --out _site                      # the site: every notebook executed (slow/gpu cells skipped)
    python tools/build_docs.py --out _site --execute 05_loss_zoo 05b_golden   # execute only these, the rest as stored
    python tools/build_docs.py --out _site --no-execute         # pages as stored (clean notebooks: code without outputs)

Notebooks are stored without outputs, so the site runs them, as nbdev_test does (execnb, no Jupyter kernel). Each
executed notebook is cached in $RLHF_NB_CACHE/docs (default ~/.cache/rlhf_nb/docs) under the hash of its content and of
the package modules it imports (directly or through other modules): a second build re-runs only the notebooks whose
content or code changed (--jobs N runs N at a time; delete the folder to re-run all).
Math is converted to MathML at build time (latex2mathml), so pages need no JavaScript and nothing from the network;
links to other notebooks (`x.ipynb`) point to their pages; the notebook stylesheet is one shared file. The sidebar
follows the learning path of nbs/index.ipynb (its "## Learning path" section, read by tools/path_words.py): the part
headings in order, each part's notebooks in reading order; a notebook not on the path is listed last. `nbdev_docs`
(quarto) keeps working where quarto exists.
"""
import argparse, ast, functools, hashlib, html, importlib, json, re, shutil, sys, time
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
sys.path.insert(0, str(ROOT / "tools"))
from path_words import learning_path
DIRECTIVE = re.compile(r"^\s*#\s*\|.*$\n?", re.M)

CSS = """
body { margin: 0; font-family: system-ui, sans-serif; }
nav.site { position: fixed; top: 0; left: 0; bottom: 0; width: 230px; overflow-y: auto; background: #f6f7f9;
           border-right: 1px solid #ddd; padding: 12px; font-size: 13px; box-sizing: border-box; }
nav.site a { display: block; padding: 3px 4px; color: #234; text-decoration: none; border-radius: 3px; }
nav.site a.current { background: #dde6f3; font-weight: 600; }
nav.site h2 { font-size: 15px; margin: 4px 0 10px; }
nav.site h3 { font-size: 12px; margin: 14px 0 4px; color: #556; }
nav.site h3 span { font-weight: normal; }
nav.site hr { border: 0; border-top: 1px solid #ddd; margin: 12px 0 6px; }
main.page { margin-left: 240px; padding: 8px 24px 40px; max-width: 1100px; }
nav.pager { display: flex; justify-content: space-between; margin: 30px 0; font-size: 14px; }
table.api td { vertical-align: top; padding: 2px 10px 2px 0; font-size: 14px; }
table.api code { white-space: nowrap; }
math[display="block"] { margin: 0.6em 0; }
"""


def sections(stems, index=NBS / "index.ipynb"):
    """The sidebar's groups for notebooks `stems`: [(part heading, reading time, [stems])] in learning-path order, each
    part's notebooks in reading order; notebooks off the path (or all, without a path) last, in name order."""
    try: parts = learning_path(index)
    except ValueError: parts = []
    out, seen = [], {"index"}
    for i, (part, time_, names) in enumerate(parts, 1):
        names = [s for s in names if s in stems and s not in seen]
        seen.update(names)
        if names: out.append((f"{i}. {part}", time_, names))
    rest = sorted(s for s in stems if s not in seen)
    return out + ([("More notebooks" if out else "Notebooks", None, rest)] if rest else [])


def notebooks(only=None):
    "The notebooks of the site: index first, then the rest in learning-path order (see `sections`)."
    nbs = {p.stem: p for p in NBS.glob("*.ipynb") if not p.name.startswith("_")}
    order = ["index"] * ("index" in nbs) + [s for _, _, names in sections(set(nbs)) for s in names]
    return [nbs[s] for s in order if not only or s in only or s == "index"]


def title_of(nb, stem):
    "The first markdown heading of a notebook (or its file name)."
    for c in nb.cells:
        if c.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", c.source, re.M)
            if m: return m.group(1).replace("`", "").strip()
    return stem


def execute(path):
    "Run notebook `path` in nbs/ as nbdev_test does (execnb, no Jupyter kernel); cells flagged with a tst_flag of settings.ini (slow, gpu, vllm) and eval: false cells are skipped. -> notebook"
    import os, nbformat
    from execnb.nbio import read_nb
    from execnb.shell import CaptureShell
    nbx = read_nb(path)
    flags = "|".join(re.search(r"^tst_flags\s*=\s*(.*)$", (ROOT / "settings.ini").read_text(), re.M).group(1).split())
    skip = lambda c: c.cell_type != "code" or bool(re.search(rf"^\s*#\s*\|\s*({flags}|eval:\s*false)", c.source, re.M))
    cwd = os.getcwd(); os.chdir(NBS)
    try: CaptureShell(path).run_all(nbx, exc_stop=True, preproc=skip)
    finally: os.chdir(cwd)
    return nbformat.reads(json.dumps(nbx), as_version=4)        # outputs' lists of lines joined back into text


CACHE_VERSION = "2"                                              # bump to invalidate every cached notebook
PKG = ROOT / "rlhf_nb"
_OWN = re.compile(r"(?:from\s+rlhf_nb\.|import\s+rlhf_nb\.|from\s+\.)(\w+)|from\s+rlhf_nb\s+import\s+([\w ,]+)")


def _own_modules(text):
    "The rlhf_nb modules that source `text` imports (absolute, `from rlhf_nb import a, b` or relative)."
    names = set()
    for a, b in _OWN.findall(text): names.update([a] if a else [n.strip() for n in b.split(",")])
    return {n for n in names if (PKG / f"{n}.py").exists()}


def modules_reached(path):
    "The package modules notebook `path` imports, directly or through other modules, sorted."
    seen, todo = set(), _own_modules(Path(path).read_text())
    while todo:
        m = todo.pop(); seen.add(m)
        todo |= _own_modules((PKG / f"{m}.py").read_text()) - seen
    return sorted(seen)


def cache_path(path, cache):
    """Where the executed copy of notebook `path` is cached: `cache/<stem>-<hash>.ipynb`, the hash of its content and of
    every package module it reaches (a change to the code a notebook runs re-executes it)."""
    h = hashlib.sha256(CACHE_VERSION.encode() + Path(path).read_bytes())
    for m in modules_reached(path): h.update(m.encode() + (PKG / f"{m}.py").read_bytes())
    return Path(cache) / f"{Path(path).stem}-{h.hexdigest()[:16]}.ipynb"


def _execute_to(path, dest):
    "Execute notebook `path` and write it to `dest` (atomically); -> (stem, seconds). Runs in a worker process."
    import nbformat
    t0 = time.time()
    try: nb = execute(path)
    except Exception as e: raise RuntimeError(f"executing {Path(path).name} failed: {type(e).__name__}: {e}") from None
    tmp = Path(dest).with_suffix(".tmp")
    nbformat.write(nb, tmp); tmp.replace(dest)
    return Path(path).stem, time.time() - t0


def executed(paths, cache, jobs=1):
    "{stem: executed notebook} for notebooks `paths`, from the cache or run now (`jobs` at a time); stale copies removed."
    import nbformat
    cache = Path(cache); cache.mkdir(parents=True, exist_ok=True)
    dest = {p: cache_path(p, cache) for p in paths}                 # the content as it is now, even if edited meanwhile
    todo = [p for p in paths if not dest[p].exists()]
    print(f"notebooks: {len(paths) - len(todo)} from the cache in {cache}, {len(todo)} to execute", flush=True)
    with ProcessPoolExecutor(max(1, min(jobs, len(todo) or 1)), mp_context=multiprocessing.get_context("spawn"),
                             max_tasks_per_child=1) as pool:                 # a fresh process per notebook
        for stem, sec in pool.map(_execute_to, todo, [dest[p] for p in todo]):
            print(f"  executed {stem}.ipynb in {sec:.0f} s", flush=True)
    for p in paths:
        for old in cache.glob(f"{p.stem}-*.ipynb"):
            if old != dest[p]: old.unlink()
    return {p.stem: nbformat.read(dest[p], as_version=4) for p in paths}


_CODE = re.compile(r"(```.*?```|`[^`\n]+`)", re.S)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE = re.compile(r"(?<![\\$\w])\$(?!\s)([^$\n]+?)(?<!\s)\$(?![\w$])")


def _mathml(tex, display):
    from latex2mathml.converter import convert
    try: return convert(tex.strip(), display="block" if display else "inline")
    except Exception: return f"<code>{html.escape(tex)}</code>"


def math_to_mathml(md):
    "Markdown with $$..$$ and $..$ replaced by MathML (code spans and fences left alone)."
    parts = _CODE.split(md)
    for i in range(0, len(parts), 2):
        s = _DISPLAY.sub(lambda m: "\n\n" + _mathml(m.group(1), True).replace("\n", " ") + "\n\n", parts[i])
        parts[i] = _INLINE.sub(lambda m: _mathml(m.group(1), False), s)
    return "".join(parts)


def defined_names(src):
    "Names of the functions and classes a code cell defines at top level (for anchors)."
    try: tree = ast.parse(DIRECTIVE.sub("", src))
    except SyntaxError: return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def prepare(nb):
    "Notebook as shown: directives removed, hidden cells dropped, math as MathML, an anchor before each exported definition."
    import nbformat
    cells = []
    for c in nb.cells:
        if re.search(r"^\s*#\s*\|\s*hide\s*$", c.source, re.M): continue
        if c.cell_type == "markdown": c.source = math_to_mathml(c.source)
        elif c.cell_type == "code":
            if re.search(r"^\s*#\s*\|\s*export", c.source, re.M):
                names = defined_names(c.source)
                if names: cells.append(nbformat.v4.new_markdown_cell("".join(f'<a id="{n}"></a>' for n in names)))
            c.source = DIRECTIVE.sub("", c.source)
            if not c.source.strip() and not c.get("outputs"): continue
        cells.append(c)
    nb.cells = cells
    return nb


_EXTERNAL = [re.compile(p, re.S | re.I) for p in (r"<script[^>]*\bsrc=\"https?://[^\"]*\"[^>]*>\s*</script>",
                                                  r"<link[^>]*\bhref=\"https?://[^\"]*\"[^>]*>",
                                                  r"<script[^>]*>(?:(?!</script>).)*https?://(?:(?!</script>).)*</script>")]


def offline(page):
    "Remove the template's scripts and styles loaded from the network (MathJax, require.js, mermaid, fonts)."
    for rx in _EXTERNAL: page = rx.sub("", page)
    return page


def nav_html(pages, current, groups=()):
    "The sidebar: the pages outside `groups` (the home page), then each group's heading and pages, then the API page."
    titles, cur = dict(pages), ' class="current"'
    link = lambda p: f'<a href="{p}.html"{cur if p == current else ""}>{html.escape(titles[p])}</a>'
    grouped = {s for _, _, names in groups for s in names}
    top = "".join(link(p) for p, _ in pages if p not in grouped and p != "api")
    parts = "".join(f'<h3>{html.escape(h)}' + (f" <span>({html.escape(t)})</span>" if t else "") + "</h3>" +
                    "".join(link(s) for s in names) for h, t, names in groups)
    api = "<hr>" + link("api") if "api" in titles else ""
    return f'<nav class="site"><h2><a href="index.html">rlhf-nb</a></h2>{top}{parts}{api}</nav>'


def pager(pages, current):
    names = [p for p, _ in pages]
    i = names.index(current)
    prev = f'<a href="{names[i - 1]}.html">&larr; {html.escape(pages[i - 1][1])}</a>' if i > 0 else "<span></span>"
    nxt = f'<a href="{names[i + 1]}.html">{html.escape(pages[i + 1][1])} &rarr;</a>' if i + 1 < len(names) else "<span></span>"
    return f'<nav class="pager">{prev}{nxt}</nav>'


def _slug(frag): return re.sub(r"[^\w.-]+", "-", html.unescape(html.unescape(frag))).strip("-")


def plain_anchors(body_html):
    "Heading ids and the links to them reduced to letters, digits, '.', '-' and '_' (nbconvert escapes quotes twice)."
    body_html = re.sub(r'\bid="([^"]*)"', lambda m: f'id="{_slug(m.group(1))}"', body_html)
    return re.sub(r'href="([\w.-]*)#([^"]*)"', lambda m: f'href="{m.group(1)}#{_slug(m.group(2))}"', body_html)


def wrap(body_html, title, pages, current, groups=()):
    "A site page: head with the stylesheet, the navigation, the content, previous/next links."
    body_html = plain_anchors(body_html)
    body_html = re.sub(r'href="(?:nbs/)?([\w.-]+)\.ipynb(#[^"]*)?"', lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', body_html)
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)} - rlhf-nb</title>"
            f"<link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"site.css\">{{head}}</head><body>"
            f"{nav_html(pages, current, groups)}<main class=\"page\">{body_html}{pager(pages, current)}</main></body></html>")


@functools.lru_cache(None)
def exporter():
    "One nbconvert HTML exporter (lab template) for every page: building it reads and compiles the templates."
    from nbconvert import HTMLExporter
    exp = HTMLExporter(template_name="lab")
    exp.register_filter("clean_html", lambda html, *a, **kw: html)   # the project's own notebooks: sanitising took 2/5 of the build
    return exp


def render(nb):
    "(head styles, body) of a notebook rendered by nbconvert's lab template, without network resources."
    page, _ = exporter().from_notebook_node(nb)
    page = offline(page)
    head = "".join(re.findall(r"<style[^>]*>.*?</style>", page.split("</head>")[0], re.S))
    body = re.search(r"<body[^>]*>(.*)</body>", page, re.S).group(1)
    return head, body


def api_page(modules):
    "HTML of the API reference: every exported symbol of every module, its one-line docstring, a link to its notebook."
    from rlhf_nb._modidx import d
    out = ["<h1>API reference</h1><p>Every exported name, by module, with its docstring and the notebook that defines "
           "and tests it.</p>"]
    for mod, syms in d["syms"].items():
        short = mod.split(".", 1)[1]
        nb = modules.get(short)
        out.append(f'<h2 id="{short}">rlhf_nb.{html.escape(short)}</h2><table class="api">')
        try: m = importlib.import_module(mod)
        except Exception as e: m = None; out.append(f"<tr><td colspan=2>(import failed: {html.escape(str(e))})</td></tr>")
        for name in sorted(syms):
            sym = name[len(mod) + 1:] if name.startswith(mod + ".") else name
            obj = m
            for part in sym.split("."): obj = getattr(obj, part, None)
            doc = (getattr(obj, "__doc__", None) or "").strip().split("\n")[0] if callable(obj) else ""
            top = sym.split(".")[0]
            link = f'<a href="{nb}.html#{top}"><code>{html.escape(sym)}</code></a>' if nb else f"<code>{html.escape(sym)}</code>"
            out.append(f"<tr><td>{link}</td><td>{html.escape(doc)}</td></tr>")
        out.append("</table>")
    return "".join(out)


def shared_styles(head, out):
    "Write the notebook template's <style> blocks `head` once, as `out/nb-<hash>.css`; -> the <link> a page uses."
    css = "\n".join(re.findall(r"<style[^>]*>(.*?)</style>", head, re.S))
    name = f"nb-{hashlib.sha256(css.encode()).hexdigest()[:10]}.css"
    if not (out / name).exists(): (out / name).write_text(css)
    return f'<link rel="stylesheet" href="{name}">'


def build(out, execute=None, only=None, jobs=1, cache=None):
    "Write the site to `out`, executing the notebooks named in `execute` (None: all; (): none). -> {page: executed?}"
    import nbformat
    sys.path.insert(0, str(ROOT))
    from rlhf_nb.files import cache_dir
    out = Path(out)
    if out.exists(): shutil.rmtree(out)
    out.mkdir(parents=True)
    nbs = notebooks(only)
    loaded = {p.stem: nbformat.read(p, as_version=4) for p in nbs}
    run = [p for p in nbs if execute is None or p.stem in execute]
    loaded.update(executed(run, cache or cache_dir("docs"), jobs))
    pages = [(s, title_of(nb, s)) for s, nb in loaded.items()] + [("api", "API reference")]
    groups = sections(set(loaded))
    modules = {}
    for s, nb in loaded.items():
        m = next((re.search(r"#\s*\|\s*default_exp\s+(\S+)", c.source) for c in nb.cells if "default_exp" in c.source), None)
        if m: modules[m.group(1)] = s
    for s, nb in loaded.items():
        head, body = render(prepare(nb))
        (out / f"{s}.html").write_text(wrap(body, dict(pages)[s], pages, s, groups).replace("{head}", shared_styles(head, out)))
    (out / "api.html").write_text(wrap(api_page(modules), "API reference", pages, "api", groups).replace("{head}", ""))
    (out / "site.css").write_text(CSS)
    done = {s: s in {p.stem for p in run} for s, _ in pages}
    (out / "build.json").write_text(json.dumps({"executed": sorted(s for s, e in done.items() if e)}, indent=1))
    print(f"wrote {len(pages)} pages to {out} ({len(run)} executed)")
    return done


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--out", default="_site", help="output folder (replaced)")
    ap.add_argument("--execute", nargs="*", default=None,
                    help="execute only these notebooks (stems, e.g. 05_loss_zoo); the others are shown as stored. "
                         "Default: all of them")
    ap.add_argument("--no-execute", action="store_true", help="execute nothing: pages as stored, code without outputs")
    ap.add_argument("--only", nargs="*", default=None, help="build only these notebooks (stems; index is always built)")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks executed at a time (each in its own process)")
    a = ap.parse_args(argv)
    build(a.out, execute=() if a.no_execute else (tuple(a.execute) if a.execute else None), only=a.only, jobs=a.jobs)
    return 0


if __name__ == "__main__": sys.exit(main())
