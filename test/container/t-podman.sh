# podman checkpoint/restore of a sharing job in a container, with our plugin
# on the host: run by `make check` (test/container/Makefile.am) under
# e2e_reaper, with test/e2e/lib.sh's helpers and job (e2e_group).
#
# Everything podman and runc keep lives under $T (storage, run and tmp
# directories, runc's state, containers.conf); nothing system-wide changes.
# - The image is local: `podman import` of a root file system assembled here
#   from the build (the job, libcuinterpose.so, the fake driver's libcuda.so.1)
#   and the host's glibc, nothing else: the preload must load without
#   protobuf-c or anything beside glibc.
# - The job (3 processes sharing VMM memory) runs as the container's init in
#   its own pid, mount and net (--network none) namespaces; the fake
#   driver's devd socket and the job's command directory are bind-mounted in.
# - The runtime is runc (Debian's crun is built without CRIU): podman runs it
#   through $T/runc, which gives runc a private --root, `--criu $CRIU` (4.2.1;
#   runc's default is the criu on PATH) and the fake driver's environment for
#   criu (podman passes the runtime only PATH and XDG_RUNTIME_DIR). runc runs
#   criu in swrk mode and hands it the CRIU configuration file named by the
#   container's `org.criu.config` annotation: `libdir $T/plugins`, a
#   directory holding only our plugin.
# Cycle 1: checkpoint --export --leave-running; the job goes on and writes
# more; it is removed and restored with --import: the bytes are those of the
# checkpoint, the addresses are the same, one rank's write is seen by all.
# Cycle 2: checkpoint --export (the container stops), restore --import under
# a new name as on another host, verified the same way. Then a host process
# imports memory from the container's creator: the checkpoint is refused
# naming it, and the container keeps running with its bytes intact.
. "$srcdir/../e2e/lib.sh"
. "$srcdir/lib-ctr.sh"

# Sanitizer builds: the image is glibc alone (the point of the test), and the
# criu that runc starts (criu swrk, environment set by podman) cannot be given
# the sanitizer runtime that the instrumented plugin needs: measured, the job
# in the container never gets ready. The plain build runs all of it.
[ "${SANITIZE:-}" = yes ] &&
	skip "sanitizer build: the glibc-only image and runc's criu cannot carry the sanitizer runtime (the plain build runs this test)"
for t in podman runc conmon; do
	command -v $t >/dev/null || skip "$t not installed (contrib/install-deps.sh installs podman, runc and conmon from Debian 12)"
done
OUTSIDE=$B/test/container/ctr_outside
[ -x "$OUTSIDE" ] || skip "ctr_outside not built ($OUTSIDE)"
RUNC=$(command -v runc)
if command -v crun >/dev/null && ! crun --version | grep -q '+CRIU'; then
	echo "note: $(crun --version | head -1) is built without CRIU ($(crun --version | grep '^+')); using runc"
fi
# the container sits in cgroups of its own, which criu dumps
named_cgroups_mountable
N=3
IMAGE=localhost/cuinterpose-test:1

# podman 4.3 keeps two things outside every directory it is given: netavark's
# run directory and the image blob-info cache. Whichever the test creates it
# removes again.
SYSTEM_PATHS="/run/containers/networks /run/containers /var/lib/containers/cache/blob-info-cache-v1.boltdb /var/lib/containers/cache /var/lib/containers"
CREATED=
for p in $SYSTEM_PATHS; do [ -e "$p" ] || CREATED="$CREATED $p"; done

cleanup() {
	[ -n "${OPID:-}" ] && kill "$OPID" 2>/dev/null
	if [ -f "$T/containers.conf" ]; then
		pm rm -f -a -t 0 >/dev/null 2>&1
		pm rmi -a -f >/dev/null 2>&1
	fi
	for p in $CREATED; do
		if [ -d "$p" ]; then rmdir "$p" 2>/dev/null; else rm -f "$p"; fi
	done
	"$FAKERUN" --stop >/dev/null 2>&1
	# podman mounts each container's /dev/shm under $T/run
	findmnt -rn -o TARGET | grep "^$T/" | sort -r | while read -r m; do umount -l "$m"; done
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}

