"""Every module imports on its own and works with only what it exports (no hidden notebook state).

Each module is imported in a fresh child process, so a name that a notebook defined in a non-exported cell and an
exported cell then used shows up here as a NameError rather than in a user's program. The children are forked from
one runner that has loaded the third-party libraries alone (torch, transformers, ...; no rlhf_nb module): each child
starts with no rlhf_nb module loaded, exactly as a fresh interpreter does, without paying ~3 s of library imports 40
times. A check about what a module pulls in (FRESH) runs in a fresh interpreter of its own instead."""
import json, subprocess, sys, textwrap
import pytest

CHECKS = {
    "rlhf_nb.chunked_head": "import torch; h = torch.nn.Linear(4, 7); lp, e = m.lm_head_logprobs(torch.zeros(2, 4), h, torch.tensor([1, 2]), chunk_size=1); assert lp.shape == (2,) and torch.allclose(e, torch.log(torch.tensor(7.0)).expand(2), atol=0.7)",
    "rlhf_nb.data": "assert m.validate_rows([{'data_source': 'x', 'prompt': [{'role': 'user', 'content': 'hi'}], 'ability': 'a', 'reward_model': {'style': 'rule', 'ground_truth': '1'}, 'extra_info': {}}]) and m.gsm8k_ground_truth('so #### 1,600') == '1600'",
    "rlhf_nb.arith": "rows = m.make_arith(4, seed=1); assert len(rows) == 4 and rows[0]['data_source'] == 'arith'",
    "rlhf_nb.prep": "assert m.select_split({'train': list(range(10))}, 'train[:3]') == [0, 1, 2] and len(m.load_split('arith', 'test', n=5)) == 5",
    "rlhf_nb.dataset": "import torch; b = m.collate_fn([{'input_ids': [5, 6]}, {'input_ids': [7]}], 0); assert b['input_ids'].tolist() == [[5, 6], [0, 7]]",
    "rlhf_nb.packing": "import torch; assert m.first_fit_bins([3, 2, 1], 3) == [[0], [1, 2]] and m.padding_fraction(torch.ones(2, 3)) == 0",
    "rlhf_nb.models": "tok = m.char_tokenizer(); assert tok.pad_token is not None and tok.chat_template",
    "rlhf_nb.rollout_corr": "import torch; w = m.geometric_mask_is(torch.zeros(1, 3), torch.full((1, 3), 0.5), torch.ones(1, 3), cap=2.0); assert w.sum() == 3 and m.kept_set_mask(torch.tensor([[2.0, 1.0, -5.0]]), top_k=2).tolist() == [[True, True, False]]",
    "rlhf_nb.routing_replay": "from rlhf_nb.models import char_tokenizer; mo = m.tiny_moe_causal_lm(char_tokenizer()); assert [n for n, _ in m.moe_routers(mo)] == ['model.layers.0.mlp.gate', 'model.layers.1.mlp.gate']",
    "rlhf_nb.rollout": "b = m.completions_to_batch([[5, 6], [7]], [m.Completion([9, 2], [-0.5, -0.1], 'stop'), m.Completion([4], [-1.0], 'length')], 2, 0); assert m.prompt_lists(b['prompts'], b['prompt_mask']) == [[5, 6], [7]] and m.RolloutArgs(rollout_engine='vllm').importance_sampling_mode == 'token_truncate'",
    "rlhf_nb.rollout_server": "assert m.ServerLimits().max_request_samples == 1024 and m.exposure_warning('127.0.0.1', 1, None) is None",
    "rlhf_nb.rewards": "assert m.compute_score('arith', '12 #### 12', '12') == 1.0",
    "rlhf_nb.equivalence": "import sys; assert m.guarded_verify('0.5', r'\\frac12', isolation='process') == (True, 'ok') and 'torch' not in sys.modules",
    "rlhf_nb.reward_model": "import torch; assert m.bradley_terry_loss(torch.zeros(2), torch.zeros(2)).item() > 0.69 and m.RMArgs().output_dir",
    "rlhf_nb.core": "import torch; x = torch.tensor([[-1.0, -2.0]]); assert torch.allclose(m.kl_penalty(x, x, 'k3'), torch.zeros_like(x)); assert m.group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2).shape == (4,)",
    "rlhf_nb.config": "assert m.option(1, 'help').metadata['help'] == 'help'",
    "rlhf_nb.files": "assert m.human_bytes(2048) == '2.0 KB' and m.distributed_world() == 1",
    "rlhf_nb.tracking": "assert m.trl_names({'step': 1, 'kl/mean': 0.5}) == {'objective/kl': 0.5}",
    "rlhf_nb.checkpoints": "import tempfile; assert m.list_checkpoints(tempfile.mkdtemp()) == []",
    "rlhf_nb.dist": "assert m.merge_rank_metrics([{'a/max': 1.0}, {'a/max': 2.0}]) == {'a/max': 2.0}",
    "rlhf_nb.engine": "assert m.TimeBudget(None).spent() is False and m.TimeBudget(0).spent() is True",
    "rlhf_nb.dpo": "assert m.DPOConfig(beta=0.2).beta == 0.2",
    "rlhf_nb.distill": "import torch; s, t, k = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2); assert torch.equal(m.reverse_kl_advantages(s, t, k), torch.tensor([[-0.5, 1.0]])) and m.distill_trainer_class(m.DistillConfig(teacher_model_name_or_path='tiny')).__name__ == 'FastDistillTrainer'",
    "rlhf_nb.algos": "assert m.GRPOConfig().num_generations > 1",
    "rlhf_nb.trl_pipelines": "assert callable(m.trl_pipeline)",
    "rlhf_nb.demo": "assert ('tiny', 'grpo') in m.DEMO_PRESETS",
    "rlhf_nb.launch": "assert m.main(['--help']) == 0",
    "rlhf_nb.agents": "assert m.parse_hermes('<tool_call>{\"name\": \"calculate\", \"arguments\": {\"expression\": \"2*3\"}}</tool_call>')[0][\"name\"] == \"calculate\" and m.safe_eval(\"12*34\") == 408",
    "rlhf_nb.endpoint": "assert m.split_route('/sessions/s1/v1/chat/completions') == ('s1', '/v1/chat/completions') and m.check_sampling({'model': m.SERVED_MODEL, 'max_tokens': 4}, None) == 4",
    "rlhf_nb.nodes": "assert m.phase_table([]) == {} and m.PHASE_NAMES['role_update'] == 'update'",
    "rlhf_nb.environments": "assert [n for n, _ in m.parse_tasks('chain_sum,spell_backward')] == ['chain_sum', 'spell_backward'] and m.observation_text({'hint': 'higher'}) == 'higher'",
    "rlhf_nb.async_rl": "assert [m.sampling_version(j, 1) for j in (1, 2, 3)] == [0, 0, 1] and m.batch_params(type('A', (), dict(max_completion_length=4, temperature=1.0, top_k=0, top_p=1.0, seed=0))(), 2).seed == 2",
    "rlhf_nb.placement": "assert m.ResourcePoolManager({'p': 1}, {'ActorRolloutRef': 'p'}).pool_of(m.Role.RefPolicy) == 'p'",
    "rlhf_nb.widgets": "import tempfile; mon = m.TrainingMonitor(tempfile.mkdtemp()); assert mon.refresh() is False and mon.rows == 0",
    "rlhf_nb.health": "assert m.kl_spike([{'step': s, 'kl/mean': 100.0 if s == 9 else 0.1} for s in range(1, 12)])[0]['step'] == 9",
    "rlhf_nb.golden": "assert 'grpo' in m.GOLDEN_NAMES and m.compare_curves([{'step': 1, 'a': 1.0}], [{'step': 1, 'a': 1.0}]) == []",
    "rlhf_nb.sft": "assert callable(m.greedy_accuracy) and callable(m.sft_train)",
    "rlhf_nb.evaluate": "assert m.pass_at_k(4, 1, 1) == 0.25 and m.maj_at_k([1, 1, 2], [1, 1, 0], 3) == 1.0",
    "rlhf_nb.ppo": "assert callable(m.RLTrainer) and m.PPOConfig().kl_coef >= 0",
    "rlhf_nb.workers": "assert m.Role.ActorRollout.name == 'ActorRollout' and m.Role.RefPolicy.name == 'RefPolicy'",
    "rlhf_nb.sharding": "from rlhf_nb.workers import Role; assert m.FSDP_ROLE_WORKERS[Role.Critic].__name__ == 'FSDPCriticWorker'",
    "rlhf_nb.rl_config": "assert m.resolve_critic(m.PPOConfig()) == 'separate' and m.GRPOConfig().num_generations == 8",
    "rlhf_nb.options": "assert m.RolloutArgs(rollout_engine='vllm').importance_sampling_mode == 'token_truncate'",
    "rlhf_nb.speed": "import torch; from rlhf_nb.core import logprobs_from_logits; x, y = torch.randn(2, 3, 5), torch.randint(0, 5, (2, 3)); assert torch.allclose(m.chunked_logprobs(x, y), logprobs_from_logits(x, y), atol=1e-6)",
    "rlhf_nb.fast": "import rlhf_nb.ppo as p; assert issubclass(m.FastRLTrainer, p.RLTrainer)",
    "rlhf_nb.overopt_gold": "assert m.gold_score('12 #### 12', '12') == 1.0 and abs(m.bon_kl_bound(2) - (__import__('math').log(2) - 0.5)) < 1e-12",
    "rlhf_nb.overopt": "assert m.quick_args(m.OveroptArgs(quick=True)).rl_steps == m.QUICK['rl_steps'] and m.check_args(m.OveroptArgs())['bon_ns'][-1] == 64",
    "rlhf_nb.tinker_api": "d = m.types.Datum(model_input=m.types.ModelInput.from_ints([1, 2]), loss_fn_inputs={'target_tokens': [2, 3]}); assert len(m.check_data([d], 'cross_entropy')[1]) == 1",
    "rlhf_nb.serve_guard": "assert m.host_of('[::1]:80') == '::1' and m.exposure_warning('s', '127.0.0.1') is None and m.Gate().admit({'host': 'localhost'}) == ''",
    "rlhf_nb.tinker_serve": "import numpy as np; from rlhf_nb.tinker_api import SDK_TYPES; assert callable(m.serve_main) and (not SDK_TYPES or m.TinkerServer(root=__import__('tempfile').mkdtemp()).handle('client/config', {})[0] == 200)",
}

