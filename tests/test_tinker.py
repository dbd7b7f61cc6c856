"""Tinker's API on the local backend (rlhf_nb.tinker_api): the losses against their definitions, gradients that add
up until optim_step, exact save/load, futures in order, and one clear line for each kind of bad input."""
import tempfile
import pytest
import torch
from rlhf_nb.arith import make_arith
from rlhf_nb.tinker_api import (LOCAL_TYPES, ServiceClient, check_data, datum_logprobs, sft_datum, types)

ADAM = types.AdamParams(learning_rate=1e-3)


@pytest.fixture(scope="module")
def service():
    with ServiceClient(root=tempfile.mkdtemp()) as s: yield s


@pytest.fixture(scope="module")
def batch(service):
    tok = service.create_training_client("tiny").get_tokenizer()
    return [sft_datum(tok, r) for r in make_arith(6, seed=3)]


def grads(tc):
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in tc.lm.trainable()])


def params(tc): return [p.detach().clone() for p in tc.lm.trainable()]


def test_cross_entropy_is_the_token_cross_entropy_sum(service, batch):
    tc = service.create_training_client("tiny").result()
    out = tc.forward_backward(batch, "cross_entropy").result()
    ref = 0.0
    for d in batch:
        logits = tc.lm.model(input_ids=torch.tensor([d.model_input.to_ints()])).logits[0]
        tgt, w = d.loss_fn_inputs["target_tokens"].to_torch(), d.loss_fn_inputs["weights"].to_torch()
        ref += torch.nn.functional.cross_entropy(logits, torch.where(w > 0, tgt, -100), reduction="sum").item()
    assert out.metrics["loss:sum"] == pytest.approx(ref, rel=1e-5)
    assert sum(float(o["elementwise_loss"].to_torch().sum()) for o in out.loss_fn_outputs) == pytest.approx(ref, rel=1e-5)


def test_importance_sampling_at_the_current_policy_is_the_log_likelihood_gradient(service, batch):
    tc = service.create_training_client("tiny").result()
    with torch.no_grad(): lps = datum_logprobs(tc.lm.model, batch)
    data = [types.Datum(model_input=d.model_input, loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"],
            "logprobs": lp, "advantages": torch.ones_like(lp)}) for d, lp in zip(batch, lps)]
    tc.forward_backward(data, "importance_sampling").result()
    g_is = grads(tc); tc.lm.model.zero_grad(set_to_none=True)
    ones = [types.Datum(model_input=d.model_input, loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"],
            "weights": torch.ones_like(lp)}) for d, lp in zip(batch, lps)]
    tc.forward_backward(ones, "cross_entropy").result()                   # -sum log p
    assert torch.allclose(g_is, grads(tc), atol=1e-6, rtol=1e-4)
    tc.lm.model.zero_grad(set_to_none=True)


def test_ppo_gives_no_gradient_on_clipped_tokens(service, batch):
    tc = service.create_training_client("tiny").result()
    with torch.no_grad(): lps = datum_logprobs(tc.lm.model, batch)
    # ratio e^{+0.5} with A > 0 and e^{-0.5} with A < 0: both outside [0.8, 1.2] on the clipped side
    data = [types.Datum(model_input=d.model_input, loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"],
            "logprobs": lp - 0.5 * s, "advantages": s}) for d, lp in zip(batch, lps)
            for s in [torch.where(torch.arange(len(lp)) % 2 == 0, 1.0, -1.0)]]
    out = tc.forward_backward(data, "ppo").result()
    assert out.metrics["loss:sum"] != 0 and torch.count_nonzero(grads(tc)) == 0
    tc.lm.model.zero_grad(set_to_none=True)
    inside = [types.Datum(model_input=d.model_input, loss_fn_inputs={**d.loss_fn_inputs, "logprobs": lp}) for d, lp in zip(data, lps)]
    tc.forward_backward(inside, "ppo").result()                                       # ratio 1: not clipped
    assert torch.count_nonzero(grads(tc)) > 0
    tc.lm.model.zero_grad(set_to_none=True)


