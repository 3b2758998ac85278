"""Retake the Prefect UI pictures in docs/images/ (``make screenshots``).

Starts the local stack the way ``make run`` does (``runledger stack up``, in a temporary folder
and on a free port, so it does not touch ./runledger.db or a stack already running), waits for
the kickoff's completed run of competitor-summary, runs the deployment again for a Duplicate,
starts a review-outbox flow run for the messages the kickoff held (the stack runs with
RUNLEDGER_COMPETITOR_SUMMARY_APPROVAL=1) and opens its Resume form, finds the pages through the
Prefect API, photographs them with Debian's headless Chromium, and stops the stack. Look at every picture before committing it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from flows.ports import free_port  # noqa: E402
from flows.stack import commands  # noqa: E402

IMAGES = ROOT / "docs" / "images"
DEPLOYMENT = "competitor-summary"
REVIEW = "review-outbox"
READY = "runledger local stack is up"
T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1.0)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


@contextmanager
def local_stack(folder: Path, port: int) -> Iterator[Path]:
    """``runledger stack up`` with its own ledger and Prefect home; stopped with Ctrl-C's signal."""
    log = folder / "stack.log"
    env = {**os.environ, "RUNLEDGER_DATABASE_URL": f"sqlite:///{folder}/runledger.db",
           # The kickoff's summaries wait for approval: the review form has messages to show.
           "RUNLEDGER_COMPETITOR_SUMMARY_APPROVAL": "1",
           # The UI asks its API at PREFECT_UI_API_URL, which Prefect derives from port 4200,
           # not from the port the server was started on.
           "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    env.pop("PREFECT_API_URL", None)
    with log.open("w") as out:
        process = subprocess.Popen(
            commands.runledger_argv("stack", "up", "--home", str(folder / "home"),
                                    "--port", str(port)),
            env=env, cwd=folder, stdout=out, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
    try:
        wait_for(lambda: process.poll() is not None or READY in log.read_text(), 600,
                 "the stack and its kickoff")
        if process.poll() is not None:
            raise SystemExit(f"runledger stack up exited:\n{log.read_text()[-3000:]}")
        print(log.read_text().strip())
        yield log
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


class Api:
    """The few Prefect API calls this script needs."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.http.post(path, json=body)
        response.raise_for_status()
        return response.json()

    def get(self, path: str) -> Any:
        response = self.http.get(path)
        response.raise_for_status()
        return response.json()

    def deployment_id(self, name: str) -> str:
        found = self.post("/deployments/filter", {"deployments": {"name": {"any_": [name]}}})
        return str(found[0]["id"])

    def flow_runs(self, deployment_id: str) -> list[dict[str, Any]]:
        return list(self.post("/flow_runs/filter", {
            "deployments": {"id": {"any_": [deployment_id]}}, "sort": "START_TIME_ASC"}))

    def paused(self, run_id: str) -> dict[str, Any] | None:
        run: dict[str, Any] = self.get(f"/flow_runs/{run_id}")
        return run if (run.get("state") or {}).get("type") == "PAUSED" else None

    def finished(self, run_id: str) -> dict[str, Any] | None:
        run: dict[str, Any] = self.get(f"/flow_runs/{run_id}")
        state = run.get("state") or {}
        return run if state.get("type") in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

    def artifact_id(self, run_id: str, key: str) -> str | None:
        found = self.post("/artifacts/filter", {"artifacts": {
            "flow_run_id": {"any_": [run_id]}, "key": {"any_": [key]}}})
        return str(found[0]["id"]) if found else None


class Browser:
    """Headless Chromium driven over the DevTools protocol (websockets, already a dependency of
    Prefect), so that each picture waits in real time for what the single-page UI renders."""

    def __init__(self, width: int, height: int) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            raise SystemExit("needs Debian's chromium: apt-get install -y chromium")
        self.profile = tempfile.TemporaryDirectory(prefix="runledger-chromium-",
                                                   ignore_cleanup_errors=True)
        port = free_port()
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--hide-scrollbars", "--no-first-run",
             "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
             f"--remote-debugging-port={port}", f"--user-data-dir={self.profile.name}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        devtools = f"http://127.0.0.1:{port}"

        def page_socket() -> str | None:
            try:
                pages = httpx.get(f"{devtools}/json/list", timeout=2).json()
            except httpx.HTTPError:
                return None
            return next((p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page"), None)

        self.socket = connect(wait_for(page_socket, 30, "Chromium's DevTools"), max_size=None)
        self.calls = 0
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.calls += 1
        self.socket.send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.calls:
                if "error" in message:
                    raise SystemExit(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def shows(self, text: str) -> bool:
        found = self.call("Runtime.evaluate", returnByValue=True, expression=(
            f"!!document.body && document.body.innerText.includes({json.dumps(text)})"))
        return bool(found.get("result", {}).get("value"))

    def shoot(self, url: str, target: Path, wait_text: list[str], settle: float) -> None:
        """Open ``url``, wait until the page shows every ``wait_text``, let it settle (charts
        and the graph animate in), then save a PNG."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 60
        missing = list(wait_text)
        while missing and time.monotonic() < deadline:
            missing = [text for text in missing if not self.shows(text)]
            time.sleep(0.5)
        time.sleep(settle)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        target.write_bytes(base64.b64decode(data))
        if missing:
            text = self.call("Runtime.evaluate", returnByValue=True,
                             expression="document.body ? document.body.innerText : ''")
            raise SystemExit(f"{url} never showed {missing} (picture kept in {target}); it "
                             f"shows: {str(text.get('result', {}).get('value'))[:1500]}")
        print(f"{target.relative_to(ROOT)}  <-  {url}")

    def click(self, label: str) -> bool:
        """Click the first button whose text is ``label``; False when none is shown yet."""
        found = self.call("Runtime.evaluate", returnByValue=True, expression=(
            "(() => { const b = [...document.querySelectorAll('button')].find("
            f"e => e.innerText.trim() === {json.dumps(label)}); if (b) {{ b.click(); }} "
            "return !!b; })()"))
        return bool(found.get("result", {}).get("value"))

    def shoot_after_click(self, url: str, label: str, target: Path, wait_text: list[str],
                          settle: float) -> None:
        """Open ``url``, click its ``label`` button, then picture what it opens."""
        self.call("Page.navigate", url=url)
        wait_for(lambda: self.click(label), 60, f"a {label!r} button on {url}")
        self.shoot_current(target, wait_text, settle)

    def shoot_current(self, target: Path, wait_text: list[str], settle: float) -> None:
        deadline = time.monotonic() + 60
        missing = list(wait_text)
        while missing and time.monotonic() < deadline:
            missing = [text for text in missing if not self.shows(text)]
            time.sleep(0.5)
        time.sleep(settle)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        target.write_bytes(base64.b64decode(data))
        if missing:
            raise SystemExit(f"the page never showed {missing} (picture kept in {target})")
        print(f"{target.relative_to(ROOT)}  <-  after clicking")

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)
        self.profile.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1400,900", help="window size, W,H")
    parser.add_argument("--settle", type=float, default=4.0,
                        help="seconds to wait after the page shows its content")
    args = parser.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    port = free_port()
    ui = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="runledger-screenshots-") as tmp, \
            local_stack(Path(tmp), port):
        api = Api(f"{ui}/api")
        deployment = api.deployment_id(DEPLOYMENT)
        first = wait_for(lambda: next((r for r in api.flow_runs(deployment)
                                       if api.finished(r["id"])), None), 120, "the kickoff run")
        if first["state"]["name"] != "Completed":
            raise SystemExit(f"the kickoff run ended {first['state']['name']}: "
                             f"{first['state'].get('message')}")
        # The UI's "Run": a new flow run for the period containing now, which the kickoff
        # already completed, so it ends Cached (Prefect's name; the UI lists it) with a message
        # that starts "Duplicate:".
        again = api.post(f"/deployments/{deployment}/create_flow_run", {})
        duplicate = wait_for(lambda: api.finished(again["id"]), 180, "the rerun")
        if duplicate["state"]["name"] != "Cached":
            raise SystemExit(f"the rerun ended {duplicate['state']['name']}, not Cached")
        artifact = wait_for(lambda: api.artifact_id(first["id"], f"{DEPLOYMENT}-tick"), 60,
                            "the tick artifact")
        pages = {  # picture: (page, texts it must show before the picture is taken)
            "flow-run-graph.png": (f"{ui}/runs/flow-run/{first['id']}",
                                   [first["name"], "Completed"]),
            "tick-artifact.png": (f"{ui}/artifacts/artifact/{artifact}",
                                  [f"{DEPLOYMENT}-tick", "acme", "globex"]),
            "duplicate-flow-run.png": (f"{ui}/runs/flow-run/{duplicate['id']}",
                                       [duplicate["name"], "Cached", "Duplicate"]),
            "custom-run-period.png": (f"{ui}/deployments/deployment/{deployment}/run",
                                      ["period"]),
        }
        review = api.post(f"/deployments/{api.deployment_id(REVIEW)}/create_flow_run",
                          {"parameters": {"job": DEPLOYMENT, "poll_seconds": 2}})
        wait_for(lambda: api.paused(review["id"]), 180, "the review-outbox run to pause")
        width, height = (int(n) for n in args.size.split(","))
        browser = Browser(width, height)
        try:
            for name, (url, texts) in pages.items():
                browser.shoot(url, IMAGES / name, texts, args.settle)
            browser.shoot_after_click(f"{ui}/runs/flow-run/{review['id']}", "Resume",
                                      IMAGES / "review-form.png",
                                      ["All messages", "held message(s) to review"], args.settle)
        finally:
            browser.close()


if __name__ == "__main__":
    main()
