"""`pip install rlhf-nb` without a clone: build the sdist and, from it, the wheel (so MANIFEST.in is exercised), install
the wheel into a fresh virtualenv that sees this interpreter's packages (torch, transformers, ... already installed)
but not this checkout, and run the console script from outside any repository: `rlhf-nb demo --help`, `rlhf-nb config`,
and a 2-step `rlhf-nb grpo` from a config shipped inside the wheel."""
import json, os, shutil, subprocess, sys, tarfile, zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_VENV = sys.prefix != sys.base_prefix


def sh(cmd, cwd, env=None, timeout=900):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.skipif(IN_VENV, reason="this interpreter is itself a virtualenv: `venv --system-site-packages` would see the "
                    "base interpreter's packages, not this one's, so the new venv would lack torch & co; run from the plain interpreter")
@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout to list the files")
def test_wheel_in_a_fresh_venv_runs_the_cli_and_a_packaged_config(tmp_path):
    pytest.importorskip("build")
    src = tmp_path / "src"; src.mkdir()
    files = sh(["git", "ls-files", "-co", "--exclude-standard"], ROOT).stdout.split()
    for f in files:                                                      # a clean copy: the build never writes into the checkout
        if (ROOT / f).is_file(): (src / f).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(ROOT / f, src / f)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RLHF_NB_DEBUG")}
    sh([sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp_path / "dist", src], tmp_path, env)
    sdist, = (tmp_path / "dist").glob("*.tar.gz")
    wheel, = (tmp_path / "dist").glob("*.whl")
    with tarfile.open(sdist) as t: assert any(n.endswith("/LICENSE") for n in t.getnames())
    names = zipfile.ZipFile(wheel).namelist()
    assert {"rlhf_nb/configs/grpo_arith.yaml", "rlhf_nb/configs/accelerate/cpu_2proc.yaml"} <= set(names)
    assert any(n.endswith("licenses/LICENSE") for n in names)

    venv = tmp_path / "venv"
    sh([sys.executable, "-m", "venv", "--system-site-packages", venv], tmp_path, env)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    sh([bindir / "python", "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", wheel], tmp_path, env)
    work = tmp_path / "elsewhere"; work.mkdir()                           # no configs/ folder, no checkout here
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1",
               PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
    where = sh([bindir / "python", "-c", "import rlhf_nb; print(rlhf_nb.__file__)"], work, env).stdout.strip()
    assert Path(where).is_relative_to(venv), where                       # the wheel, not this checkout
    verify = "from rlhf_nb.equivalence import guarded_verify; print(guarded_verify('0.5', r'\\frac12', isolation='process'))"
    assert sh([bindir / "python", "-c", verify], work, env).stdout.strip() == "(True, 'ok')"   # the math-verify worker starts from the wheel
    assert "--algo" in sh([bindir / "rlhf-nb", "demo", "--help"], work, env).stdout
    listing = sh([bindir / "rlhf-nb", "config"], work, env).stdout
    assert "grpo_arith" in listing and "accelerate/cpu_2proc" in listing
    r = sh([bindir / "rlhf-nb", "grpo", "--config", "grpo_arith", "--max_steps", "2", "--per_device_train_batch_size", "4",
            "--num_generations", "2", "--max_completion_length", "8", "--arith_train_size", "64", "--eval_steps", "0",
            "--warm_start_dir", "", "--output_dir", "g"], work, env)
    s = json.loads((work / "g" / "summary.json").read_text())
    assert (s["steps"], s["algo"]) == (2, "grpo"), r.stderr[-2000:]
