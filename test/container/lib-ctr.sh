# lib-ctr.sh - helpers shared by the container tests (sourced after
# test/e2e/lib.sh).

# outside_importer INIT: rank 1 of the container whose init is host pid INIT
# hands its ticket to a host process that imports the creator's memory: the
# ticket names the creator's socket in the container's mount namespace, so
# the importer enters that namespace only (nsenter --mount) and stays in the
# host's pid and net namespaces, a child of this script. The creator
# records it when it fetches, so the plugin finds it wherever its socket
# is. Sets OPID once the import succeeded; fails the test otherwise.
outside_importer() {
	local init=$1 c r1= tfd i=0

	for c in $(cat /proc/"$init"/task/*/children); do
		[ "$(pid_of 1)" = "$(awk '/^NSpid/ {print $NF}' /proc/"$c"/status)" ] && r1=$c
	done
	[ -n "$r1" ] || fail "no host pid for rank 1"
	tfd=$(ls -l /proc/"$r1"/fd | awk '/memfd:cuinterpose-ticket/ {print $9; exit}')
	[ -n "$tfd" ] || fail "rank 1 (host pid $r1) holds no ticket"
	cat /proc/"$r1"/fd/"$tfd" >"$T/w/ticket"
	grep -qa "/run/cuinterpose/1-" "$T/w/ticket" || fail "the ticket does not name the creator's socket"
	nsenter -t "$init" --mount -- /bin/env LD_PRELOAD=/usr/lib/cuinterpose/libcuinterpose.so \
		FAKECUDA_SOCKET=/run/fakecuda/devd.sock CUINTERPOSE_SOCKET_DIR=/run/cuinterpose \
		/bin/ctr_outside /w/ticket /w/outside.ready >"$T/outside.log" 2>&1 &
	OPID=$!
	waiting "the outside importer (pid $OPID) to be ready"
	while [ ! -s "$T/w/outside.ready" ] && alive $OPID && [ $i -lt 200 ]; do
		nap 0.05
		i=$((i + 1))
	done
	grep -q "^import: CUDA_SUCCESS pid $OPID$" "$T/w/outside.ready" ||
		fail "the outside importer: $(cat "$T/w/outside.ready" "$T/outside.log" 2>/dev/null)"
	waited
	[ "$(readlink /proc/$OPID/ns/pid)" = "$(readlink /proc/self/ns/pid)" ] ||
		fail "the importer is in the container's pid namespace"
}

# refusal_names_importer LOG INIT: the refused checkpoint's log names the
# outside importer and the creator.
refusal_names_importer() {
	grep -Eq "cuinterpose: .*pid $2 allocation [0-9a-f]+:[0-9]+ is imported by pid $OPID \(identity [0-9a-f]{16}\), a live process outside the dumped tree" "$1" ||
		fail "the refusal does not name the outside importer $OPID and the creator $2: $(grep -E 'cuinterpose|Error|error' "$1" | tail -5)"
}
