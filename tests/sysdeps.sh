#!/bin/sh
# The system packages the test suite needs (Debian names). `make test` runs this first: it
# installs what is missing when it can (root, or passwordless sudo), else stops at once with
# one line naming the command to run. Nothing is skipped later for want of a package.
set -eu

missing=""
need() {  # need COMMAND-OR-PATH-GLOB PACKAGE
    case "$1" in
        /*) for f in $1; do [ -e "$f" ] && return 0; done ;;
        *) command -v "$1" >/dev/null 2>&1 && return 0 ;;
    esac
    case " $missing " in *" $2 "*) ;; *) missing="$missing $2" ;; esac
}

need gpg gnupg
need gpg-agent gpg-agent
need gpgconf gnupg
need git git
need ssh-agent openssh-client
need ssh-keygen openssh-client
need curl curl
need chromium chromium
need docker-compose docker-compose
need systemd-analyze systemd
need '/usr/lib/postgresql/*/bin/initdb' postgresql

[ -z "$missing" ] && exit 0
missing=${missing# }
if [ "$(id -u)" = 0 ]; then
    sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
else
    echo "make test needs these packages; install them with: sudo apt-get install -y $missing" >&2
    exit 1
fi
echo "installing the packages the tests need: $missing"
$sudo apt-get update -q >/dev/null
# shellcheck disable=SC2086  # one word per package
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q $missing >/dev/null
