"""``podvm-gpu config``: validate the config, print the settings in force, optionally compile."""

from __future__ import annotations

import sys


def run_config(root_dir: str, config: str | None, json_out: bool = False,
               compile_: bool = False) -> int:
    """``podvm-gpu config``: validate, print the settings in force, optionally compile."""
    from podvm_gpu.config.load import DEFAULT_PATH, compile_config, config_location, load_config
    from podvm_gpu.errors import ConfigError
    from podvm_gpu.host.fs import Root
    from podvm_gpu.jsontext import dumps

    root = Root(root_dir)
    path = config or f"{root.path.rstrip('/')}{DEFAULT_PATH}"
    try:
        path, required = config_location(root, config)
        settings, compiled = (compile_config(path) if compile_ else
                              (load_config(path, required=required), None))
    except (ConfigError, OSError) as err:
        if json_out:
            print(dumps({"config": path, "valid": False, "error": str(err)}))
        else:
            print(f"podvm-gpu: error: {err}", file=sys.stderr)
        return 1
    if json_out:
        print(dumps({"config": path, "valid": True, "compiled": compiled,
                     "settings": settings.to_dict()}))
    else:
        print(f"{path}: valid" + (f"; compiled to {compiled}" if compiled else ""))
        print(dumps(settings.to_dict()))
    return 0
