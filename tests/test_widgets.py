"""The widgets in a plain Python process (no Jupyter kernel): the rollout browser follows its slider, and the training
monitor redraws while a real run writes metrics.jsonl in another process, then stops when the run finishes."""
import json, os, subprocess, sys, time

import torch

from rlhf_nb.models import char_tokenizer
from rlhf_nb.widgets import reward_playground, rollout_browser, token_spans, training_monitor


def step_data(tok, pairs, scores):
    ids = [(tok(p, add_special_tokens=False)["input_ids"], tok(r, add_special_tokens=False)["input_ids"]) for p, r in pairs]
    P, R = max(len(p) for p, _ in ids), max(len(r) for _, r in ids)
    d = {k: torch.zeros(len(ids), n, dtype=torch.long) for k, n in (("prompts", P), ("prompt_mask", P), ("responses", R), ("response_mask", R))}
    for b, (p, r) in enumerate(ids):
        d["prompts"][b, P - len(p):], d["prompt_mask"][b, P - len(p):] = torch.tensor(p), 1
        d["responses"][b, :len(r)], d["response_mask"][b, :len(r)] = torch.tensor(r), 1
    mask, s = d["response_mask"].float(), torch.tensor(scores)
    d["token_level_scores"] = torch.zeros_like(mask).scatter(1, (mask.sum(-1).long() - 1)[:, None], s[:, None])
    d["advantages"] = (s - s.mean())[:, None] * mask
    return d


def test_rollout_browser_outside_jupyter():
    tok = char_tokenizer()
    data = step_data(tok, [("1+1=", "2 #### 2"), ("2+2=", "5 #### 5"), ("3+3=", "6 #### 6")], [1.0, 0.0, 1.0])
    b = rollout_browser(data, tok)
    assert "2 #### 2" in b.summary.value
    b.slider.value = 1
    assert "5 #### 5" in b.summary.value and b.tokens.value == token_spans(data, tok, 1, b.scale)
    assert "rgba(210,50,50" in b.tokens.value                                  # below-average score: red tokens


def test_training_monitor_follows_a_running_cli_run(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "rlhf_nb.launch", "grpo", "--max_steps", "6", "--per_device_train_batch_size", "2",
                             "--num_generations", "2", "--max_completion_length", "4", "--arith_train_size", "16", "--eval_steps", "0",
                             "--output_dir", "run"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mon = training_monitor(tmp_path / "run", interval=0.05)
    seen = set()
    while proc.poll() is None:
        seen.add(mon.rows); time.sleep(0.05)
    assert proc.returncode == 0, proc.stderr.read()[-2000:]
    mon._thread.join(30)
    assert not mon._thread.is_alive() and mon.rows == 6 and "step 6" in mon.status.value
    assert mon.image.value[:4] == b"\x89PNG" and mon.redraws >= 2 and len(seen) >= 2   # redrawn while the run was writing


def test_reward_playground_outside_jupyter():
    pg = reward_playground("#### 18", "18", "openai/gsm8k")
    src_w, truth_w, comp_w, out_w = pg.children
    assert pg.explanation["score"] == 1.0 and "score 1" in out_w.value
    comp_w.value = "It is 17, or maybe 18"                       # strict reads no '####'...
    assert pg.explanation["score"] == 0.0
    src_w.value = "gsm8k_flexible"                                # ...flexible reads the hedge's last number
    assert pg.explanation["score"] == 1.0 and pg.explanation["extracted"] == "18"
