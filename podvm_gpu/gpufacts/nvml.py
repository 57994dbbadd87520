"""GPU readings through NVML (NVIDIA's ``nvidia-ml-py`` binding), bounded in time.

What is read, and from which NVML function (NVML API reference, ``nvml.h``):

- system: ``nvmlSystemGetDriverVersion``; the confidential-computing mode from
  ``nvmlSystemGetConfComputeSettings`` (driver 550 and later: CC feature, dev-tools mode,
  multi-GPU protected PCIe) or, where the library lacks it (the 535 branch, as Debian 12's
  ``libnvidia-ml1`` 535.309.01 shows), ``nvmlSystemGetConfComputeState``; the ready state from
  ``nvmlSystemGetConfComputeGpusReadyState``.
- each GPU, every profile (state and health): UUID, name, PCI bus id; temperature
  (``nvmlDeviceGetTemperatureV``, else the deprecated ``nvmlDeviceGetTemperature`` that 535 has)
  and its slowdown, shutdown and maximum operating thresholds; ECC totals; retired pages; remapped
  rows; PCIe replays; the NVLink fabric's state and status (``nvmlDeviceGetGpuFabricInfoV``,
  else ``nvmlDeviceGetGpuFabricInfo``, which is all the 535 branch has); the recovery action
  (``nvmlDeviceGetFieldValues`` of ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, driver 565+).
- each GPU, ``full`` profile only: power, energy, SM and memory clocks, utilisation (GPU, memory,
  encoder, decoder), frame-buffer memory. In ``cc-safe`` these functions are never *called*, not
  only never exported: the mode is read first and decides.

Bound: the readings are taken by one worker thread while the scrape waits at most
``timeout_s``. An NVML call on a wedged GPU can block for minutes (field case C26: after Xid 119
every call stalls) inside the driver, where neither a thread nor a process can be interrupted
(a process in uninterruptible sleep ignores SIGKILL), so killing buys nothing; ctypes releases
the GIL during the call, so a stuck worker does not stop the server. A stuck worker is abandoned
(a daemon thread) and no new one starts until it returns: more callers would only queue behind
the same driver lock and pile up threads. Meanwhile every scrape answers at once with NVML
down and the call that hangs named.

NVML is only called once the boot is ``ready`` and nvidia-persistenced runs: without it every
NVML client initialises the GPUs again (field case C20; in CC mode a second client then fails),
so a scrape must not be the first client. pynvml is imported only when there is a library to load
(it costs about 40 ms at start-up).
"""

from __future__ import annotations

import os
import re
import threading
import time

from podvm_gpu.gpufacts import judge
from podvm_gpu.gpufacts.reading import GpuReading, NvmlReading, cc_safe
from podvm_gpu.gpufacts.words import NVML_RETURN
from podvm_gpu.host.fs import Root


def reason_of(err: Exception) -> str:
    """A reason word from an NVML error: ``NVMLError_DriverNotLoaded`` -> ``driver-not-loaded``.

    pynvml makes one exception class per NVML return code, named after it.
    """
    name = type(err).__name__.removeprefix("NVMLError_")
    if name in ("NVMLError", ""):
        return "error"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()


class _Abandoned(Exception):
    """The reading was given up by the scrape that waited for it; stop at the next call."""


