#!/usr/bin/env bash
# Installs everything cuinterpose needs to build and test, as root, idempotently.
#
# Debian 12 (and Ubuntu 24.04): the build and test packages from the
# distribution, then CRIU >= 4.0. Debian 12 ships CRIU 3.17, which lacks the
# device hooks (PAUSE_DEVICES, CHECKPOINT_DEVICES) the plugin needs, so CRIU
# 4.1.1 is built from Debian's own source tarball (checksum verified) and
# installed under /usr/local with its plugin directory at /usr/lib/criu.
# CRIU's own cuda_plugin.so is kept aside in $BASELINE_DIR: it is the baseline
# for benchmarks and must never sit in the plugin directory next to ours.
# The CRIU source tree is kept in $CRIU_SRC_DIR (CUINTERPOSE_CRIU_SRC, default
# /usr/local/src/criu-4.1.1) with CRIU's own test suite (zdtm) built in it:
# test/zdtm runs zdtm with and without our plugin.
#
# A second run checks and returns in seconds.
set -euo pipefail

CRIU_VERSION=4.1.1
CRIU_TARBALL=criu_${CRIU_VERSION}.orig.tar.xz
CRIU_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
CRIU_PREFIX=/usr/local
CRIU_PLUGINDIR=/usr/lib/criu
BASELINE_DIR=${CRIU_PREFIX}/lib/cuinterpose/baseline
CACHE_DIR=${CUINTERPOSE_DEPS_CACHE:-/var/cache/cuinterpose-deps}
CRIU_SRC_DIR=${CUINTERPOSE_CRIU_SRC:-${CRIU_PREFIX}/src/criu-${CRIU_VERSION}}

PACKAGES=(
	build-essential autoconf automake libtool pkg-config
	libprotobuf-c-dev protobuf-c-compiler libnl-3-dev libnl-genl-3-dev
	check libsubunit-dev clang-format iproute2 util-linux procps
	# CRIU build dependencies
	libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev
	libprotobuf-dev protobuf-compiler uuid-dev python3-protobuf libaio-dev
	xz-utils ca-certificates debian-archive-keyring
	# fuzzing (libFuzzer)
	clang
	# containers (test/container): podman runs runc, which execs the criu
	# on PATH (Debian's crun is built without CRIU); vfs storage and
	# --network none need nothing else, the rest is podman's usual company
	podman runc crun conmon catatonit uidmap fuse-overlayfs slirp4netns
	netavark containernetworking-plugins
	# CRIU's zdtm suite (test/zdtm): Debian's python3 with yaml, the
	# ns/h flavors' iptables, netns_sub_veth's libnl-route
	python3-yaml iptables libnl-route-3-dev
)
# Packages whose names differ between releases: the first available of each
# group is installed (Debian 12 names first).
OPTIONAL_GROUPS=(
	"libclang-rt-14-dev libclang-rt-18-dev libclang-rt-dev"
)

