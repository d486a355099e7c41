"""The code location as `dagster dev` and its daemon load it (the repository's workspace.yaml).

A sensor's cursor and state are kept per code location name: whatever sets them from outside
(`sessionize replay` handing its cursors over) must name the location as the daemon does.
"""

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
