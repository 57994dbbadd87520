"""The fake NVML's entry points for NVIDIA's real nvidia-ctk (issue 36, ../shared/nvidia-ctk-real.md:
a called-but-missing one kills it with exit 127) and its description found beside the library,
without FAKE_NVML_DESCRIPTION (nvidia-ctk gets only PATH, LD_LIBRARY_PATH and LD_PRELOAD)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import textwrap

import fake_nvml


def test_nvidia_ctk_s_calls_answer_from_the_description_beside_the_library(tmp_path):
    lib = fake_nvml.build(tmp_path / "build")
    world_lib = tmp_path / "root/usr/lib/x86_64-linux-gnu"
    world_lib.mkdir(parents=True)
    shutil.copy(lib, world_lib / "libnvidia-ml.so.1")
    fake_nvml.describe(world_lib / fake_nvml.BESIDE,
                       [fake_nvml.gpu(0), fake_nvml.gpu(1, minor=5)])
    probe = textwrap.dedent(f"""
        import ctypes, os
        assert "FAKE_NVML_DESCRIPTION" not in os.environ
        nvml = ctypes.CDLL({str(world_lib / "libnvidia-ml.so.1")!r})
        assert nvml.nvmlInit_v2() == 0
        handle, minor, mig = ctypes.c_void_p(), ctypes.c_uint(9), ctypes.c_uint(9)
        uuid = {fake_nvml.gpu(1)["uuid"]!r}.encode()
        print(nvml.nvmlDeviceGetHandleByUUID(uuid, ctypes.byref(handle)),
              nvml.nvmlDeviceGetMinorNumber(handle, ctypes.byref(minor)), minor.value,
              nvml.nvmlDeviceIsMigDeviceHandle(handle, ctypes.byref(mig)), mig.value,
              nvml.nvmlDeviceGetHandleByUUID(b"GPU-none", ctypes.byref(handle)))
        first = ctypes.c_void_p()
        nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(first))
        nvml.nvmlDeviceGetMinorNumber(first, ctypes.byref(minor))
        print(minor.value)
    """)
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0", "5", "0", "0", "6", "0"]


def test_the_fake_exports_every_function_the_list_names(tmp_path):
    lib = ctypes.CDLL(str(fake_nvml.build(tmp_path)))
    assert all(hasattr(lib, name) for name in fake_nvml.FUNCTIONS)
