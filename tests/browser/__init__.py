"""Tests that drive pages in headless Chromium (Debian's package, installed by scripts/browser.sh)."""
