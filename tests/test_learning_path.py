"""The learning path of nbs/index.ipynb (tools/path_words.py reads it): every notebook in exactly one part, every part
with a reading time by the rule, and little prose before the first equation with a policy π in it. No notebook runs."""
import json, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import path_words as pw

PARTS = pw.learning_path()
STEMS = [s for _, _, stems in PARTS for s in stems]
MAX_WORDS_BEFORE_PI = 2000


def test_the_path_has_parts_and_each_part_notebooks():
    assert len(PARTS) >= 5, PARTS
    assert PARTS[0][0].lower().startswith("start here") and PARTS[0][2][0] == "start_here", PARTS[0]
    assert all(stems for _, _, stems in PARTS), [p for p, _, stems in PARTS if not stems]


def test_every_notebook_the_path_names_exists():
    missing = [s for s in STEMS if not (ROOT / "nbs" / f"{s}.ipynb").exists()]
    assert not missing, f"the learning path of nbs/index.ipynb names notebooks that do not exist: {missing}"


def test_every_notebook_is_in_exactly_one_part():
    on_disk = {p.stem for p in (ROOT / "nbs").glob("*.ipynb")} - {"index"}
    twice = sorted({s for s in STEMS if STEMS.count(s) > 1})
    assert not twice, f"notebooks in more than one place of the learning path: {twice}"
    assert not on_disk - set(STEMS), f"notebooks with no part in the learning path: {sorted(on_disk - set(STEMS))}"


def test_each_part_has_the_rules_reading_time():
    "Each heading states a reading time, and it is the rule's (within a fifth: small notebook edits need no rewrite)."
    for part, written, stems in PARTS:
        assert pw.minutes(written), f"part {part!r} states no reading time like '(25 min)' or '(1 h 5 min)': {written!r}"
        rule = pw.part_minutes(stems)
        assert abs(pw.minutes(written) - rule) <= max(5, rule / 5), (
            f"part {part!r} says {written}, the rule gives {pw.fmt_minutes(rule)}: "
            "run python tools/path_words.py --write && python tools/render_readme.py")


def test_reading_time_rule_by_hand(tmp_path, monkeypatch):
    "400 words of markdown (2 min) and 30 code lines (3 min; directives and blank lines not counted) read in 5 min."
    cell = lambda kind, src: {"cell_type": kind, "source": src, "metadata": {}}
    nb = {"cells": [cell("markdown", "word " * 400), cell("code", "#| export\n" + "x = 1\n\n" * 30)]}
    (tmp_path / "toy.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(pw, "NBS", tmp_path)
    assert pw.notebook_minutes("toy") == pytest.approx(5.0)
    assert pw.part_minutes(["toy"]) == 5 and pw.fmt_minutes(65) == "1 h 5 min" and pw.minutes("1 h 5 min") == 65
    with pytest.raises(FileNotFoundError, match="nbs/gone.ipynb does not exist"): pw.notebook_minutes("gone")


def test_prose_words_stop_at_the_first_pi_equation(tmp_path, monkeypatch):
    cell = lambda src: {"cell_type": "markdown", "source": src, "metadata": {}}
    a = {"cells": [cell("One two three `code \\pi` $x^2$ four."), cell("```\n$\\pi$ in a fence\n```\nfive six")]}
    b = {"cells": [cell("seven eight $\\pi_\\theta(y)$ nine ten"), cell("eleven")]}
    for name, nb in (("a", a), ("b", b)): (tmp_path / f"{name}.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(pw, "NBS", tmp_path)
    assert pw.words_before_pi(["a", "b"]) == (8, ("b", 0, "$\\pi_\\theta(y)$"))
    assert pw.words_before_pi(["a"]) == (6, None)


def test_little_prose_before_the_first_pi_equation_along_the_path():
    words, where = pw.words_before_pi(STEMS)
    assert where, "no notebook on the learning path writes an equation with a policy \\pi"
    assert words <= MAX_WORDS_BEFORE_PI, (f"{words} words of prose before the first equation with \\pi "
                                          f"({where[0]}, cell {where[1]}); at most {MAX_WORDS_BEFORE_PI}")
