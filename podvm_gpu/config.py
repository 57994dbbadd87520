"""The optional config file ``/etc/podvm-gpu/config.yaml`` (contract section 7).

Every key has a default; unknown keys are errors that name the key. The keys ``budget_s``,
``timeouts``, ``persistenced``, ``confidential_computing`` and ``unavailable_spec`` are fixed by
the contract (the field cases use them); the rest are this project's.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Annotated, Literal

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      field_validator)

from podvm_gpu.errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20
MAX_SECONDS = 3600.0  # no wait or budget in a pod VM boot is longer than an hour


def _not_bool(value: object) -> object:
    if isinstance(value, bool):  # YAML's true would otherwise read as 1 second
        raise ValueError("a number of seconds, not a boolean")
    return value


PositiveSeconds = Annotated[float, BeforeValidator(_not_bool),
                            Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
NonNegativeSeconds = Annotated[float, BeforeValidator(_not_bool),
                               Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
# The external tools of contract section 1; config keys that name a tool must be one of them.
Tool = Literal["modprobe", "nvidia-ctk", "nvidia-persistenced", "nvidia-smi", "nv-fabricmanager",
               "nvidia-modprobe", "systemctl", "ldconfig", "modinfo"]
_PARAMETER_NAME = re.compile(r"[A-Za-z_]\w*")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PersistencedConfig(_Section):
    """nvidia-persistenced: the readiness wait is ``ready_timeout_s + per_gpu_s * GPUs`` seconds.

    The default (30 s + 15 s a GPU, 150 s for 8 GPUs) follows the field reports of 8-GPU
    machines needing about 150 s; ending the wait never kills the daemon.
    """

    ready_timeout_s: PositiveSeconds = 30.0
    per_gpu_s: NonNegativeSeconds = 15.0
    args: list[str] = ["--persistence-mode", "--uvm-persistence-mode"]


class FabricManagerConfig(_Section):
    """nv-fabricmanager: wait ``ready_timeout_s + per_gpu_s * GPUs`` for fabric State Completed."""

    ready_timeout_s: PositiveSeconds = 60.0
    per_gpu_s: NonNegativeSeconds = 5.0
    config_file: str = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
    poll_s: PositiveSeconds = 1.0


class ConfidentialComputingConfig(_Section):
    """Whether boot may set the GPUs' CC ready state itself (``nvidia-smi conf-compute -srs 1``)."""

    set_ready_state: bool = False


class ModulesConfig(_Section):
    """Kernel modules: ``parameters`` per module (``{nvidia: {NVreg_EnableGpuFirmware: 1}}``)
    become ``modprobe <module> KEY=VALUE``; ``optional`` modules may fail with a warning."""

    parameters: dict[str, dict[str, str | int | bool]] = {}
    optional: list[str] = ["nvidia_modeset"]

    @field_validator("parameters")
    @classmethod
    def _module_names(cls, value: dict) -> dict:
        for name, params in value.items():
            if name not in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
                raise ValueError(f"unknown module {name!r} (nvidia, nvidia_uvm, nvidia_modeset)")
            for key, setting in params.items():
                if not _PARAMETER_NAME.fullmatch(key):
                    raise ValueError(f"{name}: {key!r} is not a module parameter name")
                if isinstance(setting, str) and (not setting or any(c.isspace() for c in setting)):
                    raise ValueError(f"{name}.{key}: a value must be one word")
        return value


class Config(_Section):
    """The whole config; ``Config()`` is the defaults."""

    budget_s: PositiveSeconds = 240.0
    timeouts: dict[Tool, PositiveSeconds] = {}
    tools: dict[Tool, str] = {}
    persistenced: PersistencedConfig = PersistencedConfig()
    fabricmanager: FabricManagerConfig = FabricManagerConfig()
    confidential_computing: ConfidentialComputingConfig = ConfidentialComputingConfig()
    modules: ModulesConfig = ModulesConfig()
    unavailable_spec: bool = True

    @field_validator("tools")
    @classmethod
    def _absolute_tool_paths(cls, value: dict[str, str]) -> dict[str, str]:
        for tool, path in value.items():
            if not os.path.isabs(path):
                raise ValueError(f"{tool}: {path!r} is not an absolute path")
        return value


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
    "modinfo": 10.0,
}


def load_config(path: str) -> Config:
    """Load and validate the config file at ``path``; defaults when it does not exist.

    Raises:
        ConfigError: the file is unreadable, not YAML, not a mapping, or has a bad key or value;
            the message names the file and the key (``persistenced.per_gpu_s``).
    """
    text = _read_config_text(path)
    if text is None:
        return Config()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from err
    if raw is None:
        return Config()
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a mapping of settings, not {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"]).replace(".[key]", "") or "(top level)"
        msg = "unknown key" if first["type"] == "extra_forbidden" else \
            first["msg"].removeprefix("Value error, ")
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise ConfigError(f"{path}: {key}: {msg}{more}") from err


def _read_config_text(path: str) -> str | None:
    """The config file's text; None when it does not exist.

    Only a regular file of at most 1 MiB is read, opened without blocking: a FIFO or a device
    given as the config must not hang or flood the boot.

    Raises:
        ConfigError: not a regular file, too large, unreadable, or not UTF-8.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: not a regular file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
        data = os.read(fd, MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err


def timeouts_for(config: Config) -> dict[str, float]:
    """The per-tool timeouts: the defaults overridden by the config's ``timeouts``."""
    return {**DEFAULT_TIMEOUTS, **config.timeouts}
