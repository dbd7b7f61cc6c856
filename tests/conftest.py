"""Shared pytest setup: the cache folder of the whole session is a temporary one (`$RLHF_NB_CACHE`: no test reads or
fills the user's ~/.cache/rlhf_nb), and each test starts with a fresh accelerate state."""
import atexit, os, shutil, tempfile
import pytest

os.environ["RLHF_NB_CACHE"] = tempfile.mkdtemp(prefix="rlhf_nb-test-cache-")   # subprocesses of tests inherit it
atexit.register(shutil.rmtree, os.environ["RLHF_NB_CACHE"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate keeps one process-wide AcceleratorState; a test that built an Accelerator with other settings
    (a TRL trainer, say) would make the next test's `Accelerator(...)` fail with 'already initialized'."""
    yield
    try:
        from accelerate.state import AcceleratorState, GradientState
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    except Exception:
        pass


# Seconds each test file takes on the 2-core CI machine (a clean-clone run, rounded). tools/test.sh runs pytest in two
# workers, each taking whole files (`-n 2 --dist loadfile`: a module's fixtures are built once); handing out the long
# files first lets the two finish together instead of one worker starting a long file when the other is done.
# A file not listed counts as short and keeps its place after these.
FILE_SECONDS = {"test_faults.py": 250, "test_rollout_vllm.py": 280, "test_faults_dist.py": 150, "test_placement.py": 130,
                "test_distributed.py": 110, "test_trl_cli.py": 80, "test_fsdp.py": 80, "test_docs_site.py": 70,
                "test_resume.py": 60, "test_async.py": 55, "test_tracking.py": 55, "test_cli.py": 50,
                "test_executor_metrics.py": 40, "test_newcomer.py": 35, "test_agents.py": 35, "test_data_cli.py": 30,
                "test_chunked_head.py": 60, "test_distill.py": 35, "test_packing.py": 25, "test_environments.py": 25,
                "test_evaluate.py": 20,
                "test_nodes.py": 140, "test_multinode.py": 70, "test_partial_rollout.py": 30, "test_endpoint.py": 25,
                "test_rollout_corr.py": 20, "test_routing_replay.py": 20}


def pytest_collection_modifyitems(session, config, items):
    "Long files first (FILE_SECONDS), each file's tests in their written order: the order is the same in every worker."
    items.sort(key=lambda it: -FILE_SECONDS.get(it.path.name, 0))       # stable: ties keep the collected order