class _GpuDown(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


# Test-only and explicit (docs/metrics.md, docs/testing.md): with "1", NVML is loaded from a
# root other than / (the fake NVML of tests/fake_nvml under temporary roots). Production never
# sets it; without it another root's library is never loaded (issue 47 item 3).
TEST_FOREIGN_NVML = "PODVM_GPU_TEST_FOREIGN_NVML"


class NvmlReader:
    """Reads NVML under a root; one per process (NVML is process-wide).

    Args:
        root: the :class:`Root`; the library is the one the loader would find there, loaded by
            its path.
        timeout_s: the longest :meth:`read` waits for NVML, seconds.
        keep_open: True for ``serve``: NVML stays initialised between scrapes (``nvmlInit``
            is the slow call); False for one reading, after which NVML is shut down.
        find: ``(find_nvml, find_nvml_elsewhere)`` of podvm_gpu/readers.py (ld.so.conf and the
            default directories; the caller passes them: readers sits beside this package).
    """

    def __init__(self, root: Root, timeout_s: float, keep_open: bool = False, find=None):
        self.find = find
        self.root = root
        self.timeout_s = timeout_s
        self.keep_open = keep_open
        self._pynvml = None
        self._library = ""
        self._initialised = False
        self._worker: threading.Thread | None = None
        self._call = ""  # the NVML call the worker is in, for the timeout message
        self._call_since = 0.0
        self._lock = threading.Lock()  # one read at a time (HTTP server threads)

    def read(self, profile: str) -> NvmlReading:
        """Read NVML within the bound: waiting for another scrape's reading (the HTTP server's
        threads) and this one's together take at most ``timeout_s``.

        Args:
            profile: the configured profile (``auto``, ``full``, ``cc-safe``).

        Returns:
            An :class:`NvmlReading`; never raises for anything NVML does.
        """
        deadline = time.monotonic() + self.timeout_s
        if not self._lock.acquire(timeout=self.timeout_s):
            return NvmlReading(False, "timeout", f"another scrape's NVML reading did not end "
                               f"within {self.timeout_s:g} s ({self._call})")
        try:
            worker = self._worker
            if worker is not None and worker.is_alive():
                return NvmlReading(False, "timeout", f"{self._call} has not returned for "
                                   f"{time.monotonic() - self._call_since:.0f} s")
            if self._pynvml is None:
                missing = self._find_library()
                if missing is not None:
                    return missing
            result: list[NvmlReading] = []
            state = {"abandoned": False}
            worker = threading.Thread(target=self._work, args=(profile, result, state),
                                      name="podvm-gpu-nvml", daemon=True)
            self._worker = worker
            worker.start()
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                state["abandoned"] = True
                return NvmlReading(False, "timeout", f"{self._call} did not return within "
                                   f"{self.timeout_s:g} s")
            self._worker = None
            return result[0]
        finally:
            self._lock.release()

    def close(self) -> None:
        """Shut NVML down unless a call still hangs (shutting down under it would hang too)."""
        with self._lock:
            if self._initialised and (self._worker is None or not self._worker.is_alive()):
                self._shutdown(self._pynvml)

    def _find_library(self) -> NvmlReading | None:
        """Find the library (its real path in ``self._library``); else the reading that says why
        there is none, without importing pynvml."""
        if not self.root.is_host and os.environ.get(TEST_FOREIGN_NVML) != "1":
            return NvmlReading(False, "foreign-root", "NVML is loaded only with root /: the "
                               f"libnvidia-ml.so.1 of {self.root.path} is code this machine did "
                               "not install, and another root's NVML would talk to this "
                               "machine's driver anyway")
        try:
            find_nvml, find_nvml_elsewhere = self.find
            lib = find_nvml(self.root)
            elsewhere = None if lib else find_nvml_elsewhere(self.root)
            self._library = self.root.resolve(lib.path) if lib else ""
        except OSError as err:
            return NvmlReading(False, "library-not-found", f"libnvidia-ml.so.1: {err}")
        if lib is None:
            where = f" (there is {elsewhere.path}, in no directory the loader searches)" \
                if elsewhere else ""
            return NvmlReading(False, "library-not-found",
                               f"libnvidia-ml.so.1 is not installed{where}")
        return None

    def _work(self, profile: str, result: list, state: dict) -> None:
        def call(what: str, fn, *args):
            if state["abandoned"]:
                raise _Abandoned()
            self._call, self._call_since = what, time.monotonic()
            return fn(*args)

        try:
            result.append(self._collect(profile, call))
        except _Abandoned:
            pass
        except Exception as err:  # a binding without a name we use: the scrape still answers
            result.append(NvmlReading(False, "error", f"{self._call}: {type(err).__name__}: {err}"))

    def _collect(self, profile: str, call) -> NvmlReading:
        library = self._library
        if self._pynvml is None:
            import ctypes

            import pynvml

            try:
                # pynvml loads "libnvidia-ml.so.1" through the loader's path of this process;
                # the root's own library is loaded by its path instead (the binding keeps the
                # handle in its module global nvmlLib and loads nothing while it is set).
                pynvml.nvmlLib = call("dlopen libnvidia-ml.so.1", ctypes.CDLL, library)
            except OSError as err:
                # dlopen's message names the library already (issue 47 item 14)
                said = str(err)
                return NvmlReading(False, "library-unloadable",
                                   said if library in said else f"{library}: {said}")
            self._pynvml = pynvml
        nv = self._pynvml
        if not self._initialised:
            try:
                call("nvmlInit", nv.nvmlInit)
            except nv.NVMLError as err:
                return NvmlReading(False, reason_of(err), f"nvmlInit: {err}")
            self._initialised = True
        try:
            reading = self._read_all(nv, profile, call)
        except nv.NVMLError as err:
            # a system-wide call failed (the device count): nothing per GPU can be trusted
            reading = NvmlReading(False, reason_of(err), f"{self._call}: {err}")
        if not self.keep_open:
            self._shutdown(nv)
        return reading

    def _shutdown(self, nv) -> None:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
        self._initialised = False

    def _read_all(self, nv, profile: str, call) -> NvmlReading:
        reading = NvmlReading(True)
        reading.driver_version = _text(optional(nv, call, "nvmlSystemGetDriverVersion",
                                                nv.nvmlSystemGetDriverVersion))
        reading.cc_mode = _cc_mode(nv, call)
        if reading.cc_mode in ("on", "devtools", "ppcie"):
            ready = optional(nv, call, "nvmlSystemGetConfComputeGpusReadyState",
                             nv.nvmlSystemGetConfComputeGpusReadyState)
            reading.cc_ready = None if ready is None else \
                ready == nv.NVML_CC_ACCEPTING_CLIENT_REQUESTS_TRUE
        reading.full = not cc_safe(profile, reading.cc_mode)
        reading.gpu_count = call("nvmlDeviceGetCount", nv.nvmlDeviceGetCount)
        for index in range(reading.gpu_count):
            gpu = GpuReading(index)
            try:
                _read_gpu(nv, call, gpu, reading.full)
                gpu.up = True
            except _GpuDown as down:
                gpu.reason, gpu.message = down.reason, down.message
            reading.gpus.append(gpu)
        return reading


def _down(err) -> bool:
    """True when NVML's error says the GPU answers nothing more until it is reset: a code the
    failure table marks so (gpufacts/words.py FAILURES, its NVML column: GPU lost, reset
    required, no driver, library mismatch, ...) or NVML 1 (uninitialised)."""
    code = getattr(err, "value", None)
    return code == 1 or (code in NVML_RETURN and NVML_RETURN[code].broken)


def optional(nv, call, what: str, fn, *args):
    """``fn(*args)`` through ``call``; None when the GPU or the library does not support it
    (NOT_SUPPORTED, FUNCTION_NOT_FOUND) or it fails otherwise.

    Raises:
        _GpuDown: the GPU is lost or needs a reset.
    """
    try:
        return call(what, fn, *args)
    except nv.NVMLError as err:
        if _down(err):
            raise _GpuDown(reason_of(err), f"{what}: {err}") from err
        return None


def newer_or_older(nv, call, index: int, newer: tuple, older: tuple):
    """The newer NVML function's answer; where the library lacks it (FUNCTION_NOT_FOUND, as 535
    lacks ``nvmlDeviceGetTemperatureV``) or the GPU refuses it (NOT_SUPPORTED, NO_PERMISSION,
    ... as a fractional vGPU may answer for ``nvmlDeviceGetMemoryInfo_v2``'s reserved memory)
    the older one's. Each of ``newer`` and ``older`` is ``(name, binding, args)``; None as
    :func:`optional` gives it.

    Raises:
        _GpuDown: the GPU is lost or needs a reset.
    """
    (new_name, new_fn, new_args), (old_name, old_fn, old_args) = newer, older
    try:
        return call(f"{new_name}(GPU {index})", new_fn, *new_args)
    except nv.NVMLError as err:
        if _down(err):
            raise _GpuDown(reason_of(err), f"{new_name}(GPU {index}): {err}") from err
        return optional(nv, call, f"{old_name}(GPU {index})", old_fn, *old_args)


def _text(value) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _cc_mode(nv, call) -> str | None:
    """The CC mode as boot classifies it (gpufacts/judge.py ``cc_label``: ``off``, ``on``,
    ``devtools``, ``ppcie``), from NVML's settings (550+), else the 535 state call;
    ``unsupported`` when the library has neither (no CC before 535) or the system is not CC
    capable; None for a value the classification does not know (never read as off)."""
    try:
        settings = nv.c_nvmlSystemConfComputeSettings_v1_t()
        ret = call("nvmlSystemGetConfComputeSettings", nv.nvmlSystemGetConfComputeSettings,
                   nv.byref(settings))
        if ret != nv.NVML_SUCCESS:  # this one binding returns the code instead of raising
            raise nv.NVMLError(ret)
        multi_gpu = settings.multiGpuMode
    except nv.NVMLError_FunctionNotFound:
        try:
            settings = call("nvmlSystemGetConfComputeState", nv.nvmlSystemGetConfComputeState)
        except nv.NVMLError_FunctionNotFound:
            return "unsupported"
        except nv.NVMLError_NotSupported:
            return "off"
        except nv.NVMLError:
            return None
        multi_gpu = None  # 535: no multi-GPU mode
    except nv.NVMLError_NotSupported:
        return "off"
    except nv.NVMLError:
        return None
    return judge.cc_label(
        True,
        {nv.NVML_CC_SYSTEM_FEATURE_ENABLED: "on",
         nv.NVML_CC_SYSTEM_FEATURE_DISABLED: "off"}.get(settings.ccFeature,
                                                        f"value {settings.ccFeature}"),
        settings.devToolsMode == nv.NVML_CC_SYSTEM_DEVTOOLS_MODE_ON,
        (judge.MGM_NOT_OFFERED if multi_gpu is None else
         judge.MGM_PPCIE if multi_gpu == nv.NVML_CC_SYSTEM_MULTIGPU_PROTECTED_PCIE
         else judge.MGM_NONE))


_MIB = 1024 * 1024
RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h, 565+)


