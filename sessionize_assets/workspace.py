"""The code location as `dagster dev` and its daemon load it (the repository's workspace.yaml).

A sensor's cursor and state are kept per code location name: whatever sets them from outside
(`sessionize replay` handing its cursors over) must name the location as the daemon does.
"""

from pathlib import Path

DEFINITIONS_MODULE = "sessionize_assets.definitions"
CODE_LOCATION = "sessionize"


def workspace_yaml() -> str:
    """A workspace file's text that loads the definitions as the code location above."""
    return (
        "load_from:\n"
        "  - python_module:\n"
        f"      module_name: {DEFINITIONS_MODULE}\n"
        f"      location_name: {CODE_LOCATION}\n"
    )


def code_server_workspace_yaml(socket: Path) -> str:
    """A workspace file's text that reaches the definitions as the same code location, served
    by a running `dagster api grpc --socket SOCKET`: commands given it load no code."""
    return (
        "load_from:\n"
        "  - grpc_server:\n"
        f"      socket: {socket}\n"
        f"      location_name: {CODE_LOCATION}\n"
    )


def grpc_workspace_yaml(host: str, port: int) -> str:
    """A workspace file's text that reaches the definitions as the same code location, served
    by a running `dagster code-server start --host HOST --port PORT` (`sessionize serve`)."""
    return (
        "load_from:\n"
        "  - grpc_server:\n"
        f"      host: {host}\n"
        f"      port: {port}\n"
        f"      location_name: {CODE_LOCATION}\n"
    )
