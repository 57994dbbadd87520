"""The config's sections and their defaults (contract section 7): one class per section,
its fields as a table (name -> (validator, default)); ``Config()`` is the defaults."""

from __future__ import annotations

from podvm_gpu.config.fields import (
    MAX_GPUS,
    OPTIONAL_MODULES,
    Invalid,
    Section,
    absolute_path,
    attestation_mode,
    boolean,
    cdi_hooks,
    count,
    imex_channels,
    mapping,
    module,
    module_names,
    optional_modules,
    parameter_name,
    parameter_value,
    seconds,
    string_list,
    timeout_tool,
    tool,
    url,
)


class PersistencedConfig(Section):
    """nvidia-persistenced: the readiness wait is ``ready_timeout_s + per_gpu_s * GPUs`` seconds.

    ``per_gpu_s`` unset (null, the default) follows the slowest architecture present
    (gpufacts/attach.py, issue 46): 15 s for Hopper and older (30 s + 15 s a GPU, 150 s for 8 GPUs:
    the field reports of 8-GPU machines needing about 150 s), 35 s for Blackwell, 35 s for an
    NVIDIA id pci_ids.py does not list; a number set here wins. Ending the wait never kills the
    daemon. ``args`` are the daemon's options.
    """

    FIELDS = {"ready_timeout_s": (seconds(0, False), 30.0),
              "per_gpu_s": (seconds(0, True), None),
              "args": (string_list, ("--persistence-mode", "--uvm-persistence-mode"))}
    __slots__ = tuple(FIELDS)


class FabricManagerConfig(Section):
    """nv-fabricmanager: wait ``ready_timeout_s + per_gpu_s * GPUs`` for fabric State Completed,
    querying it every ``poll_s`` seconds (0.1 s: a fabric that completes is seen within that; one
    fabric query, ``nvidia-smi --query-gpu=pci.bus_id,fabric.state,fabric.status``, runs at a
    time, so a slow query stretches the interval, never piles up)."""

    FIELDS = {"ready_timeout_s": (seconds(0, False), 60.0),
              "per_gpu_s": (seconds(0, True), 5.0),
              "config_file": (absolute_path, "/usr/share/nvidia/nvswitch/fabricmanager.cfg"),
              "poll_s": (seconds(0, False), 0.1)}
    __slots__ = tuple(FIELDS)


class NvLink5Config(Section):
    """The NVLink 5 path (ConnectX-managed NVSwitches, podvm_gpu/steps/fabric/nvl5.py): ``ib_modules`` loaded
    by the modules step when the VM has NVLink management ports (NVRC loads the same three);
    ``ib_wait_s`` the longest wait for their InfiniBand devices and ``/dev/infiniband/umad*``
    nodes to appear after the load (the driver registers them asynchronously); NVLSM's config
    file (``-F``, the nvlsm package's path NVRC uses) and its readiness wait; ``image_serves``:
    this image serves NVL5 VMs: ``check --image``'s ``fabric`` row (steps/fabric/step.py) fails
    instead of skipping on what NVL5 needs; boot does not read it."""

    FIELDS = {"ib_modules": (module_names, ("mlx5_core", "mlx5_ib", "ib_umad")),
              "ib_wait_s": (seconds(0, True), 15.0),
              "nvlsm_config_file": (absolute_path, "/usr/share/nvidia/nvlsm/nvlsm.conf"),
              "nvlsm_ready_timeout_s": (seconds(0, False), 30.0),
              "image_serves": (boolean, False)}
    __slots__ = tuple(FIELDS)


