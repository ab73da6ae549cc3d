"""`mrc-emu view` on a running fabric, as a user meets it: the page in headless Chromium, its
actions, and the state endpoint scripts read (issue 28). Needs root (a fabric) and, for the
page, Debian's chromium (skipped, saying so, without it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import browser
import pytest

pytestmark = pytest.mark.system

MRC_EMU = str(Path(sys.executable).with_name("mrc-emu"))
LINK = "p0l0-p0s1"  # under EV 1 of h0 -> h2 on the default topology


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MRC_EMU, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def view(default_fabric):
    """`mrc-emu view` on the default fabric (any free port): its URL; stopped afterwards."""
    process = subprocess.Popen([MRC_EMU, "view", "--name", default_fabric.name, "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        stderr = process.stderr.read() if process.poll() is not None else ""
        assert "http://127.0.0.1:" in line, f"the view did not start: {line!r} {stderr}"
        yield line.split(" on ", 1)[1].split()[0]
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0, process.stderr.read()


def states(url: str, query: str = "", timeout: float = 300.0):
    """The `state` events of /api/events, as they come (for at most `timeout` s: then the test fails)."""
    deadline = time.monotonic() + timeout
    with urllib.request.urlopen(f"{url}api/events{query}", timeout=30) as stream:
        event = None
        for raw in stream:
            assert time.monotonic() < deadline, f"no state of the kind awaited on /api/events within {timeout:g} s"
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "state":
                yield json.loads(line[6:])


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}api/action", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def faults(name: str) -> list[dict]:
    listed = cli("fault", "list", "--name", name, "--json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


CLICK = """(() => {{ const target = document.querySelector('{selector}');
  const box = target.getBoundingClientRect();
  target.dispatchEvent(new MouseEvent('click', {{bubbles: true, clientX: box.x + box.width / 2,
                                                 clientY: box.y + box.height / 2}}));
  return true; }})()"""
MESSAGE = "(m => m.dataset.ok !== undefined && m.textContent)(document.querySelector('#message'))"


def choose(page: browser.Chromium, selector: str, action: str) -> str:
    """Click what `selector` names, then `action` in the menu it opens; the message the page shows."""
    page.evaluate("document.querySelector('#message').removeAttribute('data-ok')")
    page.evaluate(CLICK.format(selector=selector))
    page.wait_until(f"!document.querySelector('#menu').hidden && !!document.querySelector('#menu button[data-action={action}]')",
                    what=f"the menu offering {action}")
    page.evaluate(f"document.querySelector('#menu button[data-action={action}]').click()")
    return page.wait_until(MESSAGE, what="the action's message")


def test_a_link_downed_through_the_page_is_down_in_the_page_the_fault_list_and_the_next_state(default_fabric, view,
                                                                                                 tmp_path):
    if reason := browser.missing():
        pytest.skip(reason)
    name = default_fabric.name
    link_state = f"document.querySelector('[data-link=\"{LINK}\"]').dataset.state"
    with browser.Chromium(tmp_path / "profile") as page:
        page.navigate(view)
        page.wait_until(f"window.mrcView?.state?.fabric === '{name}'", what="the fabric's state")
        assert page.evaluate(link_state) == "up"
        assert page.evaluate("document.querySelectorAll('[data-link]').length") == len(default_fabric.topology.links)
        page.screenshot(tmp_path / "before.png")

        said = choose(page, f'[data-link-hit="{LINK}"]', "down")
        assert said == f"{LINK} down"
        assert page.evaluate("document.querySelector('#message').dataset.ok") == "true"
        seq_after_action = page.evaluate("window.mrcView.state.seq")
        page.wait_until(f"{link_state} === 'down'", what=f"{LINK} marked down")
        assert "down" in page.evaluate(f"document.querySelector('[data-link-label=\"{LINK}\"]').textContent")
        shot = page.screenshot(tmp_path / "link-down.png")
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if target := os.environ.get("MRC_EMU_VIEW_SCREENSHOT"):  # how docs/view-live.png was made
            shutil.copy(shot, target)

        # in `fault list`, by the view
        (entry,) = faults(name)
        assert (entry["kind"], entry["target"], entry["by"]) == ("link-down", LINK, "view")
        # in the next state update a script reads
        nxt = next(s for s in states(view) if s["seq"] > seq_after_action)
        assert nxt["links"][LINK]["state"] == "down"
        assert [f["kind"] for f in nxt["links"][LINK]["faults"]] == ["link-down"]
        assert all(v["state"] == "up" for k, v in nxt["links"].items() if k != LINK)

        # bad input: a fault on a link already faulted is refused in the page and changes nothing
        said = choose(page, f'[data-link-hit="{LINK}"]', "blackhole")
        assert page.evaluate("document.querySelector('#message').dataset.ok") == "false"
        assert said.startswith(f"{LINK} already has a link-down (fault {entry['id']}")
        assert faults(name) == [entry]
        # an unknown link, through the same endpoint the page uses
        status, answer = post(view, {"action": "down", "link": ["p0l0", "p9s9"]})
        assert status == 400 and "no node 'p9s9'" in answer["error"]
        assert faults(name) == [entry]

        # a spine drained through the page is in the controller record (`ev list`)
        said = choose(page, '[data-node="p1s2"]', "drain")
        assert said.startswith("p1s2 drained")
        page.wait_until("document.querySelector('[data-node=\"p1s2\"]').dataset.drained === 'true'", what="p1s2 drained")
        listed = json.loads(cli("ev", "list", "--name", name, "--json").stdout)
        assert listed and {r["spine"] for r in listed if r["state"] == "DENIED"} == {"p1s2"}
        assert {r["why"] for r in listed} == {"p1s2 (by view)"}

        # and back up through the page
        assert choose(page, f'[data-link-hit="{LINK}"]', "up") == f"{LINK} up (its configuration re-applied)"
        page.wait_until(f"{link_state} === 'up'", what=f"{LINK} up again")
        assert faults(name) == []


def test_a_running_write_shows_its_evs_and_their_events_on_the_state_stream(default_fabric, view):
    """A WRITE over a blackholed link: the stream shows the transfer, the EV through the link
    ASSUMED_BAD, the event in the log, and the transfer finished whole."""
    name = default_fabric.name
    assert post(view, {"action": "blackhole", "link": LINK.split("-")})[0] == 200
    sending = subprocess.Popen([MRC_EMU, "send", "h0", "h2", "--size", "16MiB", "--name", name, "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for state in states(view):
            transfers = [t for t in state["transfers"] if t["pid"] == sending.pid]
            if transfers and transfers[0]["run"] == "finished":
                final = transfers[0]
                log = state["ev_log"]
                break
    finally:
        out, err = sending.communicate(timeout=300)
    assert sending.returncode == 0, err
    result = json.loads(out)
    assert final["progress"] == 1.0 and final["bytes_acked"] == 16 * 2**20 and final["done"]
    evs = {e["ev"]: e for e in final["evs"]}
    assert evs[1]["spine"] == "p0s1"
    bad = [e for e in result["ev_events"] if e["new"] == "ASSUMED_BAD"]
    assert bad and all(e["ev"] == 1 for e in bad)  # the send's own report: EV 1 through the blackhole
    shown = [(e["ev"], e["old"], e["new"], e["time_ms"]) for e in log if e["transfer"] == final["id"]]
    reported = [(e["ev"], e["old"], e["new"], e["time_ms"]) for e in result["ev_events"]]
    assert shown and shown == reported[:len(shown)]  # as the send reports them (a probe may revive EV 1 after the end)
    assert (bad[0]["ev"], "GOOD", "ASSUMED_BAD", bad[0]["time_ms"]) in shown
    shares = {e["ev"]: e["share"] for e in final["evs"]}
    assert abs(sum(shares.values()) - 1) < 0.01
    assert shares[1] < min(s for ev, s in shares.items() if ev != 1)  # the blackholed EV carried least


SCENARIO = """name: view-run
description: One WRITE, no fault, for run --view.
topology: default
transports: [mrc]
routing: none
workloads:
  - {kind: write, src: h0, dst: h2, size: 16MiB}
