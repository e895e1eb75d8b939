"""The pytest plugin under `handler connector check`: one test item per case and per fuzzed tool.

Registered under the `pytest11` entry point, it stays inert unless `--handler-connector` is given.
Then each `interface.toml` of an interface version the connector implements collects into items:

    catalog/interfaces/ocr/v1/interface.toml::case[invoice text]    a case of conformance/cases.toml
    catalog/interfaces/ocr/v1/interface.toml::fuzz[ocr_extract]     valid inputs generated from the schema
    catalog/interfaces/ocr/v1/interface.toml::refuse[ocr_extract]   invalid inputs derived from the schema

Items are plain data, so pytest-xdist spreads them over workers (`-n auto`); each process starts its
own router and connector on its first item (`harness.Harness`) and stops them at the session's end.
The controller gathers every report into the JSON result (`--handler-json`) and prints a summary
per interface version. Run it directly with

    pytest -n auto --handler-connector ocr-tesseract --handler-binding ocr-local \\
        catalog/interfaces/ocr/v1/interface.toml
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from conformance.defaults import DEFAULT_EXAMPLES

__all__ = ["pytest_addoption", "pytest_configure"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("handler-conformance", "connector conformance (handler connector check)")
    group.addoption("--handler-connector", metavar="NAME", help="check this connector of the config tree")
    group.addoption("--handler-binding", metavar="NAME", help="the binding that configures it")
    group.addoption("--handler-root", metavar="DIR", default=".", help="the config root (default: .)")
    group.addoption("--handler-examples", metavar="K", type=int, default=DEFAULT_EXAMPLES,
                    help=f"valid inputs generated per tool (default: {DEFAULT_EXAMPLES})")
    group.addoption("--handler-seed", metavar="S", type=int, help="the fuzzing seed (default: a random one, shown)")
    group.addoption("--handler-json", metavar="FILE", help="write the JSON result here")
    group.addoption("--handler-connector-log", metavar="FILE",
                    help="append what the connector writes to its stderr (secrets masked) to FILE")


def pytest_configure(config: pytest.Config) -> None:
    connector = config.getoption("handler_connector")
    if not connector:
        return
    binding = config.getoption("handler_binding")
    if not binding:
        raise pytest.UsageError("--handler-connector needs --handler-binding: the binding that configures it")
    # Imported here, not at the top: this module loads in every pytest session of the environment,
    # and the router, hypothesis-jsonschema and friends are only for a check.
    from conformance.errors import CheckError
    from conformance.running import CheckRun
    from conformance.workspace import load_subject

    root = Path(config.getoption("handler_root"))
    try:
        subject = load_subject(root, connector, binding)
    except CheckError as exc:
        raise pytest.UsageError(str(exc)) from None
    workerinput = getattr(config, "workerinput", None)
    seed = config.getoption("handler_seed")
    if workerinput is not None:
        seed = workerinput.get("handler_seed", seed)  # every worker fuzzes with the controller's seed
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    _log_connector_to(config.getoption("handler_connector_log"))
    run = CheckRun(config, subject, seed, config.getoption("handler_examples"), worker=workerinput is not None)
    config.pluginmanager.register(run, "handler-conformance-run")




def _log_connector_to(path: str | None) -> None:
    """The connector's stderr lines (the router logs them as `handler.connector`), appended to `path`."""
    if not path:
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    connector_log = logging.getLogger("handler.connector")
    connector_log.addHandler(handler)
    connector_log.setLevel(logging.INFO)  # the check quiets the router's other logs, not these
