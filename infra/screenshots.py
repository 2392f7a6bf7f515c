"""Screenshots of what a user sees in the UIs: the MLflow Model Registry page of a model with two
evaluated versions and the ``champion`` alias, the champion version (its signature), its logged
model (evaluation metrics), a request served by ``mlflow models serve`` (a good and a bad one),
and the Prefect automations that chain the deployments
(``deployments/prefect.yaml``'s triggers), taken with headless Chromium.

    python infra/screenshots.py [--out docs/screenshots] [--chromium chromium]

It starts its own Prefect and MLflow servers on free loopback ports (``infra/services.py``, state
in a temporary folder), registers the deployments, trains two 2-step dit-tiny runs, registers both
checkpoints with evaluation metrics and applies the promotion rule (the second version is better
on every metric, so it becomes the champion), then saves one PNG per page and stops the servers.
Chromium comes from the system (``apt-get install chromium``); without it the script says so.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from infra.load import ROOT, api, deploy, own_servers  # noqa: E402

PAGES = {
    "mlflow-registry-model": "{mlflow}/#/models/{model}",
    "mlflow-registry-version": "{mlflow}/#/models/{model}/versions/{champion}",
    "mlflow-logged-model": "{mlflow}/#/experiments/{experiment}/models/{model_id}",
    "prefect-automations": "{prefect}/automations",
    "prefect-deployments": "{prefect}/deployments",
}
"""Screenshot name -> page URL (the SPA routes of MLflow 3 and Prefect 3)."""

TINY = [
    "--set",
    "model.hidden=64",
    "--set",
    "model.depth=2",
    "--set",
    "model.heads=4",
    "--set",
    "data.batch_size=2",
]


def _train(out: Path, seed: int, env: dict[str, str]) -> dict:
    """A 2-step dit-tiny run logged to the server; its JSON summary."""
    argv = [sys.executable, "-m", "vfm_core.cli", "train", "--recipe", "dit-tiny"]
    argv += ["--steps", "2", "--out", str(out), "--set", f"train.seed={seed}", *TINY]
    argv += ["--set", "tracking.experiment=vfm-screenshots"]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"training for the screenshots failed:\n{p.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text())


def _register(root: Path, env: dict[str, str]) -> dict[str, str]:
    """Two evaluated versions, the second promoted: the model's name, the champion version, its
    logged model's id and experiment."""
    code = (
        "import json, sys\n"
        "from vfm_core.config import TrackingConfig\n"
        "from vfm_core.registry.promotion import promote\n"
        "from vfm_core.registry.register import register_checkpoint\n"
        "runs = json.loads(sys.argv[1])\n"
        "t = TrackingConfig(experiment='vfm-screenshots')\n"
        "out = None\n"
        "for (ckpt, run_id), m in zip(runs, ({'prompt_colour_acc': 0.60, "
        "'prompt_direction_acc': 0.55, 'frechet_distance': 0.40}, {'prompt_colour_acc': 0.98, "
        "'prompt_direction_acc': 1.0, 'frechet_distance': 0.14})):\n"
        "    v = register_checkpoint(ckpt, run_id=run_id, tracking=t, metrics=m)\n"
        "    out = promote(v.name, v.version, tracking=t)\n"
        "import mlflow\n"
        "out['model_id'] = v.model_id\n"
        "out['experiment_id'] = mlflow.get_experiment_by_name(t.experiment).experiment_id\n"
        "print(json.dumps(out))\n"
    )
    runs = []
    for seed in (0, 1):
        out = root / "runs" / f"seed{seed}"
        summary = _train(out, seed, env)
        runs.append([str(out), summary["mlflow_run_id"]])
    p = subprocess.run(
        [sys.executable, "-c", code, json.dumps(runs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    if p.returncode != 0:
        raise RuntimeError(f"registering for the screenshots failed:\n{p.stderr[-2000:]}")
    decision = json.loads(p.stdout.strip().splitlines()[-1])
    return {
        "model": decision["name"],
        "champion": str(decision["champion"]),
        "model_id": decision["model_id"],
        "experiment": decision["experiment_id"],
    }


class Browser:
    """Headless Chromium driven over its DevTools protocol (one page, 1400x900): the Prefect UI
    of an authenticated server reads the auth string from the page's ``localStorage``
    (``prefect-password``, as its login page stores it), which a plain ``--screenshot`` run
    cannot set."""

    def __init__(self, chromium: str, profile: Path) -> None:
        argv = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
        argv += ["--window-size=1400,900", "--remote-debugging-port=0"]
        argv += [f"--user-data-dir={profile}", "about:blank"]
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            if "DevTools listening on ws://" in line:
                port = int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        if port is None:
            self.proc.kill()
            raise RuntimeError("chromium did not start its DevTools endpoint")
        import urllib.request

        from websockets.sync.client import connect

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None)
        self.n = 0

    def call(self, method: str, **params) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=120))
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"chromium: {method}: {msg['error']}")
                return msg.get("result", {})

    def open(self, url: str, wait_s: float = 8.0) -> None:
        self.call("Page.navigate", url=url)
        time.sleep(wait_s)  # the single-page app fetches and renders

    def prefect_login(self, prefect: str, auth: str) -> None:
        """Store the auth string for the Prefect UI's origin, as its login page does."""
        self.open(f"{prefect}/api/health", wait_s=1.0)
        token = base64.b64encode(auth.encode()).decode()
        self.call(
            "Runtime.evaluate", expression=f"localStorage.setItem('prefect-password', '{token}')"
        )

    def shoot(self, url: str, png: Path, *, whole: bool = False) -> None:
        """``url`` as a PNG: the window, or with ``whole`` the page's full height."""
        self.open(url)
        shape = {}
        if whole:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
            shape = {"clip": clip, "captureBeyondViewport": True}
        shot = self.call("Page.captureScreenshot", format="png", **shape)
        png.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self.ws.close()
        self.proc.kill()
        self.proc.wait()


