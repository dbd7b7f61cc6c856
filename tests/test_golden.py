"""Golden curves: each algorithm's seeded tiny run, regenerated, equals its stored curve in golden/ (rlhf_nb.golden).

A failure names the run, the step, the metric and the drift. After an intended change of behaviour, regenerate with
`python tools/golden.py --write` and commit the JSON files with the change that explains them."""
import pytest
from rlhf_nb.golden import GOLDEN_NAMES, check_golden

@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden_curve(name):
    drift = check_golden(name)
    assert not drift, "golden curve drifted:\n" + "\n".join(drift)
