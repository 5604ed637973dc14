#!/bin/bash
# vmm_share-criu.sh BUILDDIR [CHILDREN] [CYCLES]: drive the vmm_share
# workload through real `criu dump` / `criu restore` cycles with the
# cuinterpose plugin on the fake driver, verifying every byte and address
# (and a write through a peer and a fresh export/import) after each restore.
# Needs root and criu; run under a child subreaper (test/e2e/e2e_reaper) on
# machines whose PID 1 does not reap orphans (docs/driver-facts.md, 'CRIU'). Not part of
# `make check` (test/e2e holds the CRIU tests); prints "PASS" or "FAIL: why".
set -u
B=$(cd "${1:?usage: $0 BUILDDIR [CHILDREN] [CYCLES]}" && pwd)
N=${2:-3}
CYCLES=${3:-2}
CRIU=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
FR=$B/test/fakecuda/fakecuda-run
BOUNDED=$(cd "$(dirname "$0")/../.." && pwd)/contrib/bounded # criu must not wait forever
T=$(mktemp -d /tmp/vmm_share-criu.XXXXXX)
mkdir -p "$T/plugins" "$T/sock"
ln -s "$B/plugin/.libs/cuinterpose_plugin.so" "$T/plugins/"
export FAKECUDA_SOCKET=$T/devd.sock CUINTERPOSE_SOCKET_DIR=$T/sock FAKECUDA_DEVICES=${FAKECUDA_DEVICES:-2}
P=
fail() {
	echo "FAIL: $*"
	[ -n "$P" ] && kill -9 $P ${CHILDREN:-} 2>/dev/null
	"$FR" --stop
	echo "kept $T"
	exit 1
}
round() { # expect N lines in the result file
	kill -USR1 "$P"
	for _ in $(seq 200); do [ "$(grep -c round "$T/result" 2>/dev/null)" -ge "$1" ] && break; sleep 0.05; done
	tail -1 "$T/result" | grep -q "round $1 ok" || fail "$(tail -1 "$T/result")"
}

setsid "$FR" "$B/cli/cuinterpose" run -- "$B/test/interposer/vmm_share" -n "$N" -r "$T/ready" \
	-o "$T/result" </dev/null >"$T/job.log" 2>&1 &
disown
for _ in $(seq 200); do [ -s "$T/ready" ] && break; sleep 0.05; done
[ -s "$T/ready" ] || fail "workload not ready: $(cat "$T/job.log")"
read -r P CHILDREN <"$T/ready"
round 1
for c in $(seq "$CYCLES"); do
	mkdir -p "$T/d$c"
	"$BOUNDED" 180 "$FR" "$CRIU" dump -t "$P" -D "$T/d$c" -L "$T/plugins" --shell-job -v4 -o dump.log ||
		fail "criu dump $c: $(grep -E 'Error|cuinterpose' "$T/d$c/dump.log" | tail -3)"
	for _ in $(seq 100); do kill -0 "$P" 2>/dev/null || break; sleep 0.05; done
	"$BOUNDED" 180 "$FR" "$CRIU" restore -D "$T/d$c" -L "$T/plugins" --shell-job --restore-detached -v4 -o restore.log ||
		fail "criu restore $c: $(grep -E 'Error|cuinterpose' "$T/d$c/restore.log" | tail -3)"
	round $((c + 1))
done
kill -TERM "$P"
for _ in $(seq 100); do kill -0 "$P" 2>/dev/null || break; sleep 0.05; done
grep -q FAIL "$T/result" && fail "$(grep FAIL "$T/result")"
"$FR" --stop
rm -rf "$T"
echo PASS
