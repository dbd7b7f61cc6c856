"README.md is rendered from nbs/index.ipynb; CI's command is the README's."
import subprocess, sys, re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def test_readme_matches_index_notebook():
    sys.path.insert(0, str(ROOT / "tools"))
    from render_readme import render
    assert (ROOT / "README.md").read_text() == render(), "README.md is stale: run python tools/render_readme.py"

def test_ci_runs_the_readme_test_command():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- test-command -->\s*```(?:sh|bash)?\n(.*?)\n```", text, re.S)
    assert m, "README.md lacks the marked test command"
    assert "tools/test.sh" in m.group(1) and "torch==2.13.0" in m.group(1)
    assert "README.md" in (ROOT / ".ci" / "run").read_text()

def test_every_notebook_has_a_row_in_the_readme_table():
    rows = set(re.findall(r"^\| \[?`([\w.-]+)`(?:\]\(nbs/\1\.ipynb\))? \|", (ROOT / "README.md").read_text(), re.M))
    missing = sorted(p.stem for p in (ROOT / "nbs").glob("*.ipynb") if p.stem != "index" and p.stem not in rows)
    assert not missing, f"notebooks missing from the README's table (nbs/index.ipynb): {missing}"
