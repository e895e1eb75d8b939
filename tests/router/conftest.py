"""The router's tests use the shared echo fixtures."""

from fixtures.echo_fixtures import echo_root, echo_secret, run_dir

__all__ = ["echo_root", "echo_secret", "run_dir"]
