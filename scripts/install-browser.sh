#!/usr/bin/env bash
# Installs what the dashboard's browser tests need, when missing: Debian's
# headless Chromium, its WebDriver (chromedriver) and zbarimg (decodes the
# page's QR code). Used by scripts/test.sh and .ci/run.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
   && command -v zbarimg >/dev/null 2>&1; then
  exit 0
fi
echo "== installing chromium, chromium-driver, zbar-tools (dashboard browser tests)"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver zbar-tools >/dev/null
