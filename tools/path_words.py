#!/usr/bin/env python
"""The learning path of nbs/index.ipynb, measured: how long each part takes to read, and how much prose a reader
meets before the first equation with a policy π in it.

The path is the "## Learning path" section of nbs/index.ipynb: one `### N. Part (reading time)` heading per part,
each with a table whose rows name the part's notebooks in reading order (| [`stem`](nbs/stem.ipynb) | module | what a
reader learns |).

Reading time, the rule: markdown words at 200 words a minute plus non-blank code lines (nbdev `#|` directives left
out) at 10 lines a minute, summed over the part's notebooks and rounded to 5 minutes (at least 5).

Prose before π: walking the notebooks in order, the words of markdown prose (code blocks, inline code, HTML and
math left out) before the first LaTeX span, `$...$` or `$$...$$`, that contains `\\pi`.

    python tools/path_words.py                  # the path: prose before π, reading time per part
    python tools/path_words.py --order files    # the notebooks in file order (00_data first) instead
    python tools/path_words.py --write          # put the rule's reading times into the part headings of index.ipynb
"""
import argparse, json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
INDEX = NBS / "index.ipynb"
WORDS_PER_MIN, LINES_PER_MIN = 200, 10
SECTION = re.compile(r"#+ *Learning path(.*?)(\n#{1,2} [^#]|\Z)", re.S | re.I)   # as the before-stop hook reads it
PART = re.compile(r"^### +(?:\d+\. *)?(.+?)(?: +\(([^()]*\d[^()]*)\))? *$", re.M)
ROW = re.compile(r"^\| *\[?`([\w.-]+)`(?:\]\([^)]*\))? *\|", re.M)   # | `stem` | or | [`stem`](nbs/stem.ipynb) |
TIME = re.compile(r"^(?:(\d+) h)? *(?:(\d+) min)?$")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$\w])\$(?!\s)([^$\n]+?)(?<!\s)\$(?![\w$])", re.S)
PI = re.compile(r"\\pi(?![A-Za-z])")


def _cells(stem):
    path = NBS / f"{stem}.ipynb"
    if not path.exists():
        raise FileNotFoundError(f"the learning path names {stem}, but nbs/{stem}.ipynb does not exist")
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def _markdown(index_path):
    return "\n".join("".join(c["source"]) for c in json.loads(Path(index_path).read_text())["cells"]
                     if c["cell_type"] == "markdown")


def learning_path(index_path=INDEX):
    "The parts of the learning path in `index_path`: [(part, reading time as written, [notebook stems in order])]."
    m = SECTION.search(_markdown(index_path))
    if not m: raise ValueError(f"{index_path} has no '## Learning path' section")
    heads = list(PART.finditer(m.group(1)))
    ends = [h.start() for h in heads[1:]] + [len(m.group(1))]
    return [(h.group(1), h.group(2), ROW.findall(m.group(1)[h.end():e])) for h, e in zip(heads, ends)]


def minutes(text):
    "Minutes of a reading time written as '25 min', '2 h' or '1 h 35 min'; None if it is not one."
    m = TIME.match((text or "").strip())
    return None if not m or not any(m.groups()) else 60 * int(m.group(1) or 0) + int(m.group(2) or 0)


def fmt_minutes(n):
    "A reading time as the headings write it: '25 min', '2 h', '1 h 35 min'."
    h, m = divmod(int(n), 60)
    return " ".join(([f"{h} h"] if h else []) + ([f"{m} min"] if m or not h else []))


def notebook_minutes(stem):
    "Reading minutes of one notebook by the rule (unrounded)."
    cells = _cells(stem)
    words = sum(len(s.split()) for t, s in cells if t == "markdown")
    code = [l for t, s in cells if t == "code" for l in s.splitlines()]
    lines = sum(1 for l in code if l.strip() and not l.lstrip().startswith("#|"))
    return words / WORDS_PER_MIN + lines / LINES_PER_MIN


def part_minutes(stems):
    "Reading minutes of a part by the rule: its notebooks' minutes summed, rounded to 5 (at least 5)."
    return max(5, 5 * round(sum(notebook_minutes(s) for s in stems) / 5))


def prose_words(md):
    "Words of markdown prose: code, math, HTML tags and table rules left out."
    md = MATH.sub(" ", CODE.sub(" ", re.sub(r"<[^>]+>", " ", md)))
    return sum(1 for w in md.split() if re.search(r"[^\W_]", w))


def words_before_pi(stems):
    """Prose words a reader meets along notebooks `stems` before the first LaTeX span with `\\pi` in it.
    -> (words, (stem, cell number, the equation)); the place is None when no notebook has one."""
    total = 0
    for stem in stems:
        for i, (kind, src) in enumerate(_cells(stem)):
            if kind != "markdown": continue
            text = CODE.sub(lambda m: " " * len(m.group()), src)             # math inside code does not count
            hit = next((m for m in MATH.finditer(text) if PI.search(m.group())), None)
            if hit: return total + prose_words(src[:hit.start()]), (stem, i, " ".join(hit.group().split()))
            total += prose_words(src)
    return total, None


def write_times(index_path=INDEX):
    "Rewrite the part headings of the learning path in `index_path` with the rule's reading times. -> [(part, time)]"
    nb = json.loads(Path(index_path).read_text())
    times = {p: fmt_minutes(part_minutes(stems)) for p, _, stems in learning_path(index_path)}
    def head(m):
        part = PART.match(m.group()).group(1)
        return f"{m.group(1)}{part} ({times[part]})" if part in times else m.group()
    for c in nb["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] != "markdown" or "### " not in src: continue
        new = re.sub(r"^(### +(?:\d+\. *)?).+$", head, src, flags=re.M)
        if new != src: c["source"] = new.splitlines(keepends=True)
    Path(index_path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return list(times.items())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", choices=("path", "files"), default="path",
                    help="walk the learning path (default) or every notebook in file order")
    ap.add_argument("--index", default=str(INDEX), help="the notebook holding the learning path")
    ap.add_argument("--write", action="store_true", help="write the rule's reading times into the part headings")
    a = ap.parse_args(argv)
    try:
        parts = learning_path(a.index) if a.write or a.order == "path" else []
        if a.write:
            for p, t in write_times(a.index): print(f"{p}: {t}")
            print("now run: python tools/render_readme.py"); return 0
        stems = ([s for _, _, st in parts for s in st] if a.order == "path"
                 else sorted(p.stem for p in NBS.glob("*.ipynb") if p.stem != "index"))
        words, where = words_before_pi(stems)
    except (FileNotFoundError, ValueError) as e:
        print(f"path_words: error: {e}", file=sys.stderr); return 1
    if where: print(f"{words:,} words of prose before the first π equation, in {where[0]} (cell {where[1]}): "
                    f"{where[2][:100]}")
    else: print(f"{words:,} words of prose and no π equation along {len(stems)} notebooks")
    if a.order == "path":
        print(f"\nreading time ({WORDS_PER_MIN} words/min + {LINES_PER_MIN} code lines/min, rounded to 5 min):")
        for p, t, st in parts:
            rule = fmt_minutes(part_minutes(st))
            said = "" if t == rule else f"  (the heading says {t!r})"
            print(f"  {p}: {rule}{said}  [{len(st)} notebook{'s' * (len(st) != 1)}]")
    return 0


if __name__ == "__main__": sys.exit(main())
