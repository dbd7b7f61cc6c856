"Gold scorers for tests/test_overopt.py, importable as module:function from the command line."


def nan_gold(answer, truth):
    "A broken gold scorer: NaN for every answer."
    return float("nan")


def short_gold(answer, truth):
    "A gold that prefers shorter answers: minus the length."
    return -float(len(answer))
