#!/usr/bin/env bash
# Install Debian's chromium for the browser tests (Playwright drives it; no browser download).
# Skipped when chromium is already there, or when this is not a root Debian machine (the browser
# tests then skip themselves with a reason).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> installing chromium (apt)"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
