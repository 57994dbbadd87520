"""``podvm-gpu check [--image]``: the config and the read-only runner, the rows, the output."""

from __future__ import annotations

import json

from podvm_gpu.check import FAIL, PASS, SKIP, WARN, Check, broken, print_table
from podvm_gpu.config.load import config_location, load_config
from podvm_gpu.config.model import Config, timeouts_for
from podvm_gpu.errors import ConfigError
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner


def run_check(root_dir: str, config: str | None, json_out: bool, image: bool,
              attest: bool = False) -> int:
    """Run the checks, print them, return 0 when none failed, else 1 (contract section 1).
    ``attest``: the attestation row runs a fresh nvattest (podvm_gpu/steps/cc/attest/check.py)."""
    root = Root(root_dir)
    config_note = None
    try:
        # on a VM, a config boot refuses (others could write it) is a bad config here too; in
        # an image the builder may still own it, and the trust row judges that
        path, required = config_location(root, config)
        config = load_config(path, required=required, trusted=not image)
    except ConfigError as err:
        config, config_note = Config(), Check("config", FAIL, str(err), "fix the config file")
    # check runs as root too: as boot does, it runs no tool that another user could replace
    runner = Runner(config.tools, timeouts_for(config), read_only=True, trust_tool_paths=True)
    if image:
        from podvm_gpu.check.image import image_checks

        checks = image_checks(root, config, runner)
    else:
        try:
            from podvm_gpu.check.vm import vm_checks

            checks = vm_checks(root, config, runner, attest=attest)
        except Exception as err:  # discovery itself failed: say so, as a row
            checks = [broken("pci", err)]
    if config_note:
        checks.insert(0, config_note)
    code = 1 if any(c.result == FAIL for c in checks) else 0
    summary = {r: sum(1 for c in checks if c.result == r) for r in (PASS, WARN, FAIL, SKIP)}
    if json_out:
        print(json.dumps({"checks": [c.to_dict() for c in checks],
                          "summary": {**summary, "mode": "image" if image else "vm",
                                      "exit": code}}, indent=2))
    else:
        print_table(checks, summary)
    return code
