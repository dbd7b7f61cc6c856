"""Tasks and environments from other libraries (rlhf_nb.environments): reasoning-gym rows through `rlhf-nb prep`
and two GRPO steps on them, the OpenEnv and verifiers adapters driven by the agent loop, and the one-line refusals."""
import json, threading, time, warnings
from pathlib import Path
import pytest

pytest.importorskip("reasoning_gym"); pytest.importorskip("verifiers"); pytest.importorskip("openenv")

from rlhf_nb import launch
from rlhf_nb.agents import AgentLoop, tool_metrics
from rlhf_nb.data import read_rows
from rlhf_nb.environments import EnvTimeout, openenv_environment, verifiers_environment, verifiers_rows
from rlhf_nb.models import char_tokenizer
from rlhf_nb.rewards import RewardManager, compute_score, final_answer
from rlhf_nb.rollout import Completion, RolloutEngine, SamplingParams

TASKS = "chain_sum:max_terms=2:max_digits=1,spell_backward:max_word_len=4"


@pytest.fixture(scope="module")
def rg_data(tmp_path_factory):
    "Two reasoning-gym tasks prepared by the CLI: (folder, exit status, stdout)."
    out = tmp_path_factory.mktemp("rg") / "data"
    import io, contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = launch.main(["prep", "reasoning_gym", "--task", TASKS, "--n", "24", "--n_test", "8", "--seed", "3", "--out", str(out)])
    return out, status, buf.getvalue()


def test_prep_rows_contract(rg_data):
    out, status, stdout = rg_data
    assert status == 0 and "train.parquet (24 rows)" in stdout, stdout
    train, test = read_rows(out / "train.parquet", "rl"), read_rows(out / "test.parquet", "rl")
    assert len(train) == 24 and 0 < len(test) <= 8
    assert [r["extra_info"]["task"] for r in train[:4]] == ["chain_sum", "spell_backward"] * 2
    for r in train + test:
        assert r["data_source"] == "reasoning_gym" and r["prompt"][-1]["role"] == "user"
        entry = json.loads(r["extra_info"]["entry"])
        assert entry["question"] == r["prompt"][-1]["content"] and str(entry["answer"]) == r["reward_model"]["ground_truth"]
        assert entry["metadata"]["source_dataset"] == r["extra_info"]["task"]
        gt = r["reward_model"]["ground_truth"]
        assert compute_score("reasoning_gym", f"#### {gt}", gt, r["extra_info"]) == 1.0
    assert not {r["prompt"][-1]["content"] for r in test} & {r["prompt"][-1]["content"] for r in train}
    sft = read_rows(out / "train.parquet", "sft")                       # SFT's target: the answer, then the graded line
    assert all(r["completion"] == f"{g} #### {g}" for r in sft for g in [r["reward_model"]["ground_truth"]])
    assert json.loads((out / "prep.json").read_text())["options"]["task"] == TASKS


def test_grpo_two_steps_from_the_cli(rg_data, tmp_path, capsys):
    out, status, _ = rg_data
    assert status == 0
    "The shipped recipe's options, on the tiny model (no SFT start) and the two-task data, for two steps."
    config = Path(__file__).resolve().parents[1] / "configs" / "grpo_reasoning_gym.yaml"
    rc = launch.main(["grpo", "--config", str(config), "--model_name_or_path", "tiny", "--warm_start_dir", "", "--dataset", str(out),
                      "--eval_dataset", str(out / "test.parquet"), "--max_steps", "2",
                      "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "12",
                      "--eval_steps", "0", "--output_dir", str(tmp_path / "grpo")])
    assert rc == 0, capsys.readouterr().err[-2000:]
    steps = [json.loads(l) for l in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines() if '"step"' in l]
    assert max(s["step"] for s in steps) == 2


def test_prep_exact_match_rows(tmp_path):
    "--exact_match: the same questions under data_source reasoning_gym_exact, whose reward has no partial credit."
    import io, contextlib
    with contextlib.redirect_stdout(io.StringIO()):
        assert launch.main(["prep", "reasoning_gym", "--task", TASKS, "--n", "6", "--n_test", "0", "--seed", "3",
                            "--exact_match", "--out", str(tmp_path / "x")]) == 0
    rows = read_rows(tmp_path / "x" / "train.parquet", "rl")
    assert {r["data_source"] for r in rows} == {"reasoning_gym_exact"}
    r = next(r for r in rows if r["extra_info"]["task"] == "chain_sum")
    gt = r["reward_model"]["ground_truth"]
    assert 0 < compute_score("reasoning_gym", f"#### 1{gt}", gt, r["extra_info"]) < 1         # the verifier's partial credit
    assert compute_score("reasoning_gym_exact", f"#### 1{gt}", gt, r["extra_info"]) == 0.0
    assert compute_score("reasoning_gym_exact", f"#### {gt}", gt, r["extra_info"]) == 1.0
    assert json.loads((tmp_path / "x" / "prep.json").read_text())["options"]["exact_match"] is True


