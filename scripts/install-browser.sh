#!/usr/bin/env bash
# Installs what the black-box tests need from Debian, when missing: headless
# Chromium, its WebDriver (chromedriver) and zbarimg (the dashboard's browser
# tests decode the page's QR code) and nginx-light (the scale tests put the
# shipped deploy/nginx/potluck.conf in front of two processes). Installed here,
# before any test runs: tests that installed it themselves ran at the same time
# on a fresh machine and one lost dpkg's lock. Used by scripts/test.sh and .ci/run.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v zbarimg >/dev/null 2>&1 || missing+=(zbar-tools)
[ -x /usr/sbin/nginx ] || [ -x /usr/bin/nginx ] || missing+=(nginx-light)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "== installing ${missing[*]} (black-box tests)"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
