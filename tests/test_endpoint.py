"""The OpenAI-compatible endpoint for black-box agents (`rlhf_nb.endpoint`, taught in nbs/01fw_agent_endpoint.ipynb):
episodes played by agents that use the `openai` SDK, the ids the trainer trains on, every refusal in one line, and two
GRPO steps from the CLI with `--agent_function`."""
import json

import pytest
import torch

openai = pytest.importorskip("openai")

from rlhf_nb import launch
from rlhf_nb.agents import render_ids
from rlhf_nb.arith import make_calc
from rlhf_nb.endpoint import AgentEndpoint, CALC_TOOLS
from rlhf_nb.models import char_tokenizer, tiny_causal_lm
from rlhf_nb.rollout import Completion, HFEngine, RolloutEngine, SamplingParams

torch.set_num_threads(1)
TOK = char_tokenizer()
ROWS = make_calc(2, "train", seed=5)


def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)


def play(agent, engine=None, rows=ROWS, max_len=200, params=SamplingParams(200, seed=3)):
    "Run `agent` on `rows` through a fresh endpoint; -> (trajectories, episodes)."
    with AgentEndpoint(TOK, agent, SamplingParams(max_len)) as ep:
        trajs = ep.run(engine or FixedEngine(), rows, params, max_len)
        return trajs, ep.last_episodes


class FixedEngine(RolloutEngine):
    "Answers every prompt with `text` + eos (log-prob -1 per token)."
    def __init__(self, text="#### 1"): super().__init__(TOK.eos_token_id, TOK.pad_token_id); self.text = text
    def generate(self, prompts, params):
        ids = TOK(self.text, add_special_tokens=False)["input_ids"][:params.max_tokens - 1] + [TOK.eos_token_id]
        return [Completion(ids, [-1.0] * len(ids), "stop", 0) for _ in prompts]


def three_turn_agent(seen):
    "A scripted agent: three turns, each answered with a fixed user message; keeps what the SDK returned."
    def agent(base_url, row):
        c, msgs = client(base_url), [dict(m) for m in row["prompt"]]
        for k in range(3):
            ch = c.chat.completions.create(model="policy", messages=msgs, tools=CALC_TOOLS, logprobs=True, max_tokens=12).choices[0]
            seen.setdefault(row["extra_info"]["index"], []).append(
                (ch.model_extra["token_ids"], [t.logprob for t in ch.logprobs.content]))
            msgs += [{"role": "assistant", "content": ch.message.content}, {"role": "user", "content": f"go on {k}"}]
        seen[("messages", row["extra_info"]["index"])] = msgs
        return 0.5
    return agent


def test_episode_through_the_sdk_trains_on_the_sampled_ids():
    seen, policy = {}, tiny_causal_lm(TOK, seed=0)
    with AgentEndpoint(TOK, three_turn_agent(seen), SamplingParams(200)) as ep:
        batch = {"input_ids": torch.zeros(2, 1, dtype=torch.long), **{k: [r[k] for r in ROWS] for k in ROWS[0]}}
        out = ep.generate_batch(HFEngine(policy, TOK.eos_token_id, TOK.pad_token_id), batch, SamplingParams(200, seed=1))
    for i in range(2):
        m = out["response_mask"][i].bool()
        turns = seen[i]
        assert len(turns) == 3
        assert out["responses"][i][m].tolist() == [t for ids, _ in turns for t in ids]        # training ids = sampled ids
        got, want = out["rollout_log_probs"][i][m], torch.tensor([x for _, lps in turns for x in lps])
        assert torch.allclose(got, want)
        assert out["rollout_log_probs"][i][~m].abs().sum() == 0
        assert (out["attention_mask"][i][out["prompts"].shape[1]:].bool() & ~m).any()       # the agent's tokens: read, no loss
    assert [e["agent_reward"] for e in out["extra_info"]] == [0.5, 0.5] and out["data_source"] == ["agent_function"] * 2
    assert all(0 < len(ids) <= 12 for i in range(2) for ids, _ in seen[i])                   # max_tokens honoured
    assert out["rollout_metrics"]["num_turns/mean"] == 3 and out["rollout_metrics"]["agent/failures"] == 0


def test_an_edited_conversation_is_refused_and_the_ids_stay_the_sampled_ones():
    said = {}
    def editing(base_url, row):
        c, msgs = client(base_url), [dict(m) for m in row["prompt"]]
        a = c.chat.completions.create(model="policy", messages=msgs).choices[0]
        said["ids"] = a.model_extra["token_ids"]
        msgs += [{"role": "assistant", "content": a.message.content}, {"role": "user", "content": "and?"}]
        c.chat.completions.create(model="policy", messages=msgs)                             # accepted: it extends
        msgs[1]["content"] = "#### 2"                                                          # the agent edits history
        try: c.chat.completions.create(model="policy", messages=msgs + [{"role": "user", "content": "?"}])
        except openai.BadRequestError as e: said["refusal"] = e.body["message"]
        return 1.0
    (t, _), (ep, _) = play(editing)
    assert said["refusal"].startswith("message 1 (assistant) differs from what this episode recorded: a request must repeat")
    assert ep.refusals == [said["refusal"]] and t.turns == 2 and t.env_reward == 1.0
    sampled = [i for i, m in zip(t.ids, t.mask) if m]
    assert sampled == said["ids"] * 2                                                         # both turns, nothing re-encoded
    first = render_ids(TOK, ROWS[0]["prompt"], add_generation_prompt=True)
    assert t.prompt_ids == first