def test_prep_exclude_draws_only_new_questions(tmp_path, capsys):
    "--exclude DIR: rows for RL whose questions the SFT data (train and test) never asked; a missing path is one line."
    q = lambda path: {r["prompt"][0]["content"] for f in Path(path).glob("*.parquet") for r in read_rows(f, "rl")}
    assert launch.main(["prep", "reasoning_gym", "--task", TASKS, "--n", "60", "--n_test", "20", "--out", str(tmp_path / "sft")]) == 0
    assert launch.main(["prep", "reasoning_gym", "--task", TASKS, "--n", "60", "--n_test", "0", "--seed", "1",
                        "--exclude", str(tmp_path / "sft"), "--out", str(tmp_path / "rl")]) == 0
    rl = read_rows(tmp_path / "rl" / "train.parquet", "rl")
    assert len(rl) == 60 and not q(tmp_path / "rl") & q(tmp_path / "sft")
    assert {r["extra_info"]["task"] for r in rl} == {"chain_sum", "spell_backward"}
    assert json.loads((tmp_path / "rl" / "prep.json").read_text())["options"]["exclude"] == str(tmp_path / "sft")
    capsys.readouterr()
    assert launch.main(["prep", "reasoning_gym", "--task", TASKS, "--n", "4", "--exclude", str(tmp_path / "nope"),
                        "--out", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rlhf-nb prep: error: --exclude {tmp_path / 'nope'}: no such file or folder"], err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("argv, line", [
    (["--task", "spell_backwards"], "--task: unknown reasoning-gym task 'spell_backwards'; did you mean 'spell_backward'?"),
    (["--task", "chain_sum:max_term=2"], "--task chain_sum: setting 'max_term=2' is not key=value with a key of chain_sum's config"),
])
def test_prep_refuses_in_one_line(tmp_path, capsys, argv, line):
    assert launch.main(["prep", "reasoning_gym", *argv, "--n", "4", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlhf-nb prep: error: " + line), err
    assert not (tmp_path / "x").exists()


def test_a_verifier_that_raises_is_a_counted_failure():
    bad = {"task": "chain_sum", "entry": json.dumps({"question": "1 + 1 =", "metadata": {}})}     # no answer: score_answer raises
    with pytest.raises(ValueError, match="the verifier of reasoning-gym task 'chain_sum' raised KeyError"): compute_score("reasoning_gym", "#### 2", "2", bad)
    rm = RewardManager(char_tokenizer())
    scores, failures, _ = rm.score_rules(["#### 2"], ["reasoning_gym"], [{"ground_truth": "2"}], [bad], [0])
    assert scores == {0: 0.0} and len(failures) == 1 and "raised KeyError" in failures[0][2]


class ScriptedEngine(RolloutEngine):
    "Plays the model: row i's k-th call gets turns[i][k] (text), encoded and ended with eos; keeps what it sampled."
    def __init__(self, tokenizer, turns):
        super().__init__(tokenizer.eos_token_id, tokenizer.pad_token_id)
        self.tok, self.turns, self.k, self.sampled = tokenizer, turns, [0] * len(turns), {i: [] for i in range(len(turns))}
    def generate(self, prompts, params):
        rows, out = [i for i in range(len(self.turns)) if self.k[i] < len(self.turns[i])], []
        for i, _ in zip(rows, prompts):
            ids = self.tok(self.turns[i][self.k[i]], add_special_tokens=False)["input_ids"] + [self.eos_token_id]
            self.k[i] += 1; self.sampled[i] += ids; out.append(Completion(ids, [-0.5] * len(ids), "stop"))
        return out


def call(name, **a): return f'<tool_call>{json.dumps({"name": name, "arguments": a})}</tool_call>'
ROW = {"prompt": [{"role": "user", "content": "Play."}]}


def _openenv_classes():
    from pydantic import Field
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class MoveAction(Action):
        "Move the counter."
        delta: int = Field(..., description="How far to move, -3 to 3.")
        note: str = Field("", description="Anything to say.")

    class CounterObservation(Observation):
        position: int = 0
        message: str = ""

    class CounterEnv(Environment):
        "Reach position 5: reward 1 and done there; delta 0 hangs, delta -3 gives no reward."
        def __init__(self): super().__init__(); self.pos, self._state = 0, State(step_count=0)
        def reset(self, seed=None, episode_id=None, **kwargs): self.pos = 0; return CounterObservation(position=0, message="start")
        def step(self, action: MoveAction, timeout_s=None, **kwargs) -> CounterObservation:
            while action.delta == 0: time.sleep(0.01)
            self.pos += action.delta
            return CounterObservation(position=self.pos, message=action.note, done=self.pos == 5,
                                      reward=None if action.delta == -3 else float(self.pos == 5))
        @property
        def state(self): return self._state
    return CounterEnv, MoveAction


def test_openenv_adapter_episode_token_in_token_out():
    CounterEnv, _ = _openenv_classes()
    Counter = openenv_environment(CounterEnv, tool_name="move", name="counter")
    tok = char_tokenizer()
    loop = AgentLoop(tok, environment_factory=Counter, tool_timeout=0.2)
    eng = ScriptedEngine(tok, [[call("move", delta=2), call("move", delta=3, note="hi"), call("move", delta=1), "#### 5"],
                               [call("move", delta=0), call("move", delta=7, wrong=1), "#### 0"],
                               [call("move", delta=-3), "#### 0"]])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        done, hung, silent = loop.run(eng, [ROW] * 3, SamplingParams(max_tokens=120), 1000)
    for i, t in enumerate((done, hung, silent)):                        # the ids the engine sampled, unchanged, mask 1
        assert [x for x, m in zip(t.ids, t.mask) if m] == eng.sampled[i]
        assert [lp for lp, m in zip(t.logprobs, t.mask) if m] == [-0.5] * len(eng.sampled[i])
    text = tok.decode(done.ids)
    assert '{"position": 5, "message": "hi"} (done)' in text and "the episode is over" in text
    assert (done.tool_calls, done.tool_failures, done.env_reward, done.env_failures) == (3, 1, 1.0, 0)
    assert (hung.tool_failures, hung.env_reward) == (2, 0.0) and "move did not answer within 0.2 s" in tok.decode(hung.ids)
    assert (silent.env_reward, silent.env_failures) == (0.0, 1)
    assert [str(x.message).split(";")[0] for x in w] == ["environment OpenEnv_counter: get_reward returned no reward (None)"]
    assert tool_metrics([done, hung, silent])["env/reward_failures"] == 1


def test_openenv_reset_that_hangs_is_one_line():
    CounterEnv, MoveAction = _openenv_classes()
    class Stuck(CounterEnv):
        def reset(self, seed=None, episode_id=None, **kwargs): threading.Event().wait(1); return super().reset()
    env = openenv_environment(Stuck, timeout=0.1, name="stuck")()
    with pytest.raises(EnvTimeout, match=r"^OpenEnv environment stuck: reset did not answer within 0.1 s$"): env.reset()
    from rlhf_nb.config import ConfigError
    with pytest.raises(ConfigError, match="pass action_type="): openenv_environment(lambda: Stuck(), name="f")
    assert openenv_environment(lambda: CounterEnv(), action_type=MoveAction, name="f")().reset() == '{"position": 0, "message": "start"}'


def test_verifiers_adapter_episode_and_missing_reward():
    import verifiers.v1 as vf

    class Lookup(vf.Toolset):
        @vf.tool
        async def capital(self, country: str) -> str:
            """The capital of a country.

            Args:
                country: The country's name.
            """
            return {"france": "paris", "peru": "lima"}.get(country.lower(), "unknown")

    class CapitalData(vf.TaskData):
        answer: str = ""

    class CapitalTask(vf.Task[CapitalData]):
        @vf.reward(weight=2.0)
        async def correct(self, task, trace) -> float: return float(final_answer(trace.last_reply) == task.answer)
        @classmethod
        def toolsets(cls, config): return [Lookup(vf.ToolsetConfig())]

    class Unscored(CapitalTask):
        correct = None                                                    # no reward function left

    tasks = [CapitalTask(CapitalData(prompt=f"Capital of {c}?", answer=a)) for c, a in [("France", "paris"), ("Peru", "lima")]]
    Capitals = verifiers_environment(tasks, name="capitals")
    tok = char_tokenizer()
    eng = ScriptedEngine(tok, [[call("capital", country="France"), "#### paris"], [call("capital", country=3), "#### lima?"]])
    a, b = AgentLoop(tok, environment_factory=Capitals).run(eng, verifiers_rows(tasks), SamplingParams(max_tokens=120), 1000)
    assert [x for x, m in zip(a.ids, a.mask) if m] == eng.sampled[0] and "paris" in tok.decode([x for x, m in zip(a.ids, a.mask) if not m])
    assert (a.env_reward, a.tool_failures, b.env_reward, b.tool_failures) == (2.0, 0, 0.0, 1)   # weight 2; a number is not a country
    assert "'country' must be string" in tok.decode(b.ids)
    U = verifiers_environment([Unscored(CapitalData(prompt="Capital of Peru?", answer="lima"))], name="unscored")
    eng = ScriptedEngine(tok, [["#### lima"]])
    with pytest.warns(UserWarning, match="environment Verifiers_unscored: get_reward returned no reward"):
        t, = AgentLoop(tok, environment_factory=U).run(eng, verifiers_rows(U._tasks), SamplingParams(max_tokens=60), 1000)
    assert (t.env_reward, t.env_failures) == (0.0, 1)
