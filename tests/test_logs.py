"""Progress bars in a redirected log: `rlhf-nb grpo ... 2> run.log` writes a few whole progress lines, not thousands of
carriage-return frames glued into one line (rlhf_nb.tracking.log_progress)."""
import os, subprocess, sys


def test_progress_bar_in_a_redirected_log_is_a_few_lines(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_") and k != "RLHF_NB_DEBUG"}
    env.update(HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    log = tmp_path / "run.log"
    with open(log, "w") as f:                                            # a file: not a terminal
        r = subprocess.run([sys.executable, "-m", "rlhf_nb.launch", "grpo", "--max_steps", "6", "--per_device_train_batch_size", "2",
                            "--num_generations", "2", "--max_completion_length", "4", "--arith_train_size", "16",
                            "--eval_steps", "0", "--output_dir", "g"], stdout=subprocess.DEVNULL, stderr=f, cwd=tmp_path, env=env, timeout=600)
    text = log.read_text()
    assert r.returncode == 0, text[-3000:]
    bars = [l for l in text.splitlines() if l.startswith("rl:")]
    assert "\r" not in text and 1 <= len(bars) <= 3, bars                 # the first frame, the last, nothing in between
    assert "6/6" in bars[-1]