class ConfidentialComputingConfig(Section):
    """The GPUs' CC ready state and the attestation before it (docs/interface.md 3.2 step 8,
    "Attestation"; the table of set_ready_state x attestation x guest x ready state there).

    ``set_ready_state`` (default true since issue 26; false before): boot sets the ready state
    itself (``nvidia-smi conf-compute -srs 1``), in a confidential guest only after an
    attestation that passed. ``allow_devtools``: CC mode ``DEVTOOLS`` (a development mode: no
    production confidentiality) is accepted with a warning instead of failing the boot;
    ``allow_cc_off``: a GPU that is not confidential (CC off, no Protected PCIe) in a
    confidential guest (TDX, SEV-SNP) is accepted with a warning instead of failing the boot
    (and then not attested). ``allow_unsupported_multi_gpu``: several confidential GPUs in a
    confidential guest in a set-up NVIDIA does not support (steps/cc/multigpu.py, issue 45)
    are accepted with a warning on every boot instead of failing it.
    ``attestation``: ``auto`` (attest in a confidential guest, required there; elsewhere when
    ``nvattest`` is installed), ``required`` (everywhere) or ``off`` (never; a warning).
    ``attestation_timeout_s + attestation_per_device_s * devices`` bounds each ``nvattest``
    run, the wait for the network included, always within the boot budget (``timeouts:`` has
    no ``nvattest`` key: it is refused). The default, 40 s + 10 s a device, is a judgement:
    a black-holed network takes about 33 s to fail, a GPU about 11 sequential HTTPS requests
    (nvattest.md 7.1, 8 in the shared notes). ``relying_party_policy``, ``rim_dir`` (with it
    ``--rim-store dir``), ``rim_url``, ``ocsp_url``: passed to nvattest (an OCSP/RIM proxy:
    docs/operating.md). ``image_serves``: this image serves confidential GPU VMs: ``check
    --image`` fails instead of warning when nvattest is missing, and when something opens a GPU
    before the agent (check/early.py); with
    ``image_serves_protected_pcie`` (the image serves 8-GPU HGX VMs in Protected PCIe mode)
    libnvidia-nscq is required too, and only then; boot reads neither. ``bind``: the GPUs'
    verdict bound into TDX RTMR3 with an event in the attestation-agent's log
    (podvm_gpu/steps/cc/bind.py, docs/interface.md 3.14): ``auto`` (where ``rtmr3:sha384``
    exists), ``required`` (a boot that cannot bind fails) or ``off``."""

    FIELDS = {"set_ready_state": (boolean, True), "allow_devtools": (boolean, False),
              "allow_cc_off": (boolean, False),
              "allow_unsupported_multi_gpu": (boolean, False),
              "attestation": (attestation_mode, "auto"),
              "attestation_timeout_s": (seconds(0, False), 40.0),
              "attestation_per_device_s": (seconds(0, True), 10.0),
              "relying_party_policy": (absolute_path, None),
              "rim_dir": (absolute_path, None),
              "rim_url": (url, None),
              "ocsp_url": (url, None),
              "image_serves": (boolean, False),
              "image_serves_protected_pcie": (boolean, False),
              "bind": (attestation_mode, "auto")}
    __slots__ = tuple(FIELDS)


class InitdataConfig(Section):
    """Expectations a pod carries in its initdata (podvm_gpu/initdata.py, docs/interface.md
    3.13): ``path`` the file cloud-api-adaptor keeps it in (``/run/peerpod/initdata``); unset
    (the default): never read, never waited for. ``wait_s``: the longest wait for it to appear,
    cut to the budget (15 s: a judgement; process-user-data writes it early in boot)."""

    FIELDS = {"path": (absolute_path, None), "wait_s": (seconds(0, True), 15.0)}
    __slots__ = tuple(FIELDS)


class ModulesConfig(Section):
    """Kernel modules: ``parameters`` per module (``{nvidia: {NVreg_EnableGpuFirmware: 1}}``)
    become ``modprobe <module> KEY=VALUE``; ``optional`` modules may fail with a warning;
    ``lock_after_boot`` writes 1 to ``/proc/sys/kernel/modules_disabled`` after the last module
    the boot loads (as NVRC does), so nothing can load a module until reboot. Off by default:
    kata-agent may load storage or network modules in some images. ``image_serves_blackwell``:
    this image serves Blackwell GPUs: ``check --image``'s ``module-flavour`` row fails unless
    ``modprobe nvidia`` reaches NVIDIA's open module (steps/modules/flavour.py; Blackwell works
    with the open module only); boot does not read it."""

    FIELDS = {"parameters": (mapping(module, mapping(parameter_name, parameter_value)), {}),
              "optional": (optional_modules, OPTIONAL_MODULES),
              "lock_after_boot": (boolean, False),
              "image_serves_blackwell": (boolean, False)}
    __slots__ = tuple(FIELDS)


class HealthConfig(Section):
    """The health gate before the spec is installed (podvm_gpu/steps/cdi/health.py): a pending row remap or
    page retirement (it takes effect only after a GPU reset) fails the boot unless
    ``reset_pending_warns`` makes it a warning."""

    FIELDS = {"reset_pending_warns": (boolean, False)}
    __slots__ = tuple(FIELDS)


class WatchConfig(Section):
    """``podvm-gpu watch`` (podvm_gpu/watch/): ``interval_s`` is the time between two polls of
    the recovery action, the memory health, the fabric state and the daemons (one poll at a
    time; the kernel log is read as it arrives, whatever the interval). The default, 60 s, keeps
    the polls' cost near zero: a poll is four or five nvidia-smi queries, 20-25 ms each on a
    real H200 with driver 580 (tests/data/real/h200-580/README.md), so about 0.1 s a minute,
    some 7.5 s an hour (0.2 % of a core); the watcher itself idles at about nothing
    (bench/watch.py). A recovery action that turns to Node Reboot is seen within one interval."""

    # at least 0.1 s (issue 47): a smaller one runs nvidia-smi back to back; the tests use 0.3-0.5
    FIELDS = {"interval_s": (seconds(0.1, True), 60.0)}
    __slots__ = tuple(FIELDS)