def test_two_forward_backwards_then_one_step_equal_one_call_on_all_the_data(service, batch):
    a, b = service.create_training_client("tiny").result(), service.create_training_client("tiny").result()
    a.forward_backward(batch[:2], "cross_entropy").result(); a.forward_backward(batch[2:], "cross_entropy").result()
    b.forward_backward(batch, "cross_entropy").result()
    ga, gb = grads(a), grads(b)
    assert torch.allclose(ga, gb, rtol=1e-5, atol=1e-5 * float(gb.abs().max())), float((ga - gb).abs().max())   # gradients add up
    # Adam's first step moves an element by about lr * sign(g) whatever |g| is, so an element whose gradient is at the
    # level of float rounding (a sum of tiny terms in another order) may step either way: compare the others.
    decided = gb.abs() > 1e-4 * float(gb.abs().max())
    a.optim_step(ADAM).result(); b.optim_step(ADAM).result()
    pa, pb = torch.cat([p.flatten() for p in params(a)]), torch.cat([p.flatten() for p in params(b)])
    assert decided.float().mean() > 0.5 and torch.allclose(pa[decided], pb[decided], atol=1e-6), float((pa - pb)[decided].abs().max())
    assert all(p.grad is None for p in a.lm.trainable())                            # the step cleared the gradient


@pytest.mark.parametrize("lora", [False, True])
def test_save_state_and_load_with_optimizer_round_trip_exactly(service, batch, lora):
    tc = (service.create_lora_training_client("tiny", rank=4) if lora else service.create_training_client("tiny")).result()
    for _ in range(2): tc.forward_backward(batch, "cross_entropy"); tc.optim_step(ADAM)
    path = tc.save_state("two").result().path
    assert path.startswith("tinker://")
    saved = params(tc)
    tc.forward_backward(batch, "cross_entropy"); tc.optim_step(ADAM).result()
    want = params(tc)
    back = service.create_training_client_from_state_with_optimizer(path).result()
    back.forward_backward(batch, "cross_entropy"); back.optim_step(ADAM).result()
    assert all(torch.equal(x, y) for x, y in zip(want, params(back)))
    tc.load_state_with_optimizer(path).result()                                   # in place, on the same client
    tc.forward_backward(batch, "cross_entropy"); tc.optim_step(ADAM).result()
    assert all(torch.equal(x, y) for x, y in zip(want, params(tc)))
    fresh = service.create_training_client_from_state(path).result()             # weights only: a fresh Adam
    assert fresh.lm.optimizer is None and all(torch.equal(x, y) for x, y in zip(saved, params(fresh)))


def test_futures_resolve_in_order(service, batch):
    tc = service.create_lora_training_client("tiny", rank=4).result()
    order = []
    futs = [tc.forward_backward(batch, "cross_entropy"), tc.optim_step(ADAM), tc.forward(batch, "cross_entropy"),
            tc.save_weights_and_get_sampling_client()]
    for i, f in enumerate(futs): f._cf.add_done_callback(lambda _, i=i: order.append(i))
    sampler = futs[-1].result()
    assert order == [0, 1, 2, 3] and futs[2].result().metrics["loss:sum"] < futs[0].result().metrics["loss:sum"]
    res = sampler.sample(batch[0].model_input, 3, types.SamplingParams(max_tokens=5, seed=0)).result()
    assert len(res.sequences) == 3 and all(s.stop_reason in ("stop", "length") and len(s.logprobs) == len(s.tokens) for s in res.sequences)
    lps = sampler.compute_logprobs(batch[0].model_input).result()
    assert lps[0] is None and len(lps) == batch[0].model_input.length


def test_async_twins_return_awaitable_futures(service, batch):
    import asyncio
    async def go():
        tc = await service.create_training_client_async("tiny")
        fut = await tc.forward_backward_async(batch, "cross_entropy")
        return await fut
    assert asyncio.run(go()).metrics["loss:sum"] > 0


def test_local_stand_in_types_work_without_the_sdk(service):
    T = LOCAL_TYPES
    tc = service.create_training_client("tiny").result()
    d = T.Datum(T.ModelInput.from_ints([10, 11, 12]), {"target_tokens": [11, 12, 13], "weights": [1, 1, 1]})
    assert tc.forward_backward([d], "cross_entropy").result().metrics["loss:sum"] > 0
    tc.lm.model.zero_grad(set_to_none=True)


def datum(n=3, **inputs):
    return types.Datum(model_input=types.ModelInput.from_ints(list(range(10, 10 + n))), loss_fn_inputs=inputs)


