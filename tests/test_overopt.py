"""The over-optimisation experiment's math and its bad-input lines: exact best-of-n KL on the enumerable toy against
the bound, the fits recovering known alpha/beta, the unbiased best-of-n estimator against brute force, the gold
labeller's Bradley-Terry probabilities, and one CLI line (status 2) for each bad input."""
import itertools, json, math

import pytest
import torch

from rlhf_nb import launch
from rlhf_nb.models import char_tokenizer, ensure_chat_ready, tiny_causal_lm
from rlhf_nb.overopt_gold import (bon_distribution, bon_estimate, bon_kl_bound, bon_kl_exact, bt_prob, fit_overopt,
                                  gold_length, gold_pairs, gold_score, overopt_form, temper, toy_bon_curve,
                                  toy_domain)
from rlhf_nb.arith import make_arith
from rlhf_nb.overopt import OveroptArgs


def test_toy_bon_kl_exact_and_bound():
    toy = toy_domain()
    assert len(toy["probs"]) == 8 ** 4 and abs(float(toy["probs"].sum()) - 1) < 1e-9
    for c in toy_bon_curve(toy, (1, 2, 4, 16, 64, 256)):
        assert c["kl"] <= c["bound"] + 1e-12                            # discrete outputs: at most the bound
        assert c["bound"] - c["kl"] < 0.02                               # and close to it with 4,096 light outcomes
    flat = torch.full((4096,), 1 / 4096, dtype=torch.float64)
    gaps = [bon_kl_bound(n) - bon_kl_exact(flat, torch.randperm(4096).double(), n) for n in (2, 4, 8, 16)]
    assert all(0 <= g < 2e-3 * n for g, n in zip(gaps, (2, 4, 8, 16)))
    # best-of-n's distribution, checked by brute force over all ordered n-tuples of a 5-outcome base
    p, r = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15], dtype=torch.float64), torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0])
    brute = torch.zeros(5, dtype=torch.float64)
    for t in itertools.product(range(5), repeat=3):
        prob = math.prod(float(p[i]) for i in t)
        best = [i for i in t if r[i] == max(r[j] for j in t)]
        for i in best: brute[i] += prob / len(best)                      # ties split uniformly among the tied draws
    assert torch.allclose(bon_distribution(p, r, 3), brute, atol=1e-12)


@pytest.mark.parametrize("form,alpha,beta", [("bon", 0.5, 0.12), ("rl", 0.8, 0.3)])
def test_fits_recover_known_coefficients(form, alpha, beta):
    kl = torch.linspace(0.02, 16, 30, dtype=torch.float64)
    gain = overopt_form(kl.sqrt(), alpha, beta, form)
    f = fit_overopt(kl, gain, form)
    assert abs(f["alpha"] - alpha) < 1e-8 and abs(f["beta"] - beta) < 1e-8
    noisy = fit_overopt(kl, gain + 0.01 * torch.randn(30, generator=torch.Generator().manual_seed(0), dtype=torch.float64), form)
    assert abs(noisy["alpha"] - alpha) < 0.05 and abs(noisy["beta"] - beta) < 0.05


def test_bon_estimator_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    proxy, gold = torch.randn(4, 8, generator=g, dtype=torch.float64), torch.rand(4, 8, generator=g, dtype=torch.float64)
    for n in range(1, 9):
        brute = sum(sum(float(gd[max(c, key=lambda k: float(px[k]))]) for c in itertools.combinations(range(8), n)) / math.comb(8, n)
                    for px, gd in zip(proxy, gold)) / 4
        assert abs(bon_estimate(proxy, gold, n) - brute) < 1e-9
    assert abs(bon_estimate(proxy, gold, 8) - float(gold.gather(-1, proxy.argmax(-1, keepdim=True)).mean())) < 1e-9