def test_the_session_may_come_as_a_header_or_the_user_field():
    said = {}
    def agent(base_url, row):
        root, sid = base_url.split("/sessions/")[0] + "/v1", base_url.split("/sessions/")[1].split("/")[0]
        c, msgs = client(root), [dict(m) for m in row["prompt"]]
        a = c.chat.completions.create(model="policy", messages=msgs, user=sid).choices[0].message.content
        msgs += [{"role": "assistant", "content": a}, {"role": "user", "content": "more"}]
        c.chat.completions.create(model="policy", messages=msgs, extra_headers={"X-Session-Id": sid})
        try: c.chat.completions.create(model="policy", messages=msgs)
        except openai.BadRequestError as e: said["none"] = e.body["message"]
        return 1.0
    (t,), _ = play(agent, rows=ROWS[:1])
    assert t.turns == 2 and said["none"].startswith("which episode? use the base_url the agent was given"), said


@pytest.mark.parametrize("kw, line", [
    ({"n": 2}, "n=2 is refused: an episode is one conversation"),
    ({"logprobs": True, "top_logprobs": 3}, "top_logprobs=3 is refused: only the sampled token's log-prob is kept"),
    ({"model": "gpt-4o"}, "model 'gpt-4o' is not served here: this endpoint serves 'policy'"),
    ({"temperature": 0.5}, "temperature=0.5 is refused: the trainer samples the policy at temperature=1.0"),
])
def test_sampling_options_the_engine_cannot_honour_are_refused(kw, line):
    said = {}
    def agent(base_url, row):
        try: client(base_url).chat.completions.create(**{"model": "policy", "messages": row["prompt"], **kw})
        except openai.BadRequestError as e: said["msg"] = e.body["message"]
        return 0.0
    (t,), (ep,) = play(agent, rows=ROWS[:1])
    assert said["msg"].startswith(line), said
    assert t.turns == 0 and ep.refusals == [said["msg"]]


def test_a_request_after_the_episode_ended_is_refused():
    urls = []
    def agent(base_url, row):
        urls.append(base_url); client(base_url).completions.create(model="policy", prompt="Q: 1+1=")
        return 1.0
    with AgentEndpoint(TOK, agent) as ep:
        t, = ep.run(FixedEngine(), ROWS[:1], SamplingParams(20), 20)
        with pytest.raises(openai.BadRequestError, match="has ended \\(its agent returned\\): a request after the end belongs to no episode"):
            client(urls[0]).completions.create(model="policy", prompt="Q: 1+1=")
    assert t.turns == 1 and t.stop_reason == "stop"


@pytest.mark.parametrize("ret, why", [
    (None, "the agent returned None, not a reward: return the episode's reward as a number"),
    ("1", "the agent returned str '1', not a number"),
    (float("nan"), "the agent returned nan, not a finite number"),
    (ValueError("no tool for that"), "the agent raised ValueError: no tool for that"),
])
def test_an_agent_without_a_reward_fails_its_row_and_the_batch_goes_on(ret, why):
    def agent(base_url, row):
        client(base_url).chat.completions.create(model="policy", messages=row["prompt"])
        if row["extra_info"]["index"] == 1: return 1.0
        if isinstance(ret, Exception): raise ret
        return ret
    with pytest.warns(UserWarning, match="1 of 2 episodes failed and score 0 \\(agent/failures\\); agent_function .*agent: row 0: "):
        (t0, t1), (e0, _) = play(agent)
    assert e0.error.startswith(why), e0.error
    assert (t0.env_reward, t0.env_failures, t1.env_reward, t0.turns) == (0.0, 1, 1.0, 1)


def test_every_agent_failing_stops_the_run_in_one_line():
    from rlhf_nb.endpoint import AgentError
    with pytest.raises(AgentError, match="every episode failed \\(2\\); agent_function .*<lambda>: row 0: the agent returned None"):
        play(lambda base_url, row: None)


def test_two_grpo_steps_from_the_cli_with_an_agent_function(tmp_path, capsys):
    out = tmp_path / "grpo"
    rc = launch.main(["grpo", "--dataset", "calc", "--model_name_or_path", "tiny", "--agent_function", "rlhf_nb.endpoint:calculator_agent",
                      "--max_steps", "2", "--per_device_train_batch_size", "2", "--num_generations", "2", "--max_completion_length", "24",
                      "--max_prompt_length", "64", "--eval_steps", "2", "--eval_size", "2", "--disable_tqdm", "true",
                      "--output_dir", str(out)])
    assert rc == 0, capsys.readouterr().err[-2000:]
    steps = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if '"step"' in l]
    assert max(s["step"] for s in steps) == 2
    train = [s for s in steps if "agent/failures" in s]
    assert train and all(s["agent/failures"] == 0 and "reward/agent_function/mean" in s for s in train)
    assert any("eval/accuracy" in s for s in steps)


@pytest.mark.parametrize("args, line", [
    (["--agent_function", "rlhf_nb.endpoint:nope"], "agent_function 'rlhf_nb.endpoint:nope' cannot be imported"),
    (["--agent_function", "rlhf_nb.endpoint:calculator_agent", "--environment", "calculator"], "leave environment and tools"),
])
def test_bad_agent_function_options_are_one_line(args, line, tmp_path, capsys):
    assert launch.main(["grpo", "--output_dir", str(tmp_path / "x"), *args]) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and err[0].startswith("rlhf-nb grpo: error: ") and line in err[0], err
    assert not (tmp_path / "x").exists()
