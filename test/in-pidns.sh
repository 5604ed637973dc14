#!/usr/bin/env bash
# in-pidns.sh LOG COMMAND...: run COMMAND the way CI has run the suite: in
# a new pid namespace (with its own /proc) whose session leader is outside
# it, so that getsid() answers 0 for every process the suite starts without
# setsid. A test that checkpoints such a process fails there and nowhere
# else (criu and `cuinterpose checkpoint` refuse it). COMMAND's output goes
# to LOG, opened inside the namespace, and every descriptor above 2 is
# closed first: criu cannot name the mount of a descriptor inherited from
# the host's mount namespace. Needs root (unshare). Exits with COMMAND's
# status. Example, the README's test command:
#   test/in-pidns.sh /tmp/ci.log ./contrib/test.sh
set -u
if [ $# -lt 2 ]; then
	sed -n 's/^#   //p' "$0" >&2
	echo "usage: in-pidns.sh LOG COMMAND..." >&2
	exit 2
fi
log=$1
shift
exec unshare --pid --fork --mount-proc bash -c '
for fd in /proc/self/fd/*; do n=${fd##*/}; [ "$n" -gt 2 ] 2>/dev/null && eval "exec $n>&-"; done
exec </dev/null >"$0" 2>&1
exec "$@"' "$log" "$@"