FRESH = {"rlhf_nb.equivalence"}        # its check asserts that importing it loads no torch: a preloaded runner would fail it
PRELOAD = ["numpy", "torch", "yaml", "tokenizers", "transformers", "datasets", "accelerate", "peft", "trl", "ray"]
RUNNER = textwrap.dedent(r"""
    import importlib, json, os, sys, time, traceback
    for name in PRELOAD:                            # third-party only: no rlhf_nb module may be loaded before the fork
        try: importlib.import_module(name)
        except ImportError: pass
    assert not [k for k in sys.modules if k.startswith("rlhf_nb")]
    results = {}
    for mod, check in CHECKS.items():
        out = os.path.join(OUT, mod)
        pid = os.fork()
        if pid == 0:                                # the child: import the module alone, run its check, report
            status = 1
            try:
                exec(f"import importlib; m = importlib.import_module({mod!r})\n{check}\n", {"__name__": "__main__"})
                status, text = 0, ""
            except BaseException:
                text = traceback.format_exc()
            with open(out, "w") as f: f.write(text)
            os._exit(status)
        deadline = time.monotonic() + 240           # a bound on a hang only
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done: break
            if time.monotonic() > deadline: os.kill(pid, 9); os.waitpid(pid, 0); status = -1; break
            time.sleep(0.01)
        text = open(out).read() if os.path.exists(out) else "no report (killed after 240 s)"
        results[mod] = [os.waitstatus_to_exitcode(status) if status != -1 else -1, text[-2000:]]
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def forked_results(tmp_path_factory):
    "{module: [exit status, traceback]} from one runner that forks a child per module (all but FRESH)."
    checks = {k: v for k, v in CHECKS.items() if k not in FRESH}
    code = f"PRELOAD = {PRELOAD!r}\nCHECKS = {checks!r}\nOUT = {str(tmp_path_factory.mktemp('imports'))!r}\n" + RUNNER
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.parametrize("mod,check", list(CHECKS.items()))
def test_module_imports_alone(mod, check, request):
    if mod in FRESH:
        code = f"import importlib; m = importlib.import_module({mod!r})\n{check}\n"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, f"{mod}: {r.stderr[-2000:]}"
        return
    status, text = request.getfixturevalue("forked_results")[mod]
    assert status == 0, f"{mod}: {text}"


def test_a_forked_child_catches_a_name_from_a_non_exported_cell(tmp_path):
    "The runner catches what a fresh interpreter catches: a module using a name only a notebook cell defined fails."
    (tmp_path / "leaky.py").write_text("def f(): return helper_from_a_notebook_cell() + 1\n")
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r})\nPRELOAD = ['numpy']\n"
            f"CHECKS = {{'leaky': 'assert m.f() == 2'}}\nOUT = {str(tmp_path)!r}\n" + RUNNER.replace(
                'assert not [k for k in sys.modules if k.startswith("rlhf_nb")]', ''))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    status, text = json.loads(r.stdout.splitlines()[-1])["leaky"]
    assert status == 1 and "NameError" in text and "helper_from_a_notebook_cell" in text, text


def test_every_module_has_a_check():
    "A new module gets its line in CHECKS, so its exported cells are imported alone too."
    from pathlib import Path
    pkg = Path(__file__).resolve().parents[1] / "rlhf_nb"
    mods = {f"rlhf_nb.{p.stem}" for p in pkg.glob("*.py") if not p.stem.startswith("_")}
    assert mods <= set(CHECKS), f"modules without a check in CHECKS: {sorted(mods - set(CHECKS))}"
