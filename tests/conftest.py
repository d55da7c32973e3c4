"""Every test's catalog entries go to a folder of its own, never to the checkout's
results/catalog, which holds real runs only: a test whose refusal regressed would otherwise
probe and store there. A test that wants another catalog sets MATMUL_DRIFT_CATALOG itself."""

import io
import subprocess
import tarfile
from pathlib import Path

import browsing
import pytest


@pytest.fixture(autouse=True)
def _own_catalog(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path_factory.mktemp("catalog")))


@pytest.fixture(scope="session")
def committed_results(tmp_path_factory) -> Path:
    """results/ as HEAD commits it, beside an asv.conf.json whose repo is this checkout: what
    the tests of the committed history read, never what a run of the main job here added
    (`bash scripts/suite.sh` before `bash scripts/test.sh` records a result in the clone)."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("committed")
    archive = subprocess.run(["git", "-C", str(root), "archive", "HEAD", "results", "asv.conf.json"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    conf = out / "asv.conf.json"
    conf.write_text(conf.read_text().replace('"repo": "."', f'"repo": "{root}"', 1))
    return out / "results"


# Headless Chromium (browsing.py), one per test module that opens a site.
@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = browsing._chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def offline_browser(tmp_path_factory):
    """Chromium that can reach 127.0.0.1 and nothing else: every other host name fails to resolve."""
    driver = browsing._chromium(tmp_path_factory.mktemp("chromium-offline"),
                                (*browsing.FLAGS, "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"))
    yield driver
    driver.quit()
