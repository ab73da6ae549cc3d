"""Mininet nodes of the fabric: Linux routers whose SRv6 forwarding is the kernel's.

Why it exists: Mininet gives each node a shell in a fresh network namespace (via mnexec).
Mininet starts those shells one after another, each waiting for its prompt; for 320 nodes
that alone costs seconds, so the router splits start-up in two: spawn every shell, then
wait for every prompt. It never runs a userspace forwarder: a switch is its kernel.
"""

from __future__ import annotations

import os
import pty
import select
import shutil

from mininet.node import Node

from .waiting import WaitTimeout, until


class FabricSetupError(RuntimeError):
    """The machine cannot build a fabric: a missing privilege, program or kernel feature."""


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise FabricSetupError(
            "building a fabric needs root (network namespaces, veths, routes): run with sudo"
        )
    for program, package in (("mnexec", "mininet"), ("ifconfig", "net-tools")):
        if shutil.which(program) is None:
            raise FabricSetupError(
                f"'{program}' not found: Mininet needs it. Install it with "
                f"'apt-get install {package}' or run scripts/install.sh"
            )
    if not os.path.exists("/proc/sys/net/ipv6/conf/all/seg6_enabled"):
        raise FabricSetupError("this kernel has no SRv6 (CONFIG_IPV6_SEG6_LWTUNNEL): no seg6_enabled sysctl")


class LinuxRouter(Node):
    "A Mininet node that forwards IPv6 and SRv6 in its kernel; its shell starts in two steps."

    PROMPT = chr(127)  # the prompt Mininet gives its shells

    def startShell(self, mnopts=None):  # noqa: N802 (Mininet's name)
        """Spawn the shell; `wait_ready` completes the start (so many nodes spawn at once)."""
        self._spawn(mnopts)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the shell prints its prompt: then it runs inside its own namespace."""
        fd = self.stdout.fileno()
        buffered = [""]

        def prompted() -> bool:
            if select.select([fd], [], [], 0)[0]:
                chunk = os.read(fd, 1024)
                if not chunk:
                    raise FabricSetupError(f"node {self.name}: shell exited during start-up")
                buffered[0] += chunk.decode(errors="replace")
            return buffered[0].endswith(self.PROMPT)

        try:
            until(prompted, timeout, f"the prompt of node {self.name}'s shell", interval=1.0, wake=[fd])
        except WaitTimeout as exc:
            raise FabricSetupError(str(exc)) from None
        self.waiting = False
        if os.stat(f"/proc/{self.pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino:
            raise FabricSetupError(f"node {self.name}: shell is not in a namespace of its own")

    def _spawn(self, mnopts=None) -> None:
        opts = (mnopts or "-cd") + ("n" if self.inNamespace else "")
        cmd = ["mnexec", opts, "env", "PS1=" + self.PROMPT, "bash", "--norc", "--noediting",
               "-is", "mininet:" + self.name]
        self.master, self.slave = pty.openpty()
        self.shell = self._popen(cmd, stdin=self.slave, stdout=self.slave, stderr=self.slave, close_fds=False)
        os.close(self.slave)
        self.stdin = os.fdopen(self.master, "r")
        self.stdout = self.stdin
        self.pid = self.shell.pid
        self.pollOut = select.poll()
        self.pollOut.register(self.stdout)
        self.outToNode[self.stdout.fileno()] = self
        self.inToNode[self.stdin.fileno()] = self
        self.execed = False
        self.lastCmd = None
        self.lastPid = None
        self.readbuf = ""
        self.waiting = True

    def stop_shell(self) -> None:
        """End the shell; the namespace lives on while its /run/netns name is bound."""
        if self.shell is None:
            return
        try:
            os.killpg(self.pid, 9)
        except ProcessLookupError:
            pass
        self.shell.wait()
        self.stdin.close()
        self.outToNode.pop(self.master, None)
        self.inToNode.pop(self.master, None)
        self.shell = None

