"""A connector's `[needs]`: its own Python environment, built by `handler connector install` into a cache keyed by
what it declares, run by `python3` in its `[run]`, shown read-only in its sandbox; a missing environment, Debian
package or program refuses its start, naming what to run. The service's environment is never touched."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from reconciler.cli import main as handler
from reconciler.config.models import ConnectorFile, Needs
from reconciler.config.snapshot import Connector
from reconciler.connectors.environments import (
    MARKER,
    environment_key,
    environment_path,
    missing_on_machine,
    runtime_home,
)
from reconciler.connectors.errors import ConnectorStartError
from reconciler.connectors.launching import box_view, prepare_launch
from tests.fixtures.echo_tree import write_echo_tree
from tests.fixtures.harness import RawClient, body, load, run, serving, short_dir

NEED = "orjson>=3.10,<4"  # small, and what the echo connector imports when it can


def with_needs(root: Path, needs: str) -> Path:
    """The echo tree's connector run by `python3` (no machine path) with `needs` as its `[needs]` table."""
    manifest = root / "catalog/connectors/echo/connector.toml"
    text = manifest.read_text()
    start = text.index("command = [")
    end = text.index("\n", start)
    command = json.dumps(["python3", "main.py", "../../interfaces/echo/v1/tools.json"])
    manifest.write_text(f"{text[:start]}command = {command}{text[end:]}\n[needs]\n{needs}\n")
    return root


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the echo connector's environment, built once for this module by the command itself."""
    cache = tmp_path_factory.mktemp("cache")
    with short_dir() as folder:
        root = with_needs(write_echo_tree(folder / "t"), f'python = ["{NEED}"]')
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("XDG_CACHE_HOME", str(cache))
            assert handler(["connector", "install", "--root", str(root)]) == 0
    return cache


