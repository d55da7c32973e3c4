"""Every test's catalog entries go to a folder of its own, never to the checkout's
results/catalog, which holds real runs only: a test whose refusal regressed would otherwise
probe and store there. A test that wants another catalog sets MATMUL_DRIFT_CATALOG itself."""

import pytest


@pytest.fixture(autouse=True)
def _own_catalog(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MATMUL_DRIFT_CATALOG", str(tmp_path_factory.mktemp("catalog")))
