# containerd checkpoint/restore of a sharing job in a container, with our
# plugin on the host: run by `make check` (test/container/Makefile.am) under
# e2e_reaper, with test/e2e/lib.sh's helpers and job (e2e_group).
#
# containerd is Debian 12's 1.6 (its runc shim, io.containerd.runc.v2, and
# ctr), started here as a private daemon: its root, state, sockets and
# configuration live under $T; only the shim's socket directory
# (/run/containerd/s) and ctr's fifo directory are fixed, and the test removes
# whichever of them it created.
# How the configuration reaches criu, as a user sets it up:
# - containerd's environment: the shim, runc and the criu that runc runs in
#   swrk mode inherit it. FAKECUDA_SOCKET, LD_LIBRARY_PATH and CUINTERPOSE_*
#   are set there (on a host, `Environment=` in a systemd drop-in for
#   containerd.service), and so is PATH: runc runs the criu on its PATH.
# - The container's `org.criu.config` annotation (`ctr run --annotation`;
#   Kubernetes passes pod annotations the same way) names a CRIU
#   configuration file for runc: `libdir`, a directory holding only our
#   plugin. containerd keeps the annotation in the container's spec, so the
#   restore finds it too.
# - ctr run --runc-binary: the shim runs $T/runc, which runs runc and keeps a
#   copy of criu's logs for this test (the shim deletes them on success).
# The image is made here as an OCI archive (the build's job, the interposer,
# the fake driver and the host's glibc) and imported with `ctr images import`.
# Cycle 1: `ctr containers checkpoint --task --image` (the job goes on and
# writes more); the container is deleted and restored with `ctr containers
# restore --live`: the bytes are those of the checkpoint, the addresses are
# the same, one rank's write is seen by all. Cycle 2: the same again, the
# checkpoint image exported with `ctr images export`, then imported into a
# second containerd with a root of its own (as on another host) and restored
# there under a new name. Then a host process imports memory from the
# container's creator: the checkpoint is refused naming it, and the container
# keeps running with its bytes intact.
. "$srcdir/../e2e/lib.sh"
. "$srcdir/lib-ctr.sh"

[ "${SANITIZE:-}" = yes ] &&
	skip "sanitizer build: the glibc-only image and runc's criu cannot carry the sanitizer runtime (the plain build runs this test)"
for t in containerd ctr containerd-shim-runc-v2 runc nsenter; do
	command -v $t >/dev/null || skip "$t not installed (contrib/install-deps.sh installs containerd and runc from Debian 12)"
done
OUTSIDE=$B/test/container/ctr_outside
[ -x "$OUTSIDE" ] || skip "ctr_outside not built ($OUTSIDE)"
"$CRIU" --version | grep -q '^Version: 4\.' || skip "$CRIU is not CRIU 4.x: $("$CRIU" --version | head -1)"
RUNC=$(command -v runc)
# the container sits in cgroups of its own, which criu dumps
named_cgroups_mountable
N=3
NS=cuinterpose-test
IMAGE=localhost/cuinterpose-test:1
SYSTEM_PATHS="/run/containerd/s /run/containerd/fifo /run/containerd"
CREATED=
for p in $SYSTEM_PATHS; do [ -e "$p" ] || CREATED="$CREATED $p"; done
HOSTS=
OPID=

