"Shared pytest setup: each test starts with a fresh accelerate state."
import pytest


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
