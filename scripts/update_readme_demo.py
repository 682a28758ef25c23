"""Run the local demo, put its real summary into README.md (between the demo-summary markers) and
take the screenshot of its report (docs/report.png) with headless Chromium (scripts/browser.sh).

    .venv/bin/python scripts/update_readme_demo.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START, END = "<!-- demo-summary:start -->", "<!-- demo-summary:end -->"


def main() -> int:
    jobgen = str(Path(sys.executable).parent / "jobgen")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "JOBGEN_OUTPUT_ROOT": tmp}
        subprocess.run(
            [jobgen, "submit", str(REPO / "experiments" / "local_demo.toml")],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        table = subprocess.run(
            [jobgen, "summary", "local_demo", "--format", "markdown"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        report = Path(tmp) / "report.html"
        subprocess.run(
            [jobgen, "report", "local_demo", "-o", str(report)], env=env, check=True, stdout=subprocess.DEVNULL
        )
        screenshot(report, REPO / "docs" / "report.png")
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    block = f"{START}\n{table}\n{END}"
    new, count = re.subn(re.escape(START) + ".*?" + re.escape(END), block, text, flags=re.DOTALL)
    if count != 1:
        print(f"README.md has no {START} ... {END} block", file=sys.stderr)
        return 1
    readme.write_text(new, encoding="utf-8")
    print(table)
    return 0


def screenshot(page: Path, png: Path) -> None:
    import shutil

    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                shutil.which("chromium") or "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--screenshot={png}",
                "--window-size=1280,1700",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    print(f"screenshot: {png}")


if __name__ == "__main__":
    sys.exit(main())
