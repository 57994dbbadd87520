"""The scenario harness's own answer to ``nvidia-ctk cdi generate --mode=imex`` (issue 28).

What the real nvidia-ctk 1.20.0 does, from its captures (tests/data/fixtures/nvidia-ctk/
generate-imex-*.txt, README there): it looks for ``<dev-root>/dev/nvidia-caps-imex-channels/
channel*`` and writes a spec of kind ``nvidia.com/<--class>`` (``gpu`` without ``--class``) with
one device per channel node found, named by its number, plus ``all``; each device's node has
``path`` the container path and ``hostPath`` the node under the dev root; spec-level env
``NVIDIA_VISIBLE_DEVICES=void``. With no channel node it exits 1 (``empty device edits`` on
``all``). The answer is built from the capture itself: its stderr lines (``/ROOT`` made the dev
root; one ``Selecting`` line per node found) and its spec's layout, so a harness unit test holds
the answer of the captured world (channels 0 and 1) byte for byte to the capture.

Nodes are taken in the order of their file names, as Go's ``filepath.Glob`` sorts them
(``channel10`` before ``channel2``): the captures hold only ``channel0`` and ``channel1``, so the
order for larger ids is the Go library's, not observed.

Stdlib only: the fakes run ``-IS``.
"""

from __future__ import annotations

import json
import os
import stat

from . import effects as fx

WITH_CHANNELS = "generate-imex-2-channels.txt"
NO_CHANNELS = "generate-imex-no-channels.txt"
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"


def is_imex_generate(argv: list[str]) -> bool:
    """True for ``nvidia-ctk cdi generate ... --mode=imex ...``."""
    return argv[:3] == ["nvidia-ctk", "cdi", "generate"] and fx.option_value(argv, "--mode") == "imex"


def capture(fixture_dirs: list[str], name: str) -> tuple[int, str, str]:
    """(exit, stderr, stdout) of a capture (``# argv``, ``# exit``, ``# stderr:``, ``# stdout:``)."""
    for directory in fixture_dirs:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path) as f:
                text = f.read()
            rc = int(text.split("# exit: ", 1)[1].split("\n", 1)[0])
            err, out = text.split("# stderr:\n", 1)[1].split("# stdout:\n", 1)
            return rc, err, out
    raise fx.EffectError(f"no nvidia-ctk capture {name!r} in {fixture_dirs}")


def channels_found(dev_root: str) -> list[str]:
    """The channel node names (``channel0``...) under ``dev_root``, as nvidia-ctk's glob finds
    them: character devices only, sorted by name."""
    folder = os.path.join(dev_root, CHANNEL_DIR.lstrip("/"))
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [n for n in names if n.startswith("channel")
            and stat.S_ISCHR(os.lstat(os.path.join(folder, n)).st_mode)]


def render_yaml(kind: str, nodes: list[tuple[str, str]]) -> str:
    """The spec as nvidia-ctk 1.20.0 prints it with ``--format=yaml`` (the capture's layout)."""
    def node_lines(items):
        out = ["        deviceNodes:"]
        for path, host in items:
            out += [f"            - path: {path}", f"              hostPath: {host}"]
        return out

    lines = ["---", "cdiVersion: 0.5.0", f"kind: {kind}", "devices:"]
    for path, host in nodes:
        lines += [f'    - name: "{path.rsplit("channel", 1)[1]}"', "      containerEdits:"]
        lines += node_lines([(path, host)])
    lines += ["    - name: all", "      containerEdits:", *node_lines(nodes),
              "containerEdits:", "    env:", "        - NVIDIA_VISIBLE_DEVICES=void"]
    return "\n".join(lines) + "\n"


def render_json(kind: str, nodes: list[tuple[str, str]]) -> str:
    """The same object as ``--format=json`` prints it: compact, one line, no final newline
    (effects.yaml_spec_as_json)."""
    def edits(items):
        return {"deviceNodes": [{"path": p, "hostPath": h} for p, h in items]}

    devices = [{"name": p.rsplit("channel", 1)[1], "containerEdits": edits([(p, h)])}
               for p, h in nodes]
    devices.append({"name": "all", "containerEdits": edits(nodes)})
    spec = {"cdiVersion": "0.5.0", "kind": kind, "devices": devices,
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}}
    return json.dumps(spec, separators=(",", ":"))


def answer(argv: list[str], world_dir: str, root: str, fixture_dirs: list[str]) -> tuple[int, str, str]:
    """(rc, stdout, stderr) of ``nvidia-ctk cdi generate --mode=imex`` in the world.

    ``--dev-root`` (default ``--driver-root``, then ``/``) is taken as given when it lies in the
    world directory, else under the world's root (a product run with root ``/`` would name the
    machine's ``/dev``). ``--output`` other than empty is not answered: the agent asks for stdout.
    """
    given = fx.option_value(argv, "--dev-root") or fx.option_value(argv, "--driver-root") or "/"
    real = os.path.realpath(given)
    dev_root = real if real.startswith(os.path.realpath(world_dir) + os.sep) \
        else fx.chroot_resolve(root, given)
    shown_root = given.rstrip("/")
    if fx.option_value(argv, "--output"):
        return 1, "", "scenario harness: --mode=imex with a file --output is not answered\n"
    names = channels_found(dev_root)
    if not names:
        rc, err, _ = capture(fixture_dirs, NO_CHANNELS)
        return rc, "", err.replace("/ROOT", shown_root)
    rc, err, _ = capture(fixture_dirs, WITH_CHANNELS)
    kept = [ln for ln in err.splitlines(keepends=True) if "msg=\"Selecting " not in ln]
    selecting = [f'level=info msg="Selecting {shown_root}{CHANNEL_DIR}/{n} as {CHANNEL_DIR}/{n}"\n'
                 for n in names]
    kept[-1:-1] = selecting  # before "Generated CDI spec", as captured
    nodes = [(f"{CHANNEL_DIR}/{n}", f"{shown_root}{CHANNEL_DIR}/{n}") for n in names]
    kind = "nvidia.com/" + (fx.option_value(argv, "--class") or "gpu")
    fmt = fx.option_value(argv, "--format") or "yaml"
    spec = render_json(kind, nodes) if fmt == "json" else render_yaml(kind, nodes)
    return rc, spec, "".join(kept).replace("/ROOT", shown_root)
