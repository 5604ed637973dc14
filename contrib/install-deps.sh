#!/usr/bin/env bash
# Installs everything cuinterpose needs to build and test, as root, idempotently.
#
# Debian 12 (and Ubuntu 24.04): the build and test packages from the
# distribution, then CRIU 4.2.1. Debian 12 ships CRIU 3.17, which lacks the
# device hooks (PAUSE_DEVICES, CHECKPOINT_DEVICES) the plugin needs, so CRIU
# 4.2.1 is built from Debian's own source tarball (checksum verified), fetched
# from the Debian mirror the system's apt already uses, and installed under
# /usr/local with its plugin directory at /usr/lib/criu. Why 4.2.1 and not
# 4.1.1: on VMs that never deliver hardware breakpoints, 4.1.1 waits forever
# in every dump; 4.2 probes them at start and falls back. A CRIU of another
# version under /usr/local is replaced; another criu earlier on PATH is
# refused, so the tests never run a CRIU this script did not build.
# CRIU's own cuda_plugin.so is kept aside in $BASELINE_DIR: it is the baseline
# for benchmarks and must never sit in the plugin directory next to ours.
# The CRIU source tree is kept in $CRIU_SRC_DIR (CUINTERPOSE_CRIU_SRC, default
# /usr/local/src/criu-4.2.1) with CRIU's own test suite (zdtm) built in it:
# test/zdtm runs zdtm with and without our plugin.
#
# A second run checks and returns in seconds.
set -euo pipefail

CRIU_VERSION=4.2.1
CRIU_DEBIAN_VERSION=${CRIU_VERSION}-1
CRIU_SUITE=sid # the Debian source pool that holds this version
CRIU_TARBALL=criu_${CRIU_VERSION}.orig.tar.xz
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
CRIU_PREFIX=/usr/local
CRIU_PLUGINDIR=/usr/lib/criu
BASELINE_DIR=${CRIU_PREFIX}/lib/cuinterpose/baseline
CACHE_DIR=${CUINTERPOSE_DEPS_CACHE:-/var/cache/cuinterpose-deps}
CRIU_SRC_DIR=${CUINTERPOSE_CRIU_SRC:-${CRIU_PREFIX}/src/criu-${CRIU_VERSION}}

PACKAGES=(
	build-essential autoconf automake libtool pkg-config
	libprotobuf-c-dev protobuf-c-compiler libnl-3-dev libnl-genl-3-dev libzstd-dev
	check libsubunit-dev clang-format iproute2 util-linux procps
	# the SHA-256 unit test's reference (libcrypto; not linked by the product)
	libssl-dev
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
	# containerd 1.6 with its runc shim and ctr (test/container/t-containerd.sh
	# starts a private daemon; the packaged service is not used)
	containerd
	# test/stress.sh: the tests under CPU and I/O load
	stress-ng
	# CRIU's zdtm suite (test/zdtm): Debian's python3 with yaml, the
	# ns/h flavors' iptables, netns_sub_veth's libnl-route
	python3-yaml iptables libnl-route-3-dev
	# the Debian packages (debian/, test/pkg): built with Debian's tools,
	# checked by lintian, installed into a clean root made by debootstrap
	debhelper dpkg-dev lintian debootstrap
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
	timeout 900 apt-get update -qq || die "apt-get update failed (or took over 900 s)"
	# shellcheck disable=SC2086
	timeout 1800 apt-get install -y -qq --no-install-recommends $missing >/dev/null || die "apt-get install failed (or took over 1800 s):" $missing
}

# Prints the installed CRIU version as MAJOR.MINOR.PATCH, or nothing.
criu_version() {
	local c
	for c in "${CRIU_PREFIX}/sbin/criu" "$(command -v criu 2>/dev/null || true)"; do
		[ -n "$c" ] && [ -x "$c" ] || continue
		"$c" --version 2>/dev/null | sed -n 's/^Version: *\([0-9.]*\).*/\1/p' && return
	done
}

# True when the CRIU under $CRIU_PREFIX is the version this script builds,
# with its plugin header.
criu_is_current() {
	[ "$(criu_version)" = "$CRIU_VERSION" ] && [ -f "${CRIU_PREFIX}/include/criu/criu-plugin.h" ]
}

