"""Loaded by Python at start-up when tests put this folder on PYTHONPATH: installs the NVML
stand-in in a child process (the sidecar) when STARVEWATCH_TEST_FAKE_NVML names the pid that
the fake GPU reports as its user."""
import os

if os.environ.get("STARVEWATCH_TEST_FAKE_NVML"):
    import pynvml

    from fake_nvml import patches

    for _name, _fn in patches(int(os.environ["STARVEWATCH_TEST_FAKE_NVML"]), {}).items():
        setattr(pynvml, _name, _fn)
