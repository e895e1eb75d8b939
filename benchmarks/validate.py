"""Load+check time of a large config tree, and reload time after one file changed.

Generates 200 interfaces (3 tools each), 1,000 connectors with a binding each and 5,000 profiles,
then measures in one run: a cold load+check, a reload after one binding file changed (the
content-hash cache at work) against a cold load of the same tree, the TOML reading choice of
docs/architecture.md §4 (tomlkit vs tomllib with the key-to-line scan) on a 20-line profile, and the
line scan past a 5 MB string against tomllib's own parse of that file. Prints figures and ratios;
asserts nothing. Goals on the reference machine: full load+check < 2 s, one-file reload < 100 ms.

    python benchmarks/validate.py [--profiles N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import tomlkit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trees import generate_tree

from reconciler.config import FolderSource, Loader
from reconciler.config.lines import toml_key_lines


def _time(fn: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - start)
    return out


def _print_toml_reading(root: Path) -> None:
    """Design §4's TOML reading choice on one profile: tomlkit against tomllib with the key-to-line scan."""
    profile = (root / "config/profiles/agent00000.toml").read_text()
    n = 2000
    t_kit = min(_time(lambda: [tomlkit.parse(profile) for _ in range(n)], 3)) / n
    t_lib = min(_time(lambda: [tomllib.loads(profile) for _ in range(n)], 3)) / n
    t_scan = min(_time(lambda: [toml_key_lines(profile) for _ in range(n)], 3)) / n
    print(
        f"one profile ({len(profile.splitlines())} lines): tomlkit {t_kit * 1e6:6.1f} us, "
        f"tomllib {t_lib * 1e6:6.1f} us, tomllib + line scan {(t_lib + t_scan) * 1e6:6.1f} us"
        f"  -> tomlkit / (tomllib + scan) = {t_kit / (t_lib + t_scan):4.1f}x"
    )
    print("  (the line scan runs only when a finding needs a line, so loads pay tomllib alone)")
    long = 'description = "' + "a" * 5_000_000 + '"\nname = 1\n'
    t_parse = min(_time(lambda: tomllib.loads(long), 3))
    t_long = min(_time(lambda: toml_key_lines(long), 3))
    print(f"a file with a 5 MB string: tomllib {t_parse * 1000:7.1f} ms, the line scan {t_long * 1000:7.1f} ms "
          f"({t_long / t_parse:4.2f}x tomllib's parse)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--interfaces", type=int, default=200)
    parser.add_argument("--connectors", type=int, default=1000)
    parser.add_argument("--profiles", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = generate_tree(Path(tmp), args.interfaces, args.connectors, args.profiles)
        files = sum(1 for _ in root.rglob("*") if _.is_file())
        print(
            f"tree: {args.interfaces} interfaces x 3 tools, {args.connectors} connectors + bindings, "
            f"{args.profiles} profiles ({files} files)"
        )

        cold = _time(lambda: Loader().load(FolderSource(root)), 3)
        snapshot = Loader().load(FolderSource(root))
        assert snapshot.ok, snapshot.findings[:3]
        print(f"cold load+check:      median {statistics.median(cold) * 1000:8.1f} ms  (goal < 2000 ms)")

        binding = root / "config/bindings/bind0000.toml"
        original = binding.read_text()

        def reload_times(label: str, noted: bool = False) -> float:
            loader, source = Loader(), FolderSource(root)
            loader.load(source)
            reloads = []
            for i in range(args.repeat):
                binding.write_text(original.replace('description = "binding 0"', f'description = "{label} {i}"'))
                start = time.perf_counter()
                if noted:  # as under `handler up`: the watcher names the changed file
                    source.note_changes([binding])
                new = loader.load(source)
                reloads.append(time.perf_counter() - start)
                assert new.bindings["bind0000"].spec.description == f"{label} {i}"
            return statistics.median(reloads)

        # Files written in the last two seconds are re-read on every load (their mtime cannot be
        # trusted yet); a tree checked out earlier is the usual case, so both are shown.
        fresh = reload_times("fresh")
        past = time.time() - 60
        for path in root.rglob("*"):
            os.utime(path, (past, past))
        warm = reload_times("aged")
        watched = reload_times("watched", noted=True)
        print(f"reload, one binding:  median {watched * 1000:8.1f} ms  (goal < 100 ms; the watcher names the file)")
        print(f"  same, no watcher (every file stat'ed, older than 2 s): {warm * 1000:8.1f} ms")
        print(f"  same, every file just written (re-read, racy mtimes): {fresh * 1000:8.1f} ms")
        print(f"  cold / reload ratio: {statistics.median(cold) / warm:6.1f}x")

        _print_toml_reading(root)


if __name__ == "__main__":
    main()
