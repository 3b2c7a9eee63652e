"""What the package's metadata installs: TensorFlow comes from the `cpu` or the `gpu` extra."""

from importlib.metadata import requires

import pytest
from packaging.requirements import Requirement

LINUX_X86 = {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux", "os_name": "posix"}
LINUX_ARM = {**LINUX_X86, "platform_machine": "aarch64"}
MAC_ARM = {"platform_system": "Darwin", "platform_machine": "arm64", "sys_platform": "darwin", "os_name": "posix"}


def resolved(extras, env):
    """The requirements pip installs for ``sparkdl_train[extras]`` on a platform described by ``env``."""
    out = []
    for text in requires("sparkdl_train"):
        req = Requirement(text)
        contexts = [{**env, "extra": e} for e in ("", *extras)]
        if req.marker is None or any(req.marker.evaluate(c) for c in contexts):
            out.append(req)
    return out


def tensorflows(reqs):
    return {(r.name, tuple(sorted(r.extras))) for r in reqs if r.name.startswith("tensorflow")}


def test_the_gpu_extra_is_a_gpu_capable_tensorflow_on_linux_x86_64():
    tf = tensorflows(resolved(["gpu"], LINUX_X86))
    assert tf == {("tensorflow", ("and-cuda",))}, tf  # CUDA and cuDNN from pip, never tensorflow-cpu
    (req,) = [r for r in resolved(["gpu"], LINUX_X86) if r.name == "tensorflow"]
    assert req.specifier.contains("2.21.0")


@pytest.mark.parametrize("env,expected", [
    (LINUX_X86, {("tensorflow-cpu", ())}),  # what ./run installs: the CPU-only build
    (LINUX_ARM, {("tensorflow", ())}),  # no tensorflow-cpu wheels there
    (MAC_ARM, {("tensorflow", ())}),
])
def test_the_cpu_extra(env, expected):
    assert tensorflows(resolved(["cpu"], env)) == expected


def test_the_base_install_pins_no_tensorflow_build():
    # both builds install the same `tensorflow` package: the base must not pick one for the extras
    for env in (LINUX_X86, LINUX_ARM, MAC_ARM):
        assert tensorflows(resolved([], env)) == set()
        names = {r.name for r in resolved([], env)}
        assert {"pyspark", "keras", "numpy", "pyarrow", "pandas"} <= names


def test_test_extras_stay_out_of_the_runtime_extras():
    for extra in ("cpu", "gpu"):
        names = {r.name for r in resolved([extra], LINUX_X86)}
        assert not names & {"pytest", "scikit-learn", "nbclient", "matplotlib", "tensorboard"}, names
