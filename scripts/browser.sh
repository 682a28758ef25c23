#!/usr/bin/env bash
# Chromium from Debian's packages, for the report's headless-browser test (tests/browser/test_report.py).
# Installs only when missing (needs root); a no-op where chromium is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "browser.sh: chromium is missing; install it as root: apt-get install --no-install-recommends chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get -q -o DPkg::Lock::Timeout=300 update >/dev/null
apt-get install -q -y --no-install-recommends -o DPkg::Lock::Timeout=300 chromium >/tmp/jobgen-browser-apt.log 2>&1 \
    || { tail -n 30 /tmp/jobgen-browser-apt.log >&2; exit 1; }
echo "browser.sh: $(chromium --version 2>/dev/null || echo chromium) installed"
