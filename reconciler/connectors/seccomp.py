"""The system calls a sandboxed connector may not make (docs/architecture.md §6).

Built with libseccomp (through `pyseccomp`) into a BPF program that bubblewrap loads before it runs
the connector; it stays on every process the connector starts. Everything is allowed but:

- what reshapes the sandbox from inside: `mount` and the new mount API, `umount2`, `pivot_root`,
  `chroot`, `setns`, `unshare`, and `clone` with a namespace flag (`clone3`, whose flags a filter
  cannot read, answers ENOSYS, so the C library falls back to `clone`);
- what reaches into other processes or the kernel: `ptrace`, `process_vm_readv`/`writev`, `kcmp`,
  `keyctl` and the key calls, `bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*`, module and
  `kexec_*` loading, `open_by_handle_at`, `reboot`, swap, clocks, `syslog`, `acct`, `quotactl`,
  `iopl`/`ioperm`, and `ioctl(TIOCSTI)` (typing into a terminal);
- sockets of any family but unix, IPv4, IPv6 and netlink (the loopback's): no `AF_VSOCK` to a
  hypervisor, no `AF_ALG` kernel crypto, no raw `AF_PACKET`; those fail with EAFNOSUPPORT.

Each refused call fails with EPERM, so a connector sees an ordinary error rather than being killed.
"""

from __future__ import annotations

import errno
import functools
import tempfile
from typing import Any

__all__ = ["REFUSED", "SeccompUnavailableError", "filter_program"]

REFUSED = (
    "mount", "umount2", "pivot_root", "chroot", "setns", "unshare",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "name_to_handle_at", "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "vhangup", "lookup_dcookie",
)
_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_TIOCSTI = 0x5412
_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
_AF_MAX_ALLOWED = max(_FAMILIES)


class SeccompUnavailableError(Exception):
    """libseccomp cannot be loaded here, so no filter can be built."""


@functools.cache
def filter_program() -> bytes:
    """The compiled BPF program (built once per process); `SeccompUnavailableError` when libseccomp is missing."""
    try:
        import pyseccomp as sc  # type: ignore[import-untyped]  # loads libseccomp.so: only where a sandbox is built
    except (ImportError, OSError) as exc:
        raise SeccompUnavailableError(f"libseccomp cannot be loaded ({exc}); install it (Debian: libseccomp2)") \
            from None
    refuse = sc.ERRNO(errno.EPERM)
    rules = sc.SyscallFilter(sc.ALLOW)
    for name in REFUSED:
        _add(rules, refuse, name)
    for flag in _NAMESPACE_FLAGS:
        _add(rules, refuse, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    _add(rules, sc.ERRNO(errno.ENOSYS), "clone3")
    _add(rules, refuse, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, _TIOCSTI))
    unsupported = sc.ERRNO(errno.EAFNOSUPPORT)
    for family in (f for f in range(_AF_MAX_ALLOWED + 1) if f not in _FAMILIES):
        _add(rules, unsupported, "socket", sc.Arg(0, sc.EQ, family))
    _add(rules, unsupported, "socket", sc.Arg(0, sc.GT, _AF_MAX_ALLOWED))
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()


def _add(rules: Any, action: Any, name: str, *args: Any) -> None:
    try:
        rules.add_rule(action, name, *args)
    except (RuntimeError, ValueError, OSError):  # a call this architecture does not have
        return