cleanup() {
	local h c

	[ -n "$OPID" ] && kill "$OPID" 2>/dev/null
	for h in $HOSTS; do
		for c in $(CTR_HOST=$h cr containers ls -q 2>/dev/null); do
			CTR_HOST=$h cr task kill -s KILL "$c" >/dev/null 2>&1
			CTR_HOST=$h cr task rm -f "$c" >/dev/null 2>&1
			CTR_HOST=$h cr containers rm "$c" >/dev/null 2>&1
		done
		[ -f "$T/$h/containerd.pid" ] && kill "$(cat "$T/$h/containerd.pid")" 2>/dev/null
	done
	"$FAKERUN" --stop >/dev/null 2>&1
	findmnt -rn -o TARGET | grep "^$T/" | sort -r | while read -r m; do umount -l "$m"; done
	for c in /sys/fs/cgroup/$NS /sys/fs/cgroup/*/$NS; do
		[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	for p in $CREATED; do rmdir "$p" 2>/dev/null; done
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}

# cr ARGS: ctr against host $CTR_HOST's containerd (default a), bounded.
cr() { bounded ctr --address "$T/${CTR_HOST:-a}/containerd.sock" --namespace $NS "$@"; }

# start_containerd HOST: a private containerd whose environment carries the
# configuration for criu and the plugin, as a systemd drop-in would.
start_containerd() {
	local h=$1 d=$T/$1 i=0

	mkdir -p "$d/root" "$d/state" "$d/opt" "$d/tmp"
	cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/opt"
EOF
	# TMPDIR: containerd makes each checkpoint's image directory
	# (ctrd-checkpoint*) there (in /tmp without it), and a checkpoint that
	# fails or a daemon killed mid-checkpoint left them behind; under $T
	# they go with it.
	env -i PATH="$(dirname "$CRIU"):/usr/sbin:/usr/bin:/sbin:/bin" TMPDIR="$d/tmp" \
		FAKECUDA_SOCKET="$FAKECUDA_SOCKET" LD_LIBRARY_PATH="$B/test/fakecuda/.libs" \
		CUINTERPOSE_STAGING_MB="$CUINTERPOSE_STAGING_MB" CUINTERPOSE_LOCK_TIMEOUT_MS="$CUINTERPOSE_LOCK_TIMEOUT_MS" \
		setsid containerd --config "$d/config.toml" </dev/null >"$d/containerd.log" 2>&1 &
	echo $! >"$d/containerd.pid"
	HOSTS="$HOSTS $h"
	waiting "containerd ($h) to answer on $d/containerd.sock"
	while ! CTR_HOST=$h bounded ctr --address "$d/containerd.sock" version >/dev/null 2>&1; do
		alive "$(cat "$d/containerd.pid")" || fail "containerd ($h) exited: $(tail -3 "$d/containerd.log")"
		i=$((i + 1))
		[ $i -gt 300 ] && fail "containerd ($h) did not answer on $d/containerd.sock in $(elapsed "$WAIT_US") s"
		nap 0.05
	done
	waited
}

# --- the runtime, criu's configuration, the daemon ----------------------------
mkdir -p "$T/logs"
cat >"$T/runc" <<EOF
#!/bin/sh
# The shim's runc (ctr run --runc-binary): runc itself. criu's dump.log and
# restore.log are copied for the test from runc's --work-path or, where
# the shim gives none, the --image-path (the shim removes both afterwards).
'$RUNC' "\$@"
rc=\$?
prev=
for a in "\$@"; do
	case \$prev in --work-path | --image-path) cp "\$a"/*.log '$T/logs/' 2>/dev/null ;; esac
	prev=\$a
done
echo "\$* -> \$rc" >>'$T/runc.calls'
exit \$rc
EOF
chmod +x "$T/runc"
printf 'libdir %s\n' "$T/plugins" >"$T/criu.conf"
"$FAKERUN" --start || fail "fake driver"
note "containerd (host a)"
start_containerd a
cr version | grep -q "Version: *v\?1\." || note "containerd: $(cr version | grep Version | tail -1)"

# --- the image: an OCI archive of the build's pieces and the host's glibc -----
R=$T/rootfs
mkdir -p "$R/bin" "$R/w" "$R/run/fakecuda" "$R/run/cuinterpose" "$R/usr/lib/cuinterpose" \
	"$R/proc" "$R/sys" "$R/dev" "$R/tmp" "$R/etc"
for f in $(ldd "$WORKLOAD" | awk '/=> \// {print $3} /^\t\/[^ ]*ld-linux/ {print $1}'); do
	case $f in */libcuda.so.1) continue ;; esac
	mkdir -p "$R$(dirname "$f")"
	cp -L "$f" "$R$f"
