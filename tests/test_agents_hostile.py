"""Hostile model output and hostile dataset rows through `AgentLoop.run`.

The model's text is untrusted: every tool call that cannot be parsed or checked, and every tool that raises, dies or
never returns, is a counted tool failure the model reads, and the run finishes. Dataset rows are untrusted: a row may
pick only among the environments the run registered; any other name is one `DataError` line, and nothing is imported.
A scripted engine plays the model (it returns chosen turns as token ids), so no model is sampled.
"""
import json, multiprocessing, os, sys, threading, time

import pytest

from rlhf_nb.agents import AgentLoop, CalculatorEnv, make_agent_loop, register_tool_call_parser
from rlhf_nb.data import DataError
from rlhf_nb.models import char_tokenizer
from rlhf_nb.options import AgentArgs
from rlhf_nb.rollout import Completion, RolloutEngine, SamplingParams


class Scripted(RolloutEngine):
    "Plays the model: row i's k-th call gets turns[i][k] (text), encoded and ended with eos."
    def __init__(self, tok, turns):
        super().__init__(tok.eos_token_id, tok.pad_token_id)
        self.tok, self.turns, self.k, self.calls = tok, turns, [0] * len(turns), 0

    def generate(self, prompts, params):
        self.calls += 1
        rows, out = [i for i in range(len(self.turns)) if self.k[i] < len(self.turns[i])], []
        for i, _ in zip(rows, prompts):
            ids = self.tok(self.turns[i][self.k[i]], add_special_tokens=False)["input_ids"] + [self.eos_token_id]
            ids = ids[:params.max_tokens]; self.k[i] += 1
            out.append(Completion(ids, [-1.0] * len(ids), "stop"))
        return out


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def spin() -> int:
    "Holds the interpreter lock inside one C call for days."
    return sum(range(10**15))


def die() -> str:
    "Ends its own process."
    os._exit(3)


class BusyEnv:
    "An environment whose method loops forever in pure Python (it runs in this process, on a thread)."
    def reset(self, **kwargs): self.calls = 0
    def busy(self) -> str:
        "Never answers."
        while True: self.calls += 1
    def get_reward(self): return 1.0


def call(name, **a): return "<tool_call>" + json.dumps({"name": name, "arguments": a}) + "</tool_call>"


ROW = {"prompt": [{"role": "user", "content": "Q: 2+3="}], "extra_info": {}}


@pytest.fixture(scope="module")
def tok(): return char_tokenizer()


def test_hostile_tool_calls_are_counted_failures_and_the_run_finishes(tok):
    turns = ["<tool_call>" + "[" * 100_000,                                         # RecursionError in the decoder
             '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 50_000 + ', "b": 1}}</tool_call>',  # int limit
             call("add", a="2", b=3), call("add", a=True, b=3), call("add", a=2),  # wrong types, missing argument
             call("os.system", command="true"), '<tool_call>{"name": 7}</tool_call>',  # unknown tool, bad name
             call("spin"), call("busy"), call("die"),                            # hangs (GIL held, pure Python), dies
             call("add", a=2, b=3), "#### 5"]                                   # the worker is restarted and answers
    loop = AgentLoop(tok, tools=[add, spin, die], environment_factory=BusyEnv, tool_timeout=0.5,
                     max_tool_response_length=400)
    threads, t0 = threading.active_count(), time.perf_counter()
    t = loop.run(Scripted(tok, [turns]), [ROW], SamplingParams(max_tokens=10), max_completion_length=400_000)[0]
    took = time.perf_counter() - t0
    assert (t.stop_reason, t.tool_calls, t.tool_failures, t.env_reward) == ("stop", 11, 10, 1.0)
    text = tok.decode([i for i, m in zip(t.ids, t.mask) if not m])
    for msg in ("it nests too deeply", "Exceeds the limit (4300 digits)", "'a' must be integer, got str",
                "'a' must be integer, got bool", "missing a required argument: 'b'", "unknown tool 'os.system'",
                "a JSON object with a 'name' string", "spin did not answer within 0.5 s",
                "busy did not answer within 0.5 s", "process ended without an answer (exit code 3)", ">5<"):
        assert msg in text, (msg, text[-2000:])
    assert took < 10, took                                                 # two timeouts of 0.5 s, not days
    deadline = time.monotonic() + 5                                        # no tool thread or process is left
    while threading.active_count() > threads and time.monotonic() < deadline: time.sleep(0.01)
    assert (threading.active_count(), multiprocessing.active_children()) == (threads, [])


def test_a_parser_that_raises_is_a_failed_call(tok):
    @register_tool_call_parser("raises")
    def boom(text):
        if "call" in text: raise RecursionError("parser gave up")
        return []
    loop = AgentLoop(tok, tools=[add], tool_call_parser="raises", max_tool_calling_iterations=3)
    t = loop.run(Scripted(tok, [["call", "#### 1"]]), [ROW], SamplingParams(max_tokens=10), 2000)[0]
    assert (t.tool_calls, t.tool_failures) == (1, 1)
    assert "tool calls of this turn cannot be read (Recursion" in tok.decode(t.ids)


@pytest.mark.parametrize("name", ["this:s", "builtins:input", "os:getpid", "abacus", "rlhf_nb.agents:CalculatorEnv",
                                  "rlhf_nb.launch:main", ["calculator"]])
def test_a_row_may_name_only_registered_environments(tok, name):
    assert "this" not in sys.modules
    loop = AgentLoop(tok, environment_factory=CalculatorEnv)
    rows = [dict(ROW, extra_info={"environment": "calculator"}),
            dict(ROW, extra_info={"environment": name, "index": 41})]
    eng = Scripted(tok, [["#### 5"], ["#### 5"]])
    with pytest.raises(DataError) as e: loop.run(eng, rows, SamplingParams(max_tokens=10), 100)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("row 1 (extra_info.index 41): extra_info.environment ")
    assert "is not an environment of this run; a row may name calculator (" in msg, msg
    assert eng.calls == 0 and "this" not in sys.modules                    # nothing sampled, nothing imported


def test_the_configured_environment_is_registered_by_its_name(tok):
    args = vars(AgentArgs(environment="rlhf_nb.agents:CalculatorEnv"))
    loop = make_agent_loop(type("A", (), {**args, "max_prompt_length": None}), tok)
    assert sorted(loop.environments) == ["calculator", "rlhf_nb.agents:CalculatorEnv"]
    for name in loop.environments:
        assert loop.row_environment({"extra_info": {"environment": name}}) is CalculatorEnv
    with pytest.raises(DataError, match=r"row 5: .*'os:getpid' .* may name calculator, rlhf_nb.agents:CalculatorEnv"):
        loop.row_environment({"extra_info": {"environment": "os:getpid"}}, 5)
    with pytest.raises(DataError, match="row 0: extra_info.tools_kwargs must be a mapping, got str"):
        loop.start(dict(ROW, extra_info={"tools_kwargs": "x"}))