SERVED_PAGE = """<!doctype html><html><body style="font: 15px sans-serif; margin: 24px">
<h2>mlflow models serve -m models:/{model}@champion</h2>
<h3>POST /invocations &rarr; HTTP {status}</h3><pre>{request}</pre>
<pre>{answer}</pre><img src="{sheet}" style="image-rendering: pixelated">
<h3>A bad request &rarr; HTTP {bad_status}</h3><pre>{bad_request}</pre><pre>{bad_answer}</pre>
</body></html>"""


def served_request(model: str, env: dict[str, str], folder: Path) -> Path:
    """Serve the champion (``mlflow models serve``, this environment), send it one good and one
    bad request and write what came back as an HTML page (the video's frames as a contact
    sheet); returns the page."""
    import html
    import urllib.error
    import urllib.request

    from infra.load import free_port
    from vfm_core.video.contact_sheet import contact_sheet

    port = free_port()
    argv = [str(Path(sys.executable).parent / "mlflow"), "models", "serve"]
    argv += ["-m", f"models:/{model}@champion", "--env-manager", "local"]
    argv += ["-h", "127.0.0.1", "-p", str(port), "-w", "1"]
    path = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    log = (folder / "serve.log").open("w")
    proc = subprocess.Popen(argv, env={**env, "PATH": path}, stdout=log, stderr=log, cwd=folder)

    def post(body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(
                        f"mlflow models serve did not start: see {log.name}"
                    ) from None
                time.sleep(1)
        good = {"dataframe_records": [{"prompt": "a red circle moving right", "frames": 9}]}
        status, answer = post(good)
        bad = {"dataframe_records": [{"prompt": "a red circle moving right", "steps": -3}]}
        bad_status, bad_answer = post(bad)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    row = answer["predictions"][0]
    mp4 = folder / "served.mp4"
    mp4.write_bytes(base64.b64decode(row["mp4_base64"]))
    sheet = contact_sheet([mp4], [row["prompt"]], folder / "served.png", columns=5, scale=4)
    shown = {**row, "mp4_base64": row["mp4_base64"][:48] + "... (an MP4)"}
    page = folder / "served.html"
    page.write_text(
        SERVED_PAGE.format(
            model=model,
            status=status,
            request=html.escape(json.dumps(good, indent=1)),
            answer=html.escape(json.dumps({"predictions": [shown]}, indent=1)),
            sheet=sheet.name,
            bad_status=bad_status,
            bad_request=html.escape(json.dumps(bad)),
            bad_answer=html.escape(json.dumps(bad_answer, indent=1)),
        )
    )
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    ap.add_argument("--chromium", default="chromium")
    args = ap.parse_args(argv)
    chromium = shutil.which(args.chromium)
    if chromium is None:
        print(f"{args.chromium}: not found (apt-get install chromium)", file=sys.stderr)
        return 1
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with own_servers("vfm-shots-", only="prefect,worker,mlflow") as (root, env):
            deploy("deployments/prefect.yaml", env)
            ids = _register(root, env)
            prefect = env["PREFECT_API_URL"].removesuffix("/api")
            mlflow = env["MLFLOW_TRACKING_URI"].rstrip("/")
            url = f"{env['PREFECT_API_URL']}/automations/filter"
            code, autos = api("POST", url, {}, auth=env["PREFECT_API_AUTH_STRING"])
            n = len(autos) if code == 200 else "?"
            print(f"{n} automations; model {ids['model']}, champion version {ids['champion']}")
            time.sleep(2)
            browser = Browser(chromium, out / ".chromium")
            try:
                browser.prefect_login(prefect, env["PREFECT_API_AUTH_STRING"])
                for name, page in PAGES.items():
                    url = page.format(mlflow=mlflow, prefect=prefect, **ids)
                    browser.shoot(url, out / f"{name}.png")
                    print(f"{name}: {url} -> {out / name}.png")
                served = served_request(ids["model"], env, root)
                browser.shoot(served.as_uri(), out / "mlflow-served-request.png", whole=True)
                print(f"mlflow-served-request: {served} -> {out}/mlflow-served-request.png")
            finally:
                browser.close()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(out / ".chromium", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
