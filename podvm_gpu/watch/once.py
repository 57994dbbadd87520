"""``podvm-gpu watch``'s paths that end at once: ``--clear``, a finding kept but not applied
yet (applied before anything is watched), the config as boot reads it, and the one line (or
JSON document) the command prints (the loop is podvm_gpu/watch/command.py)."""

from __future__ import annotations

import os

from podvm_gpu import watchfile as watch_state
from podvm_gpu.host.fs import Root
from podvm_gpu.model import shown
from podvm_gpu.watch.act import LOCK_WAIT_S, apply_finding


def refused_root(root: Root, log) -> bool:
    """True (said) when a folder on the way to the run or spec folder is one another user could
    change: boot refuses such a root, and the watcher writes there as root too."""
    from podvm_gpu.ending import untrusted_root

    refused = untrusted_root(root)
    if refused:
        log(log.ERR, f"watch: refusing to write under this root: {refused}")
    return bool(refused)


def apply_pending(root: Root, cfg, doc: dict, pending: dict, log, json_out: bool) -> int:
    """A watcher stopped between keeping a finding and applying it: apply it now, with the
    config ``cfg``."""
    from podvm_gpu.config.model import timeouts_for
    from podvm_gpu.host.proc import Runner

    finding = pending["finding"]
    runner = Runner(cfg.tools, timeouts_for(cfg), trust_tool_paths=True)
    confidential = (doc.get("confidential_computing") or {}).get("confidential") is True
    applied = apply_finding(root, cfg, runner, finding, confidential, doc.get("started_at"), log)
    try:
        watch_state.save(root, pending)
    except OSError as err:
        log(log.WARNING, f"watch: cannot write {watch_state.WATCH_PATH}: {err.strerror or err}")
    say(json_out, {"watching": False, "finding": finding}, f"failed: {finding['reason']}")
    return 0 if applied else 1


def say(json_out: bool, doc: dict, line: str) -> None:
    if json_out:
        import json

        print(json.dumps(doc, indent=2))
    else:
        print(shown(line))


def read_config(root: Root, path: str | None):
    """The config as boot reads it (``--config`` or the root's file; boot's trust), and None;
    or the defaults and the error, one line naming the file and what is wrong."""
    from podvm_gpu.config.load import config_location, load_config
    from podvm_gpu.config.model import Config
    from podvm_gpu.errors import ConfigError

    try:
        where, required = config_location(root, path)
        return load_config(where, required=required, trusted=True), None
    except (ConfigError, OSError) as err:
        return Config(), str(err)


def clear_finding(root: Root, log, json_out: bool = False) -> int:
    """``podvm-gpu watch --clear``: remove watch.json (and with it the finding), under the boot's
    lock; the spec and status stay as the finding left them until boot runs again. Exit 0, or 1
    when the lock or the file cannot be had."""
    from podvm_gpu.status import acquire_lock

    try:
        fd = acquire_lock(root, LOCK_WAIT_S, log)
    except OSError as err:
        log(log.ERR, f"watch --clear: cannot take the boot's lock: {err.strerror or err}")
        return 1
    if fd is None:
        log(log.ERR, "watch --clear: a boot holds /run/podvm-gpu/boot.lock; try again")
        return 1
    try:
        finding = watch_state.standing_finding(root)
        try:
            watch_state.remove(root)
        except OSError as err:
            log(log.ERR, f"watch --clear: cannot remove {watch_state.WATCH_PATH}: "
                         f"{err.strerror or err}")
            return 1
    finally:
        os.close(fd)
    said = (f"cleared: {finding['reason']}; run the boot again (systemctl restart podvm-gpu "
            "podvm-gpu-watch) to install a spec" if finding else "no finding stands")
    log(log.INFO, f"watch --clear: {said}")
    say(json_out, {"cleared": finding}, said)
    return 0
