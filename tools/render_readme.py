#!/usr/bin/env python
"""Render README.md from nbs/index.ipynb without quarto.

nbdev's own `nbdev_readme` needs quarto, which cannot be installed on every machine, so the README is
rendered with nbconvert's markdown exporter: cells marked `#| hide` are dropped, `#|` directive lines are
removed, and everything else (markdown, code, stored outputs) is kept in order.
Usage: python tools/render_readme.py [--check]   (--check exits 1 if README.md is out of date)
"""
import sys, copy
from pathlib import Path
import nbformat
from nbconvert import MarkdownExporter

ROOT = Path(__file__).resolve().parents[1]
HEADER = "<!-- Rendered from nbs/index.ipynb by tools/render_readme.py: edit the notebook, not this file. -->\n\n"

def render(nb_path=ROOT / "nbs" / "index.ipynb"):
    "Return the README text for the notebook at `nb_path`."
    nb = nbformat.read(str(nb_path), as_version=4)
    nb = copy.deepcopy(nb)
    keep = []
    for cell in nb.cells:
        lines = cell.source.splitlines()
        directives = [l for l in lines if l.startswith("#|")]
        if any(l.replace(" ", "") in ("#|hide", "#|export") for l in directives): continue
        if cell.cell_type == "code": cell.source = "\n".join(l for l in lines if not l.startswith("#|"))
        keep.append(cell)
    nb.cells = keep
    body, _ = MarkdownExporter().from_notebook_node(nb)
    return HEADER + body.strip() + "\n"

if __name__ == "__main__":
    text, out = render(), ROOT / "README.md"
    if "--check" in sys.argv:
        if not out.exists() or out.read_text() != text:
            print("README.md is out of date with nbs/index.ipynb: run python tools/render_readme.py"); sys.exit(1)
        print("README.md is up to date"); sys.exit(0)
    out.write_text(text); print(f"wrote {out}")
