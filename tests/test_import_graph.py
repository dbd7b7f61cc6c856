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


# The layer table: the house as the design draws it. A module imports only modules of its own layer or a lower one,
# and only modules whose notebook comes earlier in reading order (notebook file names sort in dependency order), so a
# reader meets every module before the modules that use it. A new module must be given a layer here.
LAYERS = {
    "config": 1, "options": 1, "core": 1, "chunked_head": 1,                                               # foundations: options, tensor math
    "data": 2, "arith": 2, "prep": 2, "dataset": 2, "models": 2, "packing": 2,                # rows, datasets, tokenizers and models
    "files": 3, "tracking": 3, "checkpoints": 3, "dist": 3, "engine": 3,        # the run folder every trainer shares
    "equivalence": 4, "rewards": 4, "reward_model": 4, "sft": 4, "evaluate": 4,                # rewards and the supervised warm start
    "speed": 5, "sharding": 5, "workers": 5, "placement": 5, "rollout": 5, "rollout_corr": 5, "routing_replay": 5, "rollout_server": 5, "async_rl": 5, "agents": 5, "environments": 5, "endpoint": 5, "nodes": 5,        # roles, samplers and where they run
    "rl_config": 6, "ppo": 6, "fast": 6, "algos": 6, "distill": 6,                            # the RL trainer and its speed paths
    "dpo": 7, "trl_pipelines": 7,                                               # preference training, TRL's trainers
    "demo": 8, "health": 8, "launch": 8, "golden": 8, "widgets": 8, "tinker_api": 8, "serve_guard": 8, "tinker_serve": 8,   # entry points and tools
    "overopt_gold": 8, "overopt": 8,                                            # the over-optimisation experiment
}


def notebook_of(module):
    "The notebook a module is exported from, read from the header nbdev writes."
    import re
    hit = re.search(r"\.\./nbs/([\w.-]+\.ipynb)", (PKG / f"{module}.py").read_text()[:2000])
    return hit.group(1) if hit else None


def test_every_module_has_a_layer():
    missing = sorted(m for m in import_graph() if m not in LAYERS)
    assert not missing, f"modules without a layer in LAYERS (tests/test_import_graph.py): {missing}"


def test_imports_go_down_the_layers():
    bad = [f"{m} (layer {LAYERS[m]}) imports {d} (layer {LAYERS[d]})" for m, (top, _) in import_graph().items()
           for d in sorted(top) if d in LAYERS and m in LAYERS and LAYERS[d] > LAYERS[m]]
    assert not bad, "imports of a higher layer:\n" + "\n".join(bad)


def test_notebooks_are_in_dependency_order():
    "Every module's notebook sorts before the notebooks of the modules that import it."
    graph = import_graph()
    bad = [f"{m} ({notebook_of(m)}) imports {d} ({notebook_of(d)})" for m, (top, _) in graph.items() for d in sorted(top)
           if d in graph and notebook_of(m) and notebook_of(d) and notebook_of(d) > notebook_of(m)]
    assert not bad, "a module imports one taught in a later notebook:\n" + "\n".join(bad)