@pytest.mark.parametrize("data,loss,line", [
    ([datum(target_tokens=[1, 2, 3])], "nll", "unknown loss_fn 'nll': one of cross_entropy, importance_sampling, ppo, cispo, dro"),
    ([datum(weights=[1.0, 1.0, 1.0])], "cross_entropy", "Datum 0: loss_fn 'cross_entropy' needs loss_fn_inputs['target_tokens']"),
    ([datum(target_tokens=[1, 2, 3], logprobs=[0.0] * 3)], "ppo", "Datum 0: loss_fn 'ppo' needs loss_fn_inputs['advantages']"),
    ([datum(target_tokens=[1, 2, 3], weights=[1.0, 1.0])], "cross_entropy", "Datum 0: loss_fn_inputs['weights'] has 2 entries but model_input has 3 tokens"),
])
def test_bad_data_is_one_line(service, data, loss, line):
    tc = service.create_training_client("tiny").result()
    with pytest.raises(ValueError) as e: tc.forward_backward(data, loss)
    assert str(e.value) == line
    with pytest.raises(ValueError): check_data(data, loss)


def test_a_model_that_is_not_local_is_one_line(service):
    with pytest.raises(ValueError, match=r"^base_model 'Qwen/Qwen3-8B' is not local: the offline backend runs 'tiny' or a saved model folder"):
        service.create_lora_training_client("Qwen/Qwen3-8B")


def test_the_sdk_types_are_the_ones_used_when_it_is_installed():
    tinker = pytest.importorskip("tinker", reason="the tinker SDK is not installed (pip install tinker==0.38.0)")
    assert types is tinker.types


@pytest.fixture(scope="module")
def sdk_server():
    "The unmodified SDK's ServiceClient talking to tinker-serve on a free port."
    tinker = pytest.importorskip("tinker", reason="the tinker SDK is not installed (pip install tinker==0.38.0)")
    import os
    from rlhf_nb.tinker_serve import start_server
    httpd = start_server(port=0, root=tempfile.mkdtemp())
    old = os.environ.get("TINKER_API_KEY"); os.environ["TINKER_API_KEY"] = "tml-local"
    yield tinker, tinker.ServiceClient(base_url=f"http://127.0.0.1:{httpd.server_port}")
    httpd.shutdown()
    if old is None: os.environ.pop("TINKER_API_KEY", None)
    else: os.environ["TINKER_API_KEY"] = old


def test_the_sdk_trains_and_samples_through_tinker_serve(sdk_server):
    tinker, sc = sdk_server
    tc = sc.create_lora_training_client(base_model="tiny", rank=4).result()
    data = [sft_datum(tc.get_tokenizer(), r) for r in make_arith(4, seed=5)]
    before = tc.forward_backward(data, "cross_entropy")
    tc.optim_step(tinker.types.AdamParams(learning_rate=1e-3))
    after = tc.forward(data, "cross_entropy").result()
    assert after.metrics["loss:sum"] < before.result().metrics["loss:sum"]
    assert [len(o["logprobs"].tolist()) for o in after.loss_fn_outputs] == [d.model_input.length for d in data]
    res = tc.save_weights_and_get_sampling_client().result().sample(
        prompt=data[0].model_input, num_samples=2, sampling_params=tinker.types.SamplingParams(max_tokens=4, seed=0)).result()
    assert len(res.sequences) == 2 and all(len(s.tokens) == len(s.logprobs) <= 4 for s in res.sequences)


def test_bad_input_through_tinker_serve_is_the_sdks_bad_request(sdk_server):
    tinker, sc = sdk_server
    with pytest.raises(tinker.BadRequestError, match="base_model 'Qwen/Qwen3-8B' is not local"):
        sc.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()
    tc = sc.create_lora_training_client(base_model="tiny", rank=4).result()
    d = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([10, 11]), loss_fn_inputs={"target_tokens": [11, 12]})
    with pytest.raises(tinker.BadRequestError, match="unknown loss_fn 'nll'"): tc.forward_backward([d], "nll").result()
    with pytest.raises(tinker.BadRequestError, match=r"needs loss_fn_inputs\['advantages'\]"):
        tc.forward_backward([tinker.types.Datum(model_input=d.model_input, loss_fn_inputs={
            "target_tokens": [11, 12], "logprobs": [0.0, 0.0]})], "importance_sampling").result()


def test_tinker_serve_on_a_busy_port_is_one_line(capsys):
    pytest.importorskip("tinker", reason="the tinker SDK is not installed (pip install tinker==0.38.0)")
    import socket
    from rlhf_nb.tinker_serve import serve_main
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); s.listen(); port = s.getsockname()[1]
        with pytest.raises(SystemExit) as e: serve_main(["--port", str(port)])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"rlhf-nb tinker-serve: error: cannot listen on 127.0.0.1:{port}")