log() { printf 'install-deps: %s\n' "$*"; }
die() { printf 'install-deps: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and CRIU)"

missing_packages() {
	local p
	for p in "${PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
	done
}

optional_missing() {
	local group p
	for group in "${OPTIONAL_GROUPS[@]}"; do
		for p in $group; do
			if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
				continue 2
			fi
		done
		for p in $group; do
			if apt-cache show "$p" >/dev/null 2>&1; then
				echo "$p"
				break
			fi
		done
	done
}

install_packages() {
	local missing
	missing="$(missing_packages) $(optional_missing)"
	missing=$(echo $missing)
	if [ -z "$missing" ]; then
		log "distribution packages: all present"
		return
	fi
	log "installing:" $missing
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# Prints the installed CRIU version as MAJOR.MINOR.PATCH, or nothing.
criu_version() {
	local c
	for c in "${CRIU_PREFIX}/sbin/criu" "$(command -v criu 2>/dev/null || true)"; do
		[ -n "$c" ] && [ -x "$c" ] || continue
		"$c" --version 2>/dev/null | sed -n 's/^Version: *\([0-9.]*\).*/\1/p' && return
	done
}

criu_is_recent() {
	local v
	v=$(criu_version)
	[ -n "$v" ] || return 1
	[ "${v%%.*}" -ge 4 ] || return 1
	[ -f "${CRIU_PREFIX}/include/criu/criu-plugin.h" ] || [ -f /usr/include/criu/criu-plugin.h ]
}

# Fetches Debian's CRIU source tarball through a private apt source list, so
# the system's apt configuration is left untouched. apt also asks for the .dsc
# and the Debian diff, which the pool may no longer hold; the orig tarball is
# all we need, and its checksum is what we trust.
fetch_criu_tarball() {
	local dir=$1 mirror work
	if [ -f "$dir/$CRIU_TARBALL" ] && echo "$CRIU_SHA256  $dir/$CRIU_TARBALL" | sha256sum -c --quiet - 2>/dev/null; then
		return
	fi
	mirror=$(grep -rhoE '^(URIs:|deb) *(\[[^]]*\] *)?https?://[^ ]*debian/?' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
		grep -v security | grep -oE 'https?://[^ ]*' | head -n 1 || true)
	mirror=${mirror:-http://deb.debian.org/debian}
	# apt prunes unknown files from its lists directory: keep the
	# sources file beside it, not in it.
	work=$(mktemp -d)
	chmod 755 "$work"
	mkdir -p "$work/lists/partial"
	echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror%/} trixie main" >"$work/sources.list"
	local opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=- -o "Dir::State::Lists=$work/lists")
	log "fetching $CRIU_TARBALL from ${mirror%/} (trixie source pool)"
	apt-get "${opts[@]}" update -qq >/dev/null 2>&1 || die "cannot read the trixie source index from $mirror"
	(cd "$dir" && apt-get "${opts[@]}" source --download-only "criu=${CRIU_VERSION}-1" >/dev/null 2>&1) || true
	rm -rf "$work"
	[ -f "$dir/$CRIU_TARBALL" ] || die "$CRIU_TARBALL did not arrive from $mirror"
	echo "$CRIU_SHA256  $dir/$CRIU_TARBALL" | sha256sum -c --quiet - ||
		die "$CRIU_TARBALL has the wrong sha256 (want $CRIU_SHA256); refusing to build it"
}

# Unpacks the verified tarball into $CRIU_SRC_DIR, which is kept: CRIU is
# built and installed from it, and zdtm runs from it.
unpack_criu_src() {
	local stamp=$CRIU_SRC_DIR/.cuinterpose-unpacked
	[ -f "$stamp" ] && return
	mkdir -p "$CACHE_DIR" "${CRIU_SRC_DIR%/*}"
	fetch_criu_tarball "$CACHE_DIR"
	rm -rf "$CRIU_SRC_DIR"
	tar -C "${CRIU_SRC_DIR%/*}" -xf "$CACHE_DIR/$CRIU_TARBALL"
	[ -f "$CRIU_SRC_DIR/test/zdtm.py" ] || die "$CRIU_TARBALL did not unpack to $CRIU_SRC_DIR"
	echo "$CRIU_SHA256" >"$stamp"
}

CRIU_MAKE=(PREFIX="$CRIU_PREFIX" PLUGINDIR="$CRIU_PLUGINDIR")

install_criu() {
	if criu_is_recent; then
		log "CRIU $(criu_version): present"
		return
	fi
	unpack_criu_src
	local src=$CRIU_SRC_DIR
	log "building CRIU $CRIU_VERSION in $src"
	local mk=("${CRIU_MAKE[@]}")
	make -C "$src" -j"$(nproc)" "${mk[@]}" criu >"$CACHE_DIR/criu-build.log" 2>&1 ||
		die "CRIU build failed; see $CACHE_DIR/criu-build.log"
	make -C "$src" "${mk[@]}" install-criu >>"$CACHE_DIR/criu-build.log" 2>&1 ||
		die "CRIU install failed; see $CACHE_DIR/criu-build.log"
	# CRIU's cuda_plugin: built for the benchmarks' baseline, installed
	# outside every directory CRIU loads plugins from.
	if make -C "$src" "${mk[@]}" cuda_plugin >>"$CACHE_DIR/criu-build.log" 2>&1; then
		install -D -m 644 "$src/plugins/cuda/cuda_plugin.so" "$BASELINE_DIR/cuda_plugin.so"
	else
		log "warning: CRIU's cuda_plugin did not build; the benchmark baseline is unavailable"
	fi
	hash -r
	criu_is_recent || die "CRIU $CRIU_VERSION installed but '${CRIU_PREFIX}/sbin/criu --version' disagrees"
	log "CRIU $(criu_version) installed in $CRIU_PREFIX (plugins: $CRIU_PLUGINDIR, baseline cuda_plugin: $BASELINE_DIR)"
}

# CRIU's test suite in the kept tree: criu, its python library (pycriu,
# crit) and the zdtm tests. `make -k`: a few of the ~700 tests need what this
# machine may lack; test/zdtm names the ones it runs and skips without them.
ZDTM_STAMP=.cuinterpose-zdtm-built
prepare_zdtm() {
	local src=$CRIU_SRC_DIR log=$CACHE_DIR/zdtm-build.log
	if [ -f "$src/$ZDTM_STAMP" ] && [ -x "$src/criu/criu" ] && [ -f "$src/test/zdtm/lib/libzdtmtst.a" ]; then
		log "zdtm in $src: built"
		return
	fi
	unpack_criu_src
	mkdir -p "$CACHE_DIR"
	log "building CRIU's zdtm suite in $src"
	make -C "$src" -j"$(nproc)" "${CRIU_MAKE[@]}" criu lib >"$log" 2>&1 ||
		die "CRIU (criu lib) did not build in $src; see $log"
	make -k -C "$src/test/zdtm" -j"$(nproc)" >>"$log" 2>&1 ||
		log "warning: some zdtm tests did not build; see $log"
	make -C "$src/test" umount2 zdtm_ct >>"$log" 2>&1 ||
		die "zdtm's helpers (umount2, zdtm_ct) did not build in $src; see $log"
	[ -f "$src/test/zdtm/lib/libzdtmtst.a" ] || die "zdtm's library did not build in $src; see $log"
	touch "$src/$ZDTM_STAMP"
	log "zdtm built in $src"
}

check_plugin_dir() {
	# CRIU runs only the first plugin that handles a hook: its own
	# cuda_plugin beside ours would shadow it.
	if [ -e "$CRIU_PLUGINDIR/cuda_plugin.so" ]; then
		log "warning: $CRIU_PLUGINDIR/cuda_plugin.so is installed; it conflicts with cuinterpose (move it aside)"
	fi
}

install_packages
install_criu
prepare_zdtm
check_plugin_dir