done
libdir=$(dirname "$(ldd "$WORKLOAD" | awk '/libc\.so\.6 =>/ {print $3}')")
cp -L "$B/test/fakecuda/.libs/libcuda.so.1" "$R$libdir/libcuda.so.1"
cp "$WORKLOAD" "$R/bin/e2e_group"
cp "$OUTSIDE" "$R/bin/ctr_outside"
cp -L "$(command -v env)" "$R/bin/env"
cp "$INTERPOSER" "$R/usr/lib/cuinterpose/libcuinterpose.so"
echo "cuinterpose:x:0:0::/:/bin/e2e_group" >"$R/etc/passwd"
O=$T/oci
mkdir -p "$O/blobs/sha256"
blob() { # FILE: into the layout's blobs; prints "DIGEST SIZE"
	local d
	d=$(sha256sum "$1" | cut -d' ' -f1)
	mv "$1" "$O/blobs/sha256/$d"
	echo "$d $(stat -c %s "$O/blobs/sha256/$d")"
}
tar -C "$R" --owner=0 --group=0 -cf "$T/layer.tar" .
read -r ldig lsize < <(blob "$T/layer.tar")
printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
	"$ldig" >"$T/config.json"
read -r cdig csize < <(blob "$T/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
	"$cdig" "$csize" "$ldig" "$lsize" >"$T/manifest.json"
read -r mdig msize < <(blob "$T/manifest.json")
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"1"}}]}' \
	"$mdig" "$msize" "$IMAGE" >"$O/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$O/oci-layout"
tar -C "$O" -cf "$T/image.tar" .
note "ctr images import"
cr images import --snapshotter native "$T/image.tar" >"$T/import.log" 2>&1 || fail "ctr images import: $(tail -3 "$T/import.log")"
cr images ls -q | grep -qx "$IMAGE" || fail "the image is not in the store: $(cr images ls -q)"

# --- the job ------------------------------------------------------------------
note "ctr run"
cr run -d --null-io --snapshotter native --runc-binary "$T/runc" --runc-root "$T/runc-state" \
	--annotation org.criu.config="$T/criu.conf" \
	--mount "type=bind,src=$FAKECUDA_SOCKET,dst=/run/fakecuda/devd.sock,options=rbind:rw" \
	--mount "type=bind,src=$T/w,dst=/w,options=rbind:rw" \
	--env FAKECUDA_SOCKET=/run/fakecuda/devd.sock --env CUINTERPOSE_SOCKET_DIR=/run/cuinterpose \
	--env LD_PRELOAD=/usr/lib/cuinterpose/libcuinterpose.so \
	"$IMAGE" job /bin/e2e_group /w $N >"$T/run.log" 2>&1 || fail "ctr run: $(tail -3 "$T/run.log")"

# ctr_task_pid ID / ctr_task_state ID: from `ctr task ls` of $CTR_HOST
ctr_task_pid() { cr task ls | awk -v id="$1" '$1 == id {print $2}'; }
ctr_task_state() { cr task ls | awk -v id="$1" '$1 == id {print $3}'; }
wait_ready $N
[ "$JOBPID" = 1 ] || fail "the job's root is pid $JOBPID in the container, not 1: no pid namespace"
init=$(ctr_task_pid job)
[ "${init:-0}" -gt 1 ] || fail "no host pid for the container's init: '$init'"
for ns in pid mnt net; do
	[ "$(readlink /proc/"$init"/ns/$ns)" != "$(readlink /proc/self/ns/$ns)" ] || fail "the container shares the host's $ns namespace"
done
grep -q " create --bundle " "$T/runc.calls" || fail "the shim did not run the runtime through $T/runc: $(cat "$T/runc.calls" 2>/dev/null)"
cmd $N verify 0
before=$(answers $N)
cmd $N write 2 1
cmd $N verify 1

