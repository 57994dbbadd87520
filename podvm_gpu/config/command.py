"""``podvm-gpu config``: validate the config, print the settings in force, optionally compile."""

from __future__ import annotations

import os
import sys


def run_config(root_dir: str, config: str | None, json_out: bool = False,
               compile_: bool = False, also=None) -> int:
    """``podvm-gpu config``: validate, print the settings in force, optionally compile.

    The verdict is boot's: a file boot refuses (another user could change it: its owner, its
    mode, a folder on its way) is invalid here too, exit 1. With no file at the default path
    the defaults are in force: said so, exit 0 (``--compile`` has nothing to compile: 1).
    ``also``: called with the settings of a valid config, returns a warning or None (cli.py
    hands it the installed unit's start time-out against ``budget_s``); said on stderr.
    """
    from podvm_gpu.config.load import DEFAULT_PATH, compile_config, config_location, load_config
    from podvm_gpu.errors import ConfigError
    from podvm_gpu.host.fs import Root
    from podvm_gpu.jsontext import dumps

    root = Root(root_dir)
    path = config or f"{root.path.rstrip('/')}{DEFAULT_PATH}"
    try:
        path, required = config_location(root, config)
        present = required or os.path.lexists(path)
        # boot's own load: trusted=True refuses what another user than root could have written
        settings = load_config(path, required=required, trusted=True,
                               warn=lambda line: print(f"podvm-gpu: warning: {line}",
                                                       file=sys.stderr))
        compiled = None
        if compile_:
            settings, compiled = compile_config(path)
    except (ConfigError, OSError) as err:
        if json_out:
            print(dumps({"config": path, "valid": False, "error": str(err)}))
        else:
            print(f"podvm-gpu: error: {err}", file=sys.stderr)
        return 1
    said = also(settings) if also is not None else None
    if said:
        print(f"podvm-gpu: warning: {said}", file=sys.stderr)
    if json_out:
        print(dumps({"config": path, "valid": True, "present": present, "compiled": compiled,
                     "settings": settings.to_dict()}))
    else:
        print(f"{path}: valid" + (f"; compiled to {compiled}" if compiled else "") if present
              else f"no config file at {path}: the defaults")
        print(dumps(settings.to_dict()))
    return 0