class ImexConfig(Section):
    """IMEX channels for multi-node NVLink (GB200/GB300 NVL72 compute trays; issue 28), off by
    default: ``channels`` lists the channel ids whose nodes
    (``/dev/nvidia-caps-imex-channels/channel<id>``) the ``cdi`` step makes and whose spec of kind
    ``nvidia.com/imex-channel`` it installs as ``/var/run/cdi/nvidia-imex.yaml``
    (podvm_gpu/steps/cdi/imex.py). ``[]`` (the default): nothing made, any earlier IMEX spec
    removed."""

    FIELDS = {"channels": (imex_channels, ())}
    __slots__ = tuple(FIELDS)


class CdiConfig(Section):
    """The GPUs' spec (podvm_gpu/steps/cdi/step.py). ``disable_hooks``: hooks nvidia-ctk must
    leave out of the spec, each passed as ``--disable-hook=<name>`` (``all``: every hook;
    nvidia-ctk 1.18.0 or later, checked before it runs; podvm_gpu/steps/cdi/toolkit.py). The
    alternative to the host's ``NVreg_ModifyDeviceFiles=0`` for the
    ``disable-device-node-modification`` hook, which the fabric manager cannot run with (issue 36).
    ``[]`` (the default): nvidia-ctk's own choice."""

    FIELDS = {"disable_hooks": (cdi_hooks, ())}
    __slots__ = tuple(FIELDS)


class DetectConfig(Section):
    """GPUs that appear after boot started (Hyper-V's vPCI, hot-plug).

    ``expected_gpus``: the NVIDIA GPUs every VM of this image has (0: no expectation); set it in
    an image that serves GPU VMs only, and boot waits for that many on PCI. Boot also waits,
    without any setting, for the PCI device of each VMBus PCI pass-through channel that has
    none yet. ``late_gpu_wait_s``: the longest of either wait, cut to what the boot budget has
    left. Nothing in the guest bounds the arrival otherwise: hv_pci waits for each answer of the
    host without a time limit (``wait_for_response`` in pci-hyperv.c gives up only when the
    channel is rescinded). The default, 60 s, is a judgement, not a measurement: a quarter of
    the default budget, it leaves 180 s for the setup of the GPUs that arrive (a 1-GPU setup
    takes seconds; persistenced's own wait is 45 s for one GPU). A VM without such a channel
    and without ``expected_gpus`` never waits.
    """

    FIELDS = {"expected_gpus": (count(MAX_GPUS), 0),
              "late_gpu_wait_s": (seconds(0, True), 60.0)}
    __slots__ = tuple(FIELDS)


def _metrics(value: object, loc: list):
    """The ``metrics:`` section: the exporter's own settings class checks it (docs/metrics.md)."""
    from podvm_gpu.config.metrics import MetricsConfigError, MetricsSettings

    try:
        return MetricsSettings.from_mapping(value)
    except MetricsConfigError as err:
        raise Invalid([*loc, *err.key_path.split(".")[1:]], err.message) from None
    except TypeError as err:  # a key the settings class does not take
        raise Invalid(loc, str(err)) from None


def _default_metrics():
    from podvm_gpu.config.metrics import MetricsSettings

    return MetricsSettings()


class Config(Section):
    """The whole config; ``Config()`` is the defaults."""

    FIELDS = {"budget_s": (seconds(0, False), 240.0),
              "timeouts": (mapping(timeout_tool, seconds(0, False)), {}),
              "tools": (mapping(tool, absolute_path), {}),
              "persistenced": (PersistencedConfig, PersistencedConfig()),
              "fabricmanager": (FabricManagerConfig, FabricManagerConfig()),
              "nvlink5": (NvLink5Config, NvLink5Config()),
              "confidential_computing": (ConfidentialComputingConfig,
                                         ConfidentialComputingConfig()),
              "modules": (ModulesConfig, ModulesConfig()),
              "initdata": (InitdataConfig, InitdataConfig()),
              "detect": (DetectConfig, DetectConfig()),
              "health": (HealthConfig, HealthConfig()),
              "imex": (ImexConfig, ImexConfig()),
              "cdi": (CdiConfig, CdiConfig()),
              "watch": (WatchConfig, WatchConfig()),
              "unavailable_spec": (boolean, True),
              "metrics": (_metrics, _default_metrics)}
    __slots__ = tuple(FIELDS)


# Timeouts of one call, in seconds, for tools the config does not name (contract section 3:
# every external command has one). modprobe of nvidia on a big machine takes a few seconds.
DEFAULT_TIMEOUTS: dict[str, float] = {
    "modprobe": 60.0,
    "nvidia-ctk": 60.0,
    "nvidia-smi": 30.0,
    "nvidia-modprobe": 15.0,
    "nv-fabricmanager": 15.0,
    "nvidia-persistenced": 15.0,
    "ldconfig": 10.0,
    "systemctl": 10.0,
    "systemd-run": 10.0,
    "journalctl": 10.0,
    "modinfo": 10.0,
    "nvlsm": 15.0,
}


def timeouts_for(config: Config) -> dict[str, float]:
    """The per-tool timeouts: the defaults overridden by the config's ``timeouts``."""
    return {**DEFAULT_TIMEOUTS, **config.timeouts}
