"""The distribution's metadata as setuptools reads it on every install: no deprecation warnings."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_reads_without_setuptools_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    # a licence as a TOML table printed a deprecation (builds refused from 2027-02-18) on every install
    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
