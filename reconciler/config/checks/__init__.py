"""The save-time checks (docs/architecture.md §5), one module for what each check sees.

- one file on its own: `syntax` (TOML/JSON, apiVersion, model: F001, F002, F004) and `files`
  (names, versions, errors, egress, secrets, scope of each kind of file);
- a tool's schemas: `tools` (one tools.json: S2, S4, S5, S6, annotations);
- conformance cases: `cases` (a cases.toml, alone and beside its interface version: I013);
- the whole tree: `tree` (cross references of connectors, bindings, profiles and org, and the
  tree's file listing: `tree.layout`);
- history: `history` (published versions frozen against a base revision: I010).

The loader (`config.loading`) runs the one-file checks as it reads each file, caching their
findings with its content, then `check_tree` on the assembled snapshot; `handler validate --base`
adds `check_frozen`. Every finding's code is registered in `config.findings.CODES`.
"""

from reconciler.config.checks.cases import check_cases, read_cases
from reconciler.config.checks.files import (
    check_binding_file,
    check_connector_file,
    check_interface_file,
    check_named,
    check_profile_file,
    split_tool_text,
)
from reconciler.config.checks.history import check_frozen
from reconciler.config.checks.syntax import parse_document, validate_model
from reconciler.config.checks.tools import check_tools
from reconciler.config.checks.tree import Memo, check_tree
from reconciler.config.checks.tree.layout import (
    linked_file,
    missing_file,
    oversize_file,
    stray_file,
    undecodable_file,
    undecodable_name,
)

__all__ = [
    "Memo",
    "check_binding_file",
    "check_cases",
    "check_connector_file",
    "check_frozen",
    "check_interface_file",
    "check_named",
    "check_profile_file",
    "check_tools",
    "check_tree",
    "linked_file",
    "missing_file",
    "oversize_file",
    "parse_document",
    "read_cases",
    "split_tool_text",
    "stray_file",
    "undecodable_file",
    "undecodable_name",
    "validate_model",
]