# checkpoint ID REF: the task and the image into the store, the job running.
checkpoint() {
	rm -f "$T"/logs/*
	cr containers checkpoint --task --image "$1" "$2" >"$T/ckpt.log" 2>&1
}
# images_of REF DIR: unpack the checkpoint image's criu images from the store
images_of() {
	local idx dig

	idx=$(cr images ls | awk -v r="$1" '$1 == r {print $3}')
	[ -n "$idx" ] || fail "no checkpoint image $1 in the store"
	dig=$(cr content get "$idx" | python3 -c '
import json, sys
for m in json.load(sys.stdin)["manifests"]:
    if m["mediaType"].endswith("criu.checkpoint.criu.tar"):
        print(m["digest"])')
	[ -n "$dig" ] || fail "checkpoint $1 holds no criu images: $(cr content get "$idx")"
	mkdir -p "$2"
	cr content get "$dig" | tar -C "$2" -xf - || fail "cannot unpack the criu images of $1"
}
# export_checkpoint REF TAR: the checkpoint image as an OCI archive: its
# index.json names the checkpoint's index as image REF; the blobs are that
# index, every blob it names, and the image manifest's. containerd 1.6's
# `ctr images export` cannot write a checkpoint image (it takes the options
# blob for a manifest: "unable to create manifests file: invalid
# character"), and `ctr images import --index-name` keeps only the media
# types it knows (the restore then fails: "media type not found").
export_checkpoint() {
	local idx d x=$T/export-$1

	idx=$(cr images ls | awk -v r="$1" '$1 == r {print $3}')
	[ -n "$idx" ] || fail "no checkpoint image $1 in the store"
	mkdir -p "$x/blobs/sha256"
	cr content get "$idx" >"$x/blobs/sha256/${idx#sha256:}" || fail "ctr content get $idx"
	printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"%s","size":%s,"annotations":{"io.containerd.image.name":"%s"}}]}' \
		"$idx" "$(stat -c %s "$x/blobs/sha256/${idx#sha256:}")" "$1" >"$x/index.json"
	echo '{"imageLayoutVersion":"1.0.0"}' >"$x/oci-layout"
	for d in $(python3 - "$x/blobs/sha256/${idx#sha256:}" <<'PY'
import json, sys
idx = json.load(open(sys.argv[1]))
for m in idx["manifests"]:
    print(m["digest"])
PY
	); do
		cr content get "$d" >"$x/blobs/sha256/${d#sha256:}" || fail "ctr content get $d"
	done
	for d in $(cat "$x"/blobs/sha256/* | python3 -c '
import json, sys
for line in sys.stdin.buffer.read().split(b"\n"):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if isinstance(m, dict) and "layers" in m:
        print(m["config"]["digest"])
        for l in m["layers"]:
            print(l["digest"])'); do
		cr content get "$d" >"$x/blobs/sha256/${d#sha256:}" || fail "ctr content get $d"
	done
	tar -C "$x" -cf "$2" . || fail "cannot write $2"
}
# remove ID: the task killed, the container deleted. The task goes once
# it stopped (10 s at most): removed while its killed processes still exit,
# it failed once on a loaded machine; ctr's words go into the failure.
remove() {
	local i=0

	cr task kill -s KILL "$1" >/dev/null 2>&1
	waiting "container $1's task to stop"
	while [ "$(ctr_task_state "$1")" = RUNNING ] && [ $i -lt 200 ]; do
		i=$((i + 1))
		nap 0.05
	done
	waited
	cr task rm -f "$1" >"$T/remove.out" 2>&1 || fail "ctr task rm $1: $(tail -3 "$T/remove.out")"
	cr containers rm "$1" >"$T/remove.out" 2>&1 || fail "ctr containers rm $1: $(tail -3 "$T/remove.out")"
}
restore() { # ID REF
	rm -f "$T"/logs/*
	cr containers restore --live "$1" "$2" </dev/null >"$T/restore.log" 2>&1
}
restored_ok() { # ID
	[ "$(ctr_task_state "$1")" = RUNNING ] || fail "restored container $1 is $(ctr_task_state "$1")"
	grep -q "RESUME_DEVICES_LATE done: $N participants rebuilt" "$T"/logs/restore.log ||
		fail "no completion line in restore.log: $(grep cuinterpose "$T"/logs/restore.log | tail -3)"
}

# --- cycle 1: checkpoint (running), restore in place --------------------------
note "checkpoint 1"
t0=$(date +%s.%N)
checkpoint job ck1 || fail "ctr containers checkpoint 1: $(tail -5 "$T/ckpt.log")"
t1=$(date +%s.%N)
grep -q "cuinterpose: dump of tree $init: $N processes, $N participants" "$T"/logs/dump.log ||
	fail "our plugin did not see the container's $N processes: $(grep cuinterpose "$T"/logs/dump.log | head -5)"
grep -q "cuinterpose: SAVE: " "$T"/logs/dump.log || fail "no SAVE line in dump.log"
[ "$(ctr_task_state job)" = RUNNING ] || fail "after the checkpoint the container is $(ctr_task_state job)"
images_of ck1 "$T/ck1"
"$B/cli/cuinterpose" show "$T/ck1" >"$T/show.txt" 2>&1 || fail "cuinterpose show: $(tail -3 "$T/show.txt")"
grep -q "$N participants" "$T/show.txt" || fail "cuinterpose show: $(head -3 "$T/show.txt")"
grep -q "^OK: every image decodes" "$T/show.txt" || fail "cuinterpose show: $(tail -3 "$T/show.txt")"
cmd $N verify 1
[ "$(answers $N)" = "$before" ] || fail "addresses changed after the checkpoint: $(answers $N) vs $before"
cmd $N write 0 2
cmd $N verify 2
remove job
note "restore 1"
t2=$(date +%s.%N)
restore job ck1 || fail "ctr containers restore 1: $(tail -5 "$T/restore.log")"
t3=$(date +%s.%N)
restored_ok job
cmd $N verify 1
[ "$(answers $N)" = "$before" ] || fail "addresses changed after restore 1: $(answers $N) vs $before"
cmd $N write 1 3
cmd $N verify 3

# --- cycle 2: checkpoint, export, restore on host b under a new name ----------
note "checkpoint 2"
# Measured with containerd 1.6.20: a second `containers checkpoint --task`
# into a store that still holds the first one writes an image without the
# task (no criu images, no error; its checkpoint options are the same blob
# as the first's). Remove the first checkpoint and its blobs (--sync
# collects them now) before the next.
cr images rm --sync ck1 >/dev/null 2>&1 || fail "ctr images rm ck1"
checkpoint job ck2 || fail "ctr containers checkpoint 2: $(tail -5 "$T/ckpt.log")"
grep -q "cuinterpose: dump of tree $(ctr_task_pid job): $N processes, $N participants" "$T"/logs/dump.log ||
	fail "checkpoint 2: our plugin did not see the container's $N processes: $(grep cuinterpose "$T"/logs/dump.log | head -5)"
images_of ck2 "$T/ck2"
export_checkpoint ck2 "$T/ck2.tar"
remove job
note "containerd (host b): import, restore as job-b"
start_containerd b
CTR_HOST=b cr images import --snapshotter native "$T/image.tar" >"$T/import-b.log" 2>&1 ||
	fail "ctr images import (host b): $(tail -3 "$T/import-b.log")"
CTR_HOST=b cr images import --no-unpack "$T/ck2.tar" >>"$T/import-b.log" 2>&1 ||
	fail "ctr images import of the checkpoint (host b): $(tail -3 "$T/import-b.log")"
export CTR_HOST=b
restore job-b ck2 || fail "ctr containers restore 2 (host b): $(tail -5 "$T/restore.log"); $(cr images ls); $(cr content get "$(cr images ls | awk '$1 == "ck2" {print $3}')")"
restored_ok job-b
cmd $N verify 3
[ "$(answers $N)" = "$before" ] || fail "addresses changed after restore 2: $(answers $N) vs $before"
cmd $N write 2 4
cmd $N verify 4

# --- refused: a sharing peer outside the container -----------------------------
note "an importer outside the container"
init=$(ctr_task_pid job-b)
outside_importer "$init"
checkpoint job-b ck3 && fail "ctr checkpoint with a sharing peer outside the container succeeded"
cat "$T/ckpt.log" "$T"/logs/dump.log >"$T/dump3.log" 2>/dev/null
refusal_names_importer "$T/dump3.log" "$init"
[ "$(ctr_task_state job-b)" = RUNNING ] || fail "after the refused checkpoint the container is $(ctr_task_state job-b)"
cr images ls -q | grep -qx ck3 && fail "a refused checkpoint left an image"
cmd $N verify 4
[ "$(answers $N)" = "$before" ] || fail "addresses changed after the refusal: $(answers $N) vs $before"
cmd $N write 1 5
cmd $N verify 5
kill $OPID
wait $OPID || fail "the outside importer exited $?"
OPID=
cmd $N exit
note "done: checkpoint 1 $(echo "$t1 $t0" | awk '{printf "%.1f", $1 - $2}') s, restore 1 $(echo "$t3 $t2" | awk '{printf "%.1f", $1 - $2}') s"
