"""The package is a layered house: each module imports only modules below it, at the top of the file.

A cycle, or an import of the package's own modules inside a function (the usual way a cycle is hidden), fails here.
Lazy imports stay allowed for heavy optional dependencies (trl, peft, matplotlib, ray, wandb, ...), which are not
package modules."""
import ast, subprocess, sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "rlhf_nb"


def _own(node, module):
    "Names of rlhf_nb modules that an import node brings in (absolute `rlhf_nb.x` or relative `.x`)."
    out = []
    if isinstance(node, ast.Import):
        out = [a.name.split(".")[1] for a in node.names if a.name.startswith("rlhf_nb.")]
        out += ["__init__" for a in node.names if a.name == "rlhf_nb"]
    elif isinstance(node, ast.ImportFrom):
        mod = node.module or ""
        if node.level == 1: out = [mod.split(".")[0]] if mod else [a.name for a in node.names]
        elif mod == "rlhf_nb": out = [a.name for a in node.names]
        elif mod.startswith("rlhf_nb."): out = [mod.split(".")[1]]
    return [m for m in out if m != module]


def import_graph():
    "{module: (top-level imports of own modules, [(line, module) of imports inside functions or classes])}"
    graph = {}
    for f in sorted(PKG.glob("*.py")):
        if f.stem in ("__init__", "_modidx"): continue
        tree = ast.parse(f.read_text())
        top = {m for n in tree.body for m in _own(n, f.stem)}
        nested = [(n.lineno, m) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and n not in tree.body
                  for m in _own(n, f.stem)]
        graph[f.stem] = (top, nested)
    return graph


def find_cycle(edges):
    "One cycle of the directed graph {node: set(successors)} as a list of nodes, or None."
    state, stack = {}, []
    def visit(n):
        state[n] = 1; stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1: return stack[stack.index(m):] + [m]
            if state.get(m) is None and (c := visit(m)): return c
        state[n] = 2; stack.pop()
    for n in sorted(edges):
        if state.get(n) is None and (c := visit(n)): return c


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle({m: top for m, (top, _) in graph.items()})
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_function_local_import_of_own_modules():
    bad = [f"rlhf_nb/{m}.py:{line} imports rlhf_nb.{dep}" for m, (_, nested) in import_graph().items() for line, dep in nested]
    assert not bad, "imports of the package's own modules inside functions:\n" + "\n".join(bad)


def test_core_alone_registers_every_estimator_and_loss():
    code = ("import sys, rlhf_nb.core as c; "
            "assert not [m for m in sys.modules if m.startswith('rlhf_nb.') and m != 'rlhf_nb.core'], sorted(sys.modules); "
            "print(sorted(c.ADV_ESTIMATORS), sorted(c.POLICY_LOSSES))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    est, losses = r.stdout.strip().split("] [")
    for name in ("gae", "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"): assert f"'{name}'" in est
    for name in ("vanilla", "dual_clip", "gspo", "cispo"): assert f"'{name}'" in losses
