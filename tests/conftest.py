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