faults: []
"""


def test_run_with_view_follows_the_scenarios_own_fabric(tmp_path):
    """`run --view`: the page's state follows the fabric the scenario builds (whatever its name)
    and shows its WRITE; read-only; the view ends with the run."""
    (tmp_path / "scn.yaml").write_text(SCENARIO)
    run = subprocess.Popen([MRC_EMU, "run", str(tmp_path / "scn.yaml"), "--view", "--view-port", "0", "--out",
                            str(tmp_path / "out"), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = run.stderr.readline()
        while "view: http" not in line:
            assert line, f"run --view said no URL: {run.stdout.read()}"
            line = run.stderr.readline()
        url = line.split("view: ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        seen = next(s for s in states(url) if s["fabric"] and any(t["src"] == "h0" for t in s["transfers"]))
        assert post(url, {"action": "down", "link": ["p0l0", "p0s1"]}) == (
            403, {"ok": False, "error": "actions are off: this view was started with --read-only"})
    finally:
        out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    results = json.loads(out)
    assert seen["fabric"] == results["fabric"]
    (transfer,) = [t for t in seen["transfers"] if t["src"] == "h0"]
    assert (transfer["dst"], transfer["size"], transfer["pid"]) == ("h2", 16 * 2**20, run.pid)
    with pytest.raises(urllib.error.URLError):  # the view ended with the run
        urllib.request.urlopen(f"{url}api/topology", timeout=5)