def test_gold_labeller_bradley_terry():
    assert bt_prob(1.0, 0.25, temperature=0.5) == pytest.approx(1 / (1 + math.exp(-1.5)))
    assert bt_prob(0.25, 1.0, temperature=0.5) == pytest.approx(1 - bt_prob(1.0, 0.25, temperature=0.5))
    assert bt_prob(1.0, 0.0, temperature=1e-3, noise=0.2) == pytest.approx(0.8)
    rows = make_arith(400, "train")
    answers = [[f"{r['reward_model']['ground_truth']} #### {r['reward_model']['ground_truth']}", "0 #### 1"] for r in rows]
    pairs = gold_pairs(rows, answers, gold_score, temperature=1.0, seed=3)          # gold 1.0 vs 0.0: P(correct first) = sigmoid(1)
    frac = sum(p["extra_info"]["gold_chosen"] == 1.0 for p in pairs) / len(pairs)
    assert abs(frac - 1 / (1 + math.exp(-1))) < 0.07
    assert gold_score("12 #### 12", "12") == 1.0 and gold_score("12 #### 13", "12") == 0.0


def test_gold_length_shape():
    "The default gold: concave in the answer's length with its peak at 18 characters, plus a smaller weight for correctness."
    g = {n: gold_length("9" * n, 81) for n in range(4, 30)}
    assert max(g, key=g.get) == 18 and g[18] == pytest.approx(0.75)
    assert g[12] == g[24] == 0 and g[15] == g[21] == pytest.approx(0.75 * 0.75)     # zero 6 away, symmetric
    rise = [g[n + 1] - g[n] for n in range(12, 24)]
    assert all(a > b for a, b in zip(rise, rise[1:]))                              # concave: every step smaller
    assert gold_length("81 ############ 81", "81") == 1.0 and gold_length("81 ###### 81", "81") == pytest.approx(0.25)
    assert gold_length("81 ############ 82", "81") == pytest.approx(0.75)          # length alone without the right number
    assert OveroptArgs().gold == "rlhf_nb.overopt_gold:gold_length" and OveroptArgs().start_temperature == 2.0