@pytest.fixture
def needy_root(echo_root: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return with_needs(echo_root, f'python = ["{NEED}"]')


def connector_of(root: Path) -> Connector:
    return load(root).connectors["echo"]


def test_install_builds_once_in_a_readable_folder_named_by_what_is_declared(
        needy_root: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = environment_path(connector_of(needy_root))
    assert path is not None
    assert path.parent == cache / "handler/envs"
    assert json.loads((path / MARKER).read_text())["python"] == [NEED]
    assert handler(["connector", "install", "echo", "--root", str(needy_root)]) == 0
    out = capsys.readouterr().out
    assert f"echo: its environment is built ({path})" in out  # kept: nothing installed again
    assert "installing" not in out
    for folder, _, files in os.walk(path / "lib"):
        assert stat.S_IMODE(Path(folder).stat().st_mode) == 0o755, folder
        for name in files:
            assert Path(folder, name).stat().st_mode & 0o444 == 0o444, Path(folder, name)


def test_the_key_follows_the_requirements_not_their_order_or_spacing() -> None:
    key = environment_key(Needs(python=["a>=1", "b<2"]))
    assert key == environment_key(Needs(python=["b<2", "a >=1"]))
    assert key != environment_key(Needs(python=["a>=1", "b<3"]))
    assert key == environment_key(Needs(python=["a>=1", "b<2"], debian=["festival"]))  # the machine's, not the env's


def test_setup_runs_once_in_the_new_environment_and_a_failing_one_fails_the_install(
        echo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    write = "import pathlib, sys; pathlib.Path('made-by-setup').write_text(sys.prefix)"
    root = with_needs(echo_root, f'python = ["{NEED}"]\nsetup = [["python3", "-c", "{write}"]]')
    assert handler(["connector", "install", "--root", str(root)]) == 0
    path = environment_path(connector_of(root))
    assert path is not None
    assert path != environment_path(connector_of(with_needs(write_echo_tree(tmp_path / "plain"),
                                                                                     f'python = ["{NEED}"]')))
    assert (path / "made-by-setup").read_text() == str(path)  # its own Python, in its own folder
    assert "setting up: python3 -c" in capsys.readouterr().out

    failing = with_needs(write_echo_tree(tmp_path / "failing"),
                         f'python = ["{NEED}"]\nsetup = [["python3", "-c", "raise SystemExit(\'no data here\')"]]')
    assert handler(["connector", "install", "--root", str(failing)]) != 0
    said = capsys.readouterr()
    assert "setup command 'python3' failed" in said.out + said.err
    assert "no data here" in said.out + said.err
    broken = environment_path(connector_of(failing))
    assert broken is not None
    assert not broken.exists()


def test_setup_needs_python_packages_and_is_a_list_of_words() -> None:
    with pytest.raises(ValueError, match="declare its packages"):
        Needs(setup=[["python3", "-c", "pass"]])
    with pytest.raises(ValueError, match="list of non-empty words"):
        Needs(python=["a"], setup=[[]])


def test_python3_in_run_is_the_environments_python_through_the_router(needy_root: Path, run_dir: Path) -> None:
    path = environment_path(connector_of(needy_root))

    async def scenario() -> dict[str, str]:
        async with serving(needy_root, run_dir) as router:
            client = await RawClient.connect(router.socket_path("tester"))
            said = await client.call("echo_say", {"text": "from its own environment"})
            assert said["structuredContent"] == {"text": "from its own environment"}, said
            probed = await client.call("echo_misbehave", {"mode": "probe", "paths": ["/proc/self/cmdline"]})
            await client.close()
            return dict(json.loads(probed["structuredContent"]["text"]))

    seen = run(scenario())
    command = seen["/proc/self/cmdline"].removeprefix("file: ").split("\x00")
    assert command[0] == f"{path}/bin/python3"


def test_a_missing_environment_refuses_the_start_naming_the_install_command(
        needy_root: Path, run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))  # nothing built here: the service builds nothing

    async def scenario() -> None:
        async with serving(needy_root, run_dir) as router:
            client = await RawClient.connect(router.socket_path("tester"))
            result = await client.call("echo_say", {"text": "a"})
            await client.close()
            assert body(result) == {"error": "unavailable", "message": "this service is not set up on this machine; an "
                                    "owner has been told; retrying will not help"}
            assert (result["_meta"]["handler/cause"], result["_meta"]["handler/retry"]) == ("not_set_up", "never")
            message = router.services.pool.statuses["echo-local"].message
            assert "binding 'echo-local'" in message
            assert "run `handler connector install echo`" in message
            left = [p.name for p in (router.state_dir / "connectors").iterdir() if p.is_dir()]
            assert left == []  # the folder made for the start that did not happen is gone

    run(scenario())
    assert not (tmp_path / "empty").exists()


@pytest.mark.parametrize(("needs", "says"), [
    ('debian = ["no-such-package-here"]', "the Debian package no-such-package-here (apt-get install "
                                          "no-such-package-here), missing on this machine"),
    ('programs = ["no-such-program-here", "sh"]', "the program no-such-program-here on its PATH, missing"),
], ids=["debian", "program"])
def test_a_missing_debian_package_or_program_refuses_the_start_saying_what_to_install(
        echo_root: Path, tmp_path: Path, needs: str, says: str) -> None:
    root = with_needs(echo_root, needs)

    async def scenario() -> None:
        await prepare_launch(load(root), "echo-local", root, tmp_path / "state", sandbox=False)

    with pytest.raises(ConnectorStartError) as caught:
        run(scenario())
    assert caught.value.message.startswith("binding 'echo-local': connector 'echo' needs ")
    assert says in caught.value.message


def test_what_the_machine_has_is_not_missing() -> None:
    assert not missing_on_machine(Needs(debian=["bubblewrap"], programs=["sh"]), "/usr/bin:/bin")


def test_needs_are_requirements_and_names_never_options_or_urls() -> None:
    for bad in (["--index-url=https://example.org/simple"], ["evil @ https://example.org/evil.whl"], [""]):
        with pytest.raises(ValueError, match="is not a requirement"):
            Needs(python=bad)
    with pytest.raises(ValueError, match="is not a Debian package name"):
        Needs(debian=["Festival; rm -rf /"])
    with pytest.raises(ValueError, match="is not a program name"):
        Needs(programs=["/usr/bin/text2wave"])
    assert ConnectorFile.model_validate({"apiVersion": "handler.connector/v1", "name": "x", "implements": [],
                                         "needs": {"python": ["pocketsphinx>=5.1.1,<6"]}}).needs.python


def test_install_of_an_unknown_connector_gets_did_you_mean(needy_root: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert handler(["connector", "install", "ecko", "--root", str(needy_root)]) == 2
    assert "no connector 'ecko'" in capsys.readouterr().err


def test_the_sandbox_shows_the_environment_and_the_python_it_was_made_from(needy_root: Path) -> None:
    snapshot = load(needy_root)
    path = environment_path(snapshot.connectors["echo"])
    assert path is not None
    home = runtime_home(path)
    assert home is not None
    assert (home / "bin").is_dir()
    view = box_view(snapshot, needy_root, "echo-local", [str(path / "bin/python3"), "main.py"], [], {})
    assert str(path.resolve()) in view.readable
    assert any(str(home.resolve()).startswith(p.rstrip("/") + "/") or str(home.resolve()) == p
               for p in view.readable)