# A plain `criu` must run ours: another one earlier on PATH (a distribution
# package, an older build) would mix CRIU versions silently.
check_criu_on_path() {
	local c v
	c=$(command -v criu 2>/dev/null || true)
	[ "$c" = "${CRIU_PREFIX}/sbin/criu" ] && return
	v=$("$c" --version 2>/dev/null | sed -n 's/^Version: *\([0-9.]*\).*/\1/p' || true)
	die "'criu' on PATH is ${c:-missing} (CRIU ${v:-of unknown version}), not ${CRIU_PREFIX}/sbin/criu (CRIU $CRIU_VERSION): remove it (Debian's package: apt-get remove criu) or put ${CRIU_PREFIX}/sbin first in PATH"
}

# The Debian mirror the system's apt already uses (one-line .list files and
# deb822 .sources files alike); security and update suites hold no sid pool.
system_mirror() {
	cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
		grep -E '^[[:space:]]*(URIs:|deb[[:space:]])' | grep -oE 'https?://[^ ]+' |
		grep -v -e 'security' -e 'updates' | head -n 1 || true
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
	mirror=$(system_mirror)
	[ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources.list or /etc/apt/sources.list.d/: $CRIU_TARBALL is fetched from the mirror apt already uses (or place it, sha256 $CRIU_SHA256, in $dir)"
	# apt prunes unknown files from its lists directory: keep the
	# sources file beside it, not in it.
	work=$(mktemp -d)
	chmod 755 "$work"
	mkdir -p "$work/lists/partial"
	echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror%/} $CRIU_SUITE main" >"$work/sources.list"
	local opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=- -o "Dir::State::Lists=$work/lists")
	log "fetching $CRIU_TARBALL from ${mirror%/} ($CRIU_SUITE source pool)"
	timeout 600 apt-get "${opts[@]}" update -qq >/dev/null 2>&1 || die "cannot read the $CRIU_SUITE source index from $mirror (or it took over 600 s)"
	(cd "$dir" && timeout 600 apt-get "${opts[@]}" source --download-only "criu=$CRIU_DEBIAN_VERSION" >/dev/null 2>&1) || true
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
	if criu_is_current; then
		log "CRIU $(criu_version): present"
		check_criu_on_path
		return
	fi
	[ -z "$(criu_version)" ] || log "replacing CRIU $(criu_version) in $CRIU_PREFIX with $CRIU_VERSION"
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
	criu_is_current || die "CRIU $CRIU_VERSION installed but '${CRIU_PREFIX}/sbin/criu --version' disagrees"
	check_criu_on_path
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

# A clean root for test/pkg: the distribution's minimal base (debootstrap
# --variant=minbase, the release and mirror apt already uses) plus the
# libraries the packages and the CRIU built above load, and nothing of
# cuinterpose. Kept in $CLEAN_ROOT; test/pkg copies it for each run. The
# libraries are installed here so that installing the packages needs no
# network at test time.
CLEAN_ROOT=$CACHE_DIR/clean-root
CLEAN_ROOT_LIBS=libprotobuf-c1,libnl-3-200,libbsd0,libgnutls30,libnftables1,libnet1,libuuid1,mount
prepare_clean_root() {
	local suite mirror log=$CACHE_DIR/clean-root.log
	suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	if [ -f "$CLEAN_ROOT/.cuinterpose-root" ] && [ "$(cat "$CLEAN_ROOT/.cuinterpose-root")" = "$suite $CLEAN_ROOT_LIBS" ]; then
		log "clean root for the package test: $CLEAN_ROOT ($suite)"
		return
	fi
	mirror=$(system_mirror)
	[ -n "$suite" ] && [ -n "$mirror" ] || die "no release name in /etc/os-release or no mirror in apt's sources: the package test's clean root cannot be made"
	log "making a clean $suite root for the package test in $CLEAN_ROOT (debootstrap from ${mirror%/})"
	rm -rf "$CLEAN_ROOT.tmp" "$CLEAN_ROOT"
	mkdir -p "$CACHE_DIR"
	timeout 900 debootstrap --variant=minbase --include="$CLEAN_ROOT_LIBS" "$suite" "$CLEAN_ROOT.tmp" "${mirror%/}" >"$log" 2>&1 ||
		die "debootstrap of a clean $suite root failed (or took over 900 s); see $log"
	rm -rf "$CLEAN_ROOT.tmp/var/cache/apt/archives/"*.deb
	echo "$suite $CLEAN_ROOT_LIBS" >"$CLEAN_ROOT.tmp/.cuinterpose-root"
	mv "$CLEAN_ROOT.tmp" "$CLEAN_ROOT"
	log "clean root made: $CLEAN_ROOT ($(du -sm "$CLEAN_ROOT" | cut -f1) MiB)"
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
prepare_clean_root
check_plugin_dir
