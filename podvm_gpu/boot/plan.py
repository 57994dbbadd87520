"""``boot --dry-run``: the commands boot would run on this VM now, without running any.

Built from the same facts the steps read (loaded modules, existing nodes, running daemons), so
the plan skips what a real boot would skip. Commands whose arguments depend on results of earlier
commands (a GPU's minor before the driver is loaded) use the GPU's index.
"""

from __future__ import annotations

from podvm_gpu.steps.context import BootContext
from podvm_gpu.readers import (FABRICMANAGER_COMM, FABRICMANAGER_PID, PERSISTENCED_COMM,
                               PERSISTENCED_PID, daemon_pid, module_loaded)
from podvm_gpu.steps import cdi_step, fabric, health, modules, nodes


def plan(ctx: BootContext) -> list[list[str]]:
    """The argv lists a boot would run, in order."""
    root, cfg = ctx.root, ctx.config
    argvs: list[list[str]] = []
    wanted = [*modules.REQUIRED, *(m for m in modules.OPTIONAL if m in cfg.modules.optional)]
    for module in wanted:
        if not module_loaded(root, module):
            argvs.append(modules.modprobe_argv(module, cfg.modules.parameters.get(module, {})))
    if ctx.nvswitches and daemon_pid(root, FABRICMANAGER_PID, FABRICMANAGER_COMM) is None:
        argvs.append(["nv-fabricmanager", "--version"])
    minors = nodes.gpu_minors(root, ctx.gpus)
    required = nodes.required_nodes(root, minors)
    if any(nodes.node_problem(root, n) for n in required[:3]):
        argv = ["nvidia-ctk", "system", "create-device-nodes", "--control-devices"]
        argvs.append(argv if root.is_host else [*argv, f"--dev-root={root.path}"])
    use_modprobe = root.is_host and ctx.runner.which("nvidia-modprobe") is not None
    for node in required[3:]:
        if use_modprobe and nodes.node_problem(root, node):  # else mknod, no command
            argvs.append(["nvidia-modprobe", "-c", str(node.minor)])
    if daemon_pid(root, PERSISTENCED_PID, PERSISTENCED_COMM) is None:
        argvs.append(["nvidia-persistenced", *cfg.persistenced.args])
    if ctx.nvswitches and daemon_pid(root, FABRICMANAGER_PID, FABRICMANAGER_COMM) is None:
        argvs.append(fabric.fabricmanager_argv(ctx))
    argvs.append(["nvidia-smi", "-q", "-d", "FABRIC"])
    argvs.append(["nvidia-smi", "conf-compute", "-f"])
    argvs.append(cdi_step.generate_argv(ctx))
    argvs += [health.remap_argv(), health.ecc_argv()]
    return argvs