pm() { # bounded (lib.sh): a podman or a criu below it that hangs fails the test
	bounded env TMPDIR="$T/tmp" podman --root "$T/storage" --runroot "$T/run" --tmpdir "$T/libpod" --storage-driver vfs \
		--network-config-dir "$T/networks" \
		--cgroup-manager cgroupfs --events-backend file --runtime "$T/runc" "$@"
}

# The job's container, by name: its host pid of init and its state.
ctr_pid() { pm inspect -f '{{.State.Pid}}' "$1"; }
ctr_state() { pm inspect -f '{{.State.Status}}' "$1" 2>/dev/null; }
ctr_userdata() { echo "$T/storage/vfs-containers/$(pm inspect -f '{{.Id}}' "$1")/userdata"; }

# --- private podman and runc -------------------------------------------------
export CONTAINERS_CONF=$T/containers.conf
export XDG_CONFIG_HOME=$T/xdg
mkdir -p "$T/storage" "$T/run" "$T/libpod" "$T/runc-state" "$T/xdg" "$T/networks" "$T/tmp"
cat >"$T/containers.conf" <<EOF
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
image_copy_tmp_dir = "$T/tmp"
EOF
cat >"$T/runc" <<EOF
#!/bin/sh
# podman's OCI runtime here: runc with private state and the fake driver's
# environment, which criu (runc's child) and our plugin inherit.
export FAKECUDA_SOCKET='$FAKECUDA_SOCKET'
export LD_LIBRARY_PATH='$B/test/fakecuda/.libs'
export CUINTERPOSE_STAGING_MB=$CUINTERPOSE_STAGING_MB
export CUINTERPOSE_LOCK_TIMEOUT_MS=$CUINTERPOSE_LOCK_TIMEOUT_MS
echo "\$*" >>'$T/runc.calls'
exec '$RUNC' --root '$T/runc-state' --criu '$CRIU' "\$@"
EOF
chmod +x "$T/runc"
printf 'libdir %s\n' "$T/plugins" >"$T/criu.conf"
"$CRIU" --version | grep -q '^Version: 4\.' || skip "$CRIU is not CRIU 4.x: $("$CRIU" --version | head -1)"
# podman checks the version of the criu on PATH; runc is told which one.
PATH=$(dirname "$CRIU"):$PATH

# --- the image: the build's pieces and the host's glibc ----------------------
R=$T/rootfs
mkdir -p "$R/bin" "$R/w" "$R/run/fakecuda" "$R/run/cuinterpose" "$R/usr/lib/cuinterpose" \
	"$R/proc" "$R/sys" "$R/dev" "$R/tmp" "$R/etc"
copy_lib() { # FILE: into the same path under $R
	mkdir -p "$R$(dirname "$1")"
	cp -L "$1" "$R$1"
}
for f in $(ldd "$WORKLOAD" | awk '/=> \// {print $3} /^\t\/[^ ]*ld-linux/ {print $1}'); do
	case $f in
	*/libcuda.so.1) ;;
	*) copy_lib "$f" ;;
	esac
done
libdir=$(dirname "$(ldd "$WORKLOAD" | awk '/libc\.so\.6 =>/ {print $3}')")
cp -L "$B/test/fakecuda/.libs/libcuda.so.1" "$R$libdir/libcuda.so.1"
cp "$WORKLOAD" "$R/bin/e2e_group"
cp "$OUTSIDE" "$R/bin/ctr_outside"
cp -L "$(command -v env)" "$R/bin/env" # libc only
cp "$INTERPOSER" "$R/usr/lib/cuinterpose/libcuinterpose.so"
echo "cuinterpose:x:0:0::/:/bin/e2e_group" >"$R/etc/passwd"
( cd "$R" && find . -type f | sort ) >"$T/rootfs.files"
grep -q protobuf "$T/rootfs.files" && fail "protobuf-c in the image: $(grep protobuf "$T/rootfs.files")"
tar -C "$R" -cf "$T/rootfs.tar" .
note "podman import"
pm import "$T/rootfs.tar" "$IMAGE" >"$T/import.log" 2>&1 || fail "podman import: $(tail -3 "$T/import.log")"

