"""The shipped Vagrantfile is valid for vagrant, as users run it and as scripts/vagrant-check.sh does.

No VM is started here (scripts/vagrant-check.sh does that, in minutes under emulation); `vagrant
validate` only loads the file and checks its configuration. Where vagrant is not installed (most CI
machines) the tests skip saying so.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

require_vagrant = pytest.mark.skipif(
    shutil.which("vagrant") is None, reason="vagrant is not installed (apt-get install vagrant vagrant-libvirt to run this)"
)


def vagrant_validate(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess:
    """`vagrant validate` of the repo's Vagrantfile, with its own vagrant home and machine state
    under tmp_path (the user's ~/.vagrant.d and the repo's .vagrant/ are not touched)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MRC_EMU_", "VAGRANT_"))}
    env.update(VAGRANT_CWD=str(REPO), VAGRANT_HOME=str(tmp_path / "home"), VAGRANT_DOTFILE_PATH=str(tmp_path / "dot"))
    env.update(overrides)
    return subprocess.run(["vagrant", "validate"], env=env, capture_output=True, text=True, timeout=120)


@require_vagrant
def test_shipped_vagrantfile_validates_as_users_run_it(tmp_path):
    done = vagrant_validate(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validated successfully" in done.stdout


@require_vagrant
def test_vagrantfile_validates_with_the_check_scripts_overrides(tmp_path):
    host_config = tmp_path / "host-config"
    host_config.mkdir()
    done = vagrant_validate(
        tmp_path,
        MRC_EMU_BOX="mrc-emu-check-local",
        MRC_EMU_PROVIDER="libvirt",
        MRC_EMU_LIBVIRT_DRIVER="qemu",
        MRC_EMU_LIBVIRT_PREFIX="mrc-emu-check-test-",
        MRC_EMU_SYNC="rsync",
        MRC_EMU_CPUS="3",
        MRC_EMU_MEMORY="3072",
        MRC_EMU_HOST_CONFIG=str(host_config),
    )
    assert done.returncode == 0, done.stdout + done.stderr


@require_vagrant
def test_vagrantfile_refuses_a_cpu_count_that_is_not_a_number(tmp_path):
    done = vagrant_validate(tmp_path, MRC_EMU_CPUS="two")
    assert done.returncode != 0
    assert "two" in done.stdout + done.stderr