def test_temper_divides_logits():
    tok = ensure_chat_ready(char_tokenizer(), verbose=False)
    lm = tiny_causal_lm(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    ids = torch.tensor([[5, 6, 7, 8]])
    before = lm(ids).logits
    assert torch.allclose(temper(lm, 2.5)(ids).logits, before / 2.5, atol=1e-5)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    "A tiny untrained policy saved as a folder, so no test builds the SFT warm start."
    out = tmp_path_factory.mktemp("policy")
    tok = ensure_chat_ready(char_tokenizer(), verbose=False)
    tiny_causal_lm(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _cli(capsys, *args):
    rc = launch._main(["overopt", *map(str, args)])
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("rlhf-nb overopt")]
    return rc, err


def _pairs(tmp_path, rows):
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


ROW = {"data_source": "arith", "prompt": [{"role": "user", "content": "Q: 1+2="}], "ability": "math",
       "reward_model": {"style": "model", "ground_truth": "3"}, "extra_info": {"split": "train", "index": 0}}


@pytest.mark.parametrize("case,needle", [
    ("pool", "n=64 is larger than the pool (8 samples per prompt)"),
    ("nan", "returned nan"),
    ("missing", "rejected"),
    ("equal", "chosen and rejected are the same answer"),
    ("exists", "holds an earlier run's overopt.json"),
    ("layers", "--rm_layers 3: the policy has 1 layer(s)"),
])
def test_bad_input_one_line(case, needle, capsys, tmp_path, policy_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    base = ["--policy_dir", policy_dir, "--output_dir", tmp_path / "out", "--n_prompts", 10, "--eval_prompts", 8, "--pool", 8,
            "--bon_ns", "1,2", "--rm_layers", ""]
    extra = {"pool": ["--bon_ns", "1,64"], "nan": ["--gold", "_overopt_gold:nan_gold"], "layers": ["--rm_layers", "3"],
             "missing": ["--pairs", _pairs(tmp_path, [{**ROW, "chosen": "3 #### 3"}])],
             "equal": ["--pairs", _pairs(tmp_path, [{**ROW, "chosen": "3 #### 3", "rejected": "3 #### 3"}])], "exists": []}[case]
    if case == "exists": (tmp_path / "out").mkdir(); (tmp_path / "out" / "overopt.json").write_text("{}")
    rc, err = _cli(capsys, *base, *extra)
    assert rc == 2 and len(err) == 1 and needle in err[0], (rc, err)
    if case != "exists": assert not (tmp_path / "out" / "overopt.json").exists()             # nothing written
    else: assert (tmp_path / "out" / "overopt.json").read_text() == "{}"                 # the earlier run's file is kept


def test_prep_arith_gold_labels_with_the_experiments_gold(policy_dir, monkeypatch):
    "`rlhf-nb prep arith-gold` writes pairs labelled by the experiment's gold (gold_length unless --gold names another)."
    from rlhf_nb.overopt_gold import prep_gold_pairs
    sp = prep_gold_pairs(n_train=30, n_test=10, policy_dir=policy_dir)
    rows = sp["train"] + sp["test"]
    assert rows and all(r["chosen"] != r["rejected"] for r in rows)
    for r in rows:
        t, x = r["reward_model"]["ground_truth"], r["extra_info"]
        assert x["gold_chosen"] == pytest.approx(gold_length(r["chosen"], t))
        assert x["gold_rejected"] == pytest.approx(gold_length(r["rejected"], t))
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    sc = prep_gold_pairs(n_train=30, n_test=10, policy_dir=policy_dir, gold="_overopt_gold:short_gold")["train"]
    assert sc and all(r["extra_info"]["gold_chosen"] == -len(r["chosen"]) for r in sc)
    with pytest.raises(ValueError, match="--gold"): prep_gold_pairs(n_train=3, n_test=3, policy_dir=policy_dir, gold="nope:x")


def test_overopt_end_to_end_on_a_tiny_policy(tmp_path):
    "The whole command on a tiny 2-layer policy: the three files, the issue's schema, and one PPO curve per proxy."
    pol = tmp_path / "policy"
    tok = ensure_chat_ready(char_tokenizer(), verbose=False)
    tiny_causal_lm(tok, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2).save_pretrained(pol)
    tok.save_pretrained(pol)
    out = tmp_path / "out"
    rc = launch._main(["overopt", "--policy_dir", str(pol), "--output_dir", str(out), "--n_prompts", "40", "--rm_pairs", "20,5",
                       "--rm_layers", "1", "--rm_steps", "2", "--rl_algos", "ppo,grpo", "--rl_steps", "2", "--eval_every", "1",
                       "--eval_prompts", "8", "--dpo_betas", "0.1", "--ipo", "false", "--dpo_steps", "2", "--pool", "4",
                       "--bon_ns", "1,2,4"])
    assert rc == 0 and all((out / f"overopt.{e}").exists() for e in ("json", "md", "png"))
    res = json.loads((out / "overopt.json").read_text())
    assert [p["name"] for p in res["proxies"]] == ["rm20", "rm5", "rm20_L1"] and res["proxies"][2]["layers"] == 1
    assert {(p["algo"], p["rm"]) for p in res["rl"]} == {("ppo", "rm20"), ("grpo", "rm20"), ("ppo", "rm5"), ("ppo", "rm20_L1")}
    assert all(set(p) >= {"algo", "step", "kl", "proxy", "gold"} for p in res["rl"])
    assert [b["n"] for b in res["bon"]] == [1, 2, 4] and all(set(b) >= {"n", "kl", "proxy", "gold"} for b in res["bon"])
    assert [(d["algo"], d["beta"]) for d in res["dpo"]] == [("dpo", 0.1)] and set(res["dpo"][0]) >= {"kl", "proxy", "gold"}
    assert set(res["fits"]) >= {"bon", "rl"} and set(res["fits"]["bon"]) == {"alpha", "beta"}
    assert set(res["fits"]["rl_by_proxy"]) == {"rm20", "rm5", "rm20_L1"}
    t = res["targets"]
    assert t["bon_kl_under_bound"] and set(t["peak_reached"]) == {"rm20", "rm5", "rm20_L1"}
    assert "rm20_L1_drop_from_peak" in t and "rm5_proxy_rise" in t
