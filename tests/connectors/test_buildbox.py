"""What the build's sandbox carries in of the installer's pip configuration, and the registries it may reach.

The sandbox itself (another uid, no secret, no loopback, no outside write) is attacked in
tests/security/test_install_sandbox.py; the builds it runs are tested in test_environments.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from reconciler.connectors.buildbox import build_uid, local_paths, pip_settings, registry_egress


def test_the_installers_pip_configuration_is_carried_in_as_variables_the_variables_first(tmp_path: Path) -> None:
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch<=2.14.1\n")
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nconstraint = {constraints}\nindex-url = https://from-the-file.invalid/simple\n"
                      "target = /somewhere/else\n[install]\nfind-links = /from/install\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": str(config),
           "PIP_INDEX_URL": "https://mirror.invalid:8443/simple"}
    settings = pip_settings(env)
    assert settings["PIP_CONSTRAINT"] == str(constraints)  # the cap on torch goes in
    assert settings["PIP_INDEX_URL"] == "https://mirror.invalid:8443/simple"  # the variable over the file
    assert settings["PIP_FIND_LINKS"] == "/from/install"
    assert "PIP_TARGET" not in settings  # where pip installs is the build's to say


def test_the_registries_are_pips_index_and_files_hosts_and_npms() -> None:
    assert {"pypi.org:443", "files.pythonhosted.org:443"} <= set(registry_egress({}))
    custom = registry_egress({"PIP_INDEX_URL": "https://mirror.invalid:8443/simple",
                              "PIP_EXTRA_INDEX_URL": "file:///opt/pypi/simple http://extra.invalid/simple"})
    assert custom == ["mirror.invalid:8443", "extra.invalid:80"]
    assert registry_egress({"PIP_NO_INDEX": "1"}, "https://registry.npmjs.invalid/") == ["registry.npmjs.invalid:443"]


def test_the_local_files_pip_names_are_shown_an_indexs_whole_folder(tmp_path: Path) -> None:
    (tmp_path / "index/simple").mkdir(parents=True)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "c.txt").write_text("")
    shown = local_paths({"PIP_EXTRA_INDEX_URL": f"file://{tmp_path}/index/simple",
                         "PIP_FIND_LINKS": f"{tmp_path}/wheels https://x.invalid/links",
                         "PIP_CONSTRAINT": f"{tmp_path}/c.txt {tmp_path}/missing.txt"})
    assert sorted(shown) == sorted([tmp_path / "index", tmp_path / "wheels", tmp_path / "c.txt"])


def test_a_builds_uid_is_below_the_connectors_and_its_own_per_environment() -> None:
    uid = build_uid(Path("/cache/envs/0123456789abcdef"))
    assert 0x4F000000 <= uid < 0x50000000
    assert uid == build_uid(Path("/elsewhere/0123456789abcdef"))