# --- the job ----------------------------------------------------------------
"$FAKERUN" --start || fail "fake driver"
# No CAP_SYS_RESOURCE here: runc cannot raise the rlimits podman asks for,
# so ask for the limits the runtime has (podman lowers NPROC to 32768).
nproc=$(ulimit -Hu)
[ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
run_job() { # NAME
	pm run -d --name "$1" --network none \
		--annotation org.criu.config="$T/criu.conf" \
		--ulimit nofile="$(ulimit -Sn):$(ulimit -Hn)" --ulimit nproc="$nproc:$nproc" \
		-v "$FAKECUDA_SOCKET:/run/fakecuda/devd.sock" -v "$T/w:/w" \
		-e FAKECUDA_SOCKET=/run/fakecuda/devd.sock -e CUINTERPOSE_SOCKET_DIR=/run/cuinterpose \
		-e LD_PRELOAD=/usr/lib/cuinterpose/libcuinterpose.so \
		"$IMAGE" /bin/e2e_group /w $N >"$T/run.log" 2>&1
}
note "podman run"
rm -f "$T"/w/*
if ! run_job job; then
	grep -q "error setting rlimit" "$T/run.log" && skip "runc cannot set rlimits here: $(tail -1 "$T/run.log")"
	fail "podman run: $(tail -3 "$T/run.log")"
fi
wait_ready $N
[ "$JOBPID" = 1 ] || fail "the job's root is pid $JOBPID in the container, not 1: no pid namespace"
init=$(ctr_pid job)
[ "$init" -gt 1 ] || fail "no host pid for the container's init: '$init'"
for ns in pid mnt net; do
	[ "$(readlink /proc/"$init"/ns/$ns)" != "$(readlink /proc/self/ns/$ns)" ] || fail "the container shares the host's $ns namespace"
done
pm logs job 2>&1 | grep -q "cannot be preloaded" && fail "the preload did not load in the image: $(pm logs job 2>&1 | head -3)"
grep -q " create " "$T/runc.calls" || fail "podman did not run the runtime through $T/runc"
cmd $N verify 0
before=$(answers $N)
cmd $N write 2 1
cmd $N verify 1

checkpoint() { # NAME ARCHIVE [ARGS]
	local name=$1 ar=$2

	shift 2
	# --keep: podman keeps dump.log (in the container's userdata) only then
	pm container checkpoint --export "$ar" --compress gzip --keep "$@" "$name" >"$T/ckpt.log" 2>&1
}
restore() { # ARGS: --keep keeps restore.log
	pm container restore --keep "$@" >"$T/restore.log" 2>&1
}

# --- cycle 1: --leave-running, then restore in place ------------------------
note "checkpoint 1 (--leave-running)"
t0=$(date +%s.%N)
checkpoint job "$T/ck1.tar.gz" --leave-running || fail "podman checkpoint 1: $(tail -5 "$T/ckpt.log")"
t1=$(date +%s.%N)
cp "$(ctr_userdata job)/dump.log" "$T/dump1.log"
grep -q "cuinterpose: dump of tree $(ctr_pid job): $N processes, $N participants" "$T/dump1.log" ||
	fail "our plugin did not see the container's $N processes: $(grep cuinterpose "$T/dump1.log" | head -5)"
grep -q "cuinterpose: SAVE: " "$T/dump1.log" || fail "no SAVE line in dump.log: $(grep cuinterpose "$T/dump1.log" | tail -3)"
tar -tzf "$T/ck1.tar.gz" >"$T/ck1.list" || fail "the export is not a gzip tar"
grep -q "^checkpoint/cuinterpose-inventory.img$" "$T/ck1.list" || fail "the export holds no cuinterpose images"
mkdir "$T/ck1"
tar -C "$T/ck1" -xzf "$T/ck1.tar.gz" checkpoint || fail "cannot unpack the export's checkpoint/"
"$B/cli/cuinterpose" show "$T/ck1/checkpoint" >"$T/show.txt" 2>&1 || fail "cuinterpose show: $(tail -3 "$T/show.txt")"
grep -q "$N participants" "$T/show.txt" || fail "cuinterpose show: $(head -3 "$T/show.txt")"
grep -q "^OK: every image decodes" "$T/show.txt" || fail "cuinterpose show: $(tail -3 "$T/show.txt")"
[ "$(ctr_state job)" = running ] || fail "after --leave-running the container is $(ctr_state job)"
cmd $N verify 1
[ "$(answers $N)" = "$before" ] || fail "addresses changed after --leave-running: $(answers $N) vs $before"
cmd $N write 0 2
cmd $N verify 2
pm rm -f -t 0 job >/dev/null 2>&1 || fail "podman rm job"
note "restore 1 (--import)"
t2=$(date +%s.%N)
restore --import "$T/ck1.tar.gz" || fail "podman restore 1: $(tail -5 "$T/restore.log")"
t3=$(date +%s.%N)
[ "$(ctr_state job)" = running ] || fail "restored container job is $(ctr_state job)"
grep -q "RESUME_DEVICES_LATE done: $N participants rebuilt" "$(ctr_userdata job)/restore.log" ||
	fail "no completion line in restore.log: $(grep cuinterpose "$(ctr_userdata job)/restore.log" | tail -3)"
cmd $N verify 1
[ "$(answers $N)" = "$before" ] || fail "addresses changed after restore 1: $(answers $N) vs $before"
cmd $N write 1 3
cmd $N verify 3

# --- cycle 2: checkpoint (stops it), restore under a new name ---------------
note "checkpoint 2"
checkpoint job "$T/ck2.tar.gz" || fail "podman checkpoint 2: $(tail -5 "$T/ckpt.log")"
[ "$(ctr_state job)" = exited ] || fail "after checkpoint 2 the container is $(ctr_state job), want exited"
note "restore 2 (--import --name job-b, as on another host)"
restore --import "$T/ck2.tar.gz" --name job-b ||
	fail "podman restore 2: $(tail -5 "$T/restore.log")"
[ "$(ctr_state job-b)" = running ] || fail "restored container job-b is $(ctr_state job-b)"
grep -q "RESUME_DEVICES_LATE done: $N participants rebuilt" "$(ctr_userdata job-b)/restore.log" ||
	fail "no completion line in job-b's restore.log"
cmd $N verify 3
[ "$(answers $N)" = "$before" ] || fail "addresses changed after restore 2: $(answers $N) vs $before"
cmd $N write 2 4
cmd $N verify 4

# --- refused: a sharing peer outside the container ---------------------------
note "an importer outside the container"
init=$(ctr_pid job-b)
outside_importer "$init"
checkpoint job-b "$T/ck3.tar.gz" --leave-running && fail "podman checkpoint with a sharing peer outside the container succeeded"
cat "$T/ckpt.log" "$(ctr_userdata job-b)/dump.log" >"$T/dump3.log" 2>/dev/null
refusal_names_importer "$T/dump3.log" "$init"
[ "$(ctr_state job-b)" = running ] || fail "after the refused checkpoint the container is $(ctr_state job-b)"
[ -e "$T/ck3.tar.gz" ] && fail "a refused checkpoint left an archive"
cmd $N verify 4
[ "$(answers $N)" = "$before" ] || fail "addresses changed after the refusal: $(answers $N) vs $before"
cmd $N write 1 5
cmd $N verify 5
kill $OPID
wait $OPID || fail "the outside importer exited $?"
OPID=
cmd $N exit
note "done: checkpoint 1 $(echo "$t1 $t0" | awk '{printf "%.1f", $1 - $2}') s, restore 1 $(echo "$t3 $t2" | awk '{printf "%.1f", $1 - $2}') s"
