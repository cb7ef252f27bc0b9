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
# Quiet unless it fails: what apt, debconf and needrestart print is kept, and shown only when
# apt-get fails. needrestart, which apt runs after an install (it scans every process and may
# ask which services to restart), is skipped (NEEDRESTART_SUSPEND; NEEDRESTART_MODE=a restarts
# without asking should one run anyway). `env` sets the variables after sudo, which would
# drop them from its environment (env_reset). Another apt at work (a second `make test`, an
# unattended upgrade) holds dpkg's lock: apt-get waits for it, up to 5 minutes, rather than fail.
apt_get() {
    if ! out=$($sudo env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 \
            NEEDRESTART_MODE=a apt-get -qq -o DPkg::Lock::Timeout=300 "$@" 2>&1 </dev/null); then
        printf '%s\n' "$out" >&2
        echo "make test: apt-get $1 failed (above); install them with: sudo apt-get install -y $missing" >&2
        exit 1
    fi
}
apt_get update
# shellcheck disable=SC2086  # one word per package
apt_get install -y $missing