def _read_gpu(nv, call, gpu: GpuReading, full: bool) -> None:
    i = gpu.index
    try:
        handle = call(f"nvmlDeviceGetHandleByIndex({i})", nv.nvmlDeviceGetHandleByIndex, i)
    except nv.NVMLError as err:
        raise _GpuDown(reason_of(err), f"nvmlDeviceGetHandleByIndex({i}): {err}") from err

    def get(what: str, fn, *args):
        return optional(nv, call, f"{what}(GPU {i})", fn, handle, *args)

    gpu.uuid = _text(get("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID)) or ""
    gpu.name = _text(get("nvmlDeviceGetName", nv.nvmlDeviceGetName)) or ""
    pci = get("nvmlDeviceGetPciInfo", nv.nvmlDeviceGetPciInfo)
    gpu.pci_bus_id = _text(pci.busId) if pci is not None else ""
    values = gpu.values

    def put(field: str, value, scale: float = 1.0) -> None:
        if value is not None:
            values[field] = value * scale if scale != 1.0 else value

    sensor = nv.NVML_TEMPERATURE_GPU
    temp = newer_or_older(nv, call, i,
                          ("nvmlDeviceGetTemperatureV", nv.nvmlDeviceGetTemperatureV, (handle, sensor)),
                          ("nvmlDeviceGetTemperature", nv.nvmlDeviceGetTemperature, (handle, sensor)))
    put("DCGM_FI_DEV_GPU_TEMP", temp)
    for field, threshold in (("DCGM_FI_DEV_SLOWDOWN_TEMP", nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                             ("DCGM_FI_DEV_SHUTDOWN_TEMP", nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
                             ("DCGM_FI_DEV_GPU_MAX_OP_TEMP", nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)):
        put(field, get("nvmlDeviceGetTemperatureThreshold", nv.nvmlDeviceGetTemperatureThreshold,
                       threshold))
    for field, kind, counter in (
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
            ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC)):
        put(field, get("nvmlDeviceGetTotalEccErrors", nv.nvmlDeviceGetTotalEccErrors, kind, counter))
    for field, cause in (("DCGM_FI_DEV_RETIRED_SBE", nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
                         ("DCGM_FI_DEV_RETIRED_DBE", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)):
        pages = get("nvmlDeviceGetRetiredPages", nv.nvmlDeviceGetRetiredPages, cause)
        put(field, None if pages is None else len(pages))
    put("DCGM_FI_DEV_RETIRED_PENDING", get("nvmlDeviceGetRetiredPagesPendingStatus",
                                           nv.nvmlDeviceGetRetiredPagesPendingStatus))
    rows = get("nvmlDeviceGetRemappedRows", nv.nvmlDeviceGetRemappedRows)
    if rows is not None:
        correctable, uncorrectable, pending, failure = rows
        values.update({"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": correctable,
                       "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": uncorrectable,
                       "DCGM_FI_DEV_ROW_REMAP_PENDING": pending,
                       "DCGM_FI_DEV_ROW_REMAP_FAILURE": failure})
    put("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", get("nvmlDeviceGetPcieReplayCounter",
                                               nv.nvmlDeviceGetPcieReplayCounter))
    _read_fabric(nv, call, gpu, handle)
    # issue 28: the driver's recovery action (565+; NOT_SUPPORTED per field before): a state,
    # not a rate, so every profile reads it
    answer = get("nvmlDeviceGetFieldValues", nv.nvmlDeviceGetFieldValues,
                 [getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION_FIELD)])
    if answer and answer[0].nvmlReturn == nv.NVML_SUCCESS:
        gpu.recovery_action = int(answer[0].value.uiVal)
    if full:
        _read_rates(nv, call, i, handle, get, put, values)


def _read_rates(nv, call, i: int, handle, get, put, values: dict) -> None:
    """The full profile's readings of GPU ``i`` (``handle``) into ``values`` (field name to
    number): power (W), energy (mJ), clocks (MHz), utilisation (%), frame buffer (MiB).
    ``get(what, fn, *args)`` calls one optional NVML getter on the handle (None when it does
    not answer), ``put(field, value, scale)`` stores a value that is not None."""
    put("DCGM_FI_DEV_POWER_USAGE", get("nvmlDeviceGetPowerUsage", nv.nvmlDeviceGetPowerUsage), 1e-3)
    put("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", get("nvmlDeviceGetTotalEnergyConsumption",
                                                    nv.nvmlDeviceGetTotalEnergyConsumption))
    put("DCGM_FI_DEV_SM_CLOCK", get("nvmlDeviceGetClockInfo", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM))
    put("DCGM_FI_DEV_MEM_CLOCK", get("nvmlDeviceGetClockInfo", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM))
    util = get("nvmlDeviceGetUtilizationRates", nv.nvmlDeviceGetUtilizationRates)
    if util is not None:
        values["DCGM_FI_DEV_GPU_UTIL"] = util.gpu
        values["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.memory
    for field, what, fn in (("DCGM_FI_DEV_ENC_UTIL", "nvmlDeviceGetEncoderUtilization",
                             nv.nvmlDeviceGetEncoderUtilization),
                            ("DCGM_FI_DEV_DEC_UTIL", "nvmlDeviceGetDecoderUtilization",
                             nv.nvmlDeviceGetDecoderUtilization)):
        sample = get(what, fn)
        put(field, None if sample is None else sample[0])
    memory = newer_or_older(
        nv, call, i, ("nvmlDeviceGetMemoryInfo_v2", nv.nvmlDeviceGetMemoryInfo, (handle, nv.nvmlMemory_v2)),
        ("nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo, (handle,)))
    if memory is not None:
        values["DCGM_FI_DEV_FB_FREE"] = memory.free // _MIB
        values["DCGM_FI_DEV_FB_USED"] = memory.used // _MIB
        if hasattr(memory, "reserved"):
            values["DCGM_FI_DEV_FB_RESERVED"] = memory.reserved // _MIB


def _read_fabric(nv, call, gpu: GpuReading, handle) -> None:
    """The GPU's fabric state and status: ``nvmlDeviceGetGpuFabricInfoV`` (550 and later, its
    v2 struct), else ``nvmlDeviceGetGpuFabricInfo`` (the 535 branch has only this one); left
    None when neither answers.

    Raises:
        _GpuDown: the GPU is lost or needs a reset.
    """
    i = gpu.index
    newer, older = nv.c_nvmlGpuFabricInfoV_t(), nv.c_nvmlGpuFabricInfo_t()
    try:
        call(f"nvmlDeviceGetGpuFabricInfoV(GPU {i})", nv.nvmlDeviceGetGpuFabricInfoV, handle,
             nv.byref(newer))
        info = newer
    except nv.NVMLError as err:
        if _down(err):
            raise _GpuDown(reason_of(err), f"nvmlDeviceGetGpuFabricInfoV(GPU {i}): {err}") from err
        if optional(nv, call, f"nvmlDeviceGetGpuFabricInfo(GPU {i})",
                    nv.nvmlDeviceGetGpuFabricInfo, handle, nv.byref(older)) is None:
            return
        info = older
    gpu.fabric_state, gpu.fabric_status = int(info.state), int(info.status)
